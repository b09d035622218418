//! EAGLE heads (Li et al. 2024): one decoder layer that predicts the target's next hidden
//! state from its current one and the next token, and drafts by feeding its own predictions
//! back. EAGLE-1/2 heads read the target's final (normed) hidden state and share its output
//! head; EAGLE-3 heads read three of its residual streams fused by `fc`, and carry their own
//! output head over a smaller draft vocabulary mapped back with `d2t`.

use candle_core::{Device, Tensor, D};

use super::config::HeadFiles;
use super::layer::{rms_norm, DecoderLayer, LayerCache};
use super::target::{cut_rows, draft_vocab, head_matrix, widen, Proj, TargetParts};
use crate::error::{Error, Result};
use crate::models::{Linear, Tap};

/// Which EAGLE generation a head is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EagleVersion {
    /// EAGLE-1 and EAGLE-2 (the same head; EAGLE-2 is the dynamic tree).
    One,
    /// EAGLE-3.
    Three,
}

/// What a head step reads beside the tokens: the target's states, or the head's own.
#[derive(Debug, Clone)]
pub enum HeadInput {
    /// Rows of the target's recorded states (`hidden` wide, or `3 × hidden` for EAGLE-3).
    Target(Tensor),
    /// Rows the head itself produced (`hidden` wide).
    Own(Tensor),
}

/// An EAGLE head's weights, with the target's embedding and output head.
#[derive(Debug, Clone)]
pub struct EagleHead {
    version: EagleVersion,
    fc: Proj,
    layer: DecoderLayer,
    /// EAGLE-3: the norms of the token embedding and of the fed state, and the final norm.
    norms: Option<[Tensor; 3]>,
    embed: Tensor,
    output: Linear,
    /// EAGLE-3: the target token of each draft-vocabulary entry.
    d2t: Option<Vec<u32>>,
    vocab: usize,
    /// EAGLE-3: the layers whose input it reads.
    taps: Vec<Tap>,
}

impl EagleHead {
    /// Builds a head of `version` from its files for `target`. With `quantize`, its matrices
    /// and the output head are held as Q8_0 (drafting); without, dense f32 (training).
    ///
    /// # Errors
    /// [`Error::MissingTensor`]; [`Error::HeadMismatch`] when the head's hidden size,
    /// vocabulary or tensor shapes do not fit the target.
    pub fn load(mut files: HeadFiles, version: EagleVersion, target: &TargetParts, quantize: bool) -> Result<Self> {
        let c = files.config.clone();
        let t = &target.config;
        let h = t.hidden_size;
        let fits = |what: &str, head: usize, need: usize| -> Result<()> {
            match head == need {
                true => Ok(()),
                false => {
                    Err(Error::HeadMismatch { what: what.into(), head: head.to_string(), target: need.to_string() })
                }
            }
        };
        fits("hidden_size", c.hidden_size, h)?;
        fits("vocab_size", c.vocab_size, t.vocab_size)?;
        let s = c.layer_shape()?;
        let prefix = match version {
            EagleVersion::One => "layers.0",
            EagleVersion::Three if files.tensors.contains_key("layers.0.self_attn.q_proj.weight") => "layers.0",
            EagleVersion::Three => "midlayer",
        };
        let attn_in = if version == EagleVersion::Three { 2 * h } else { h };
        let fc_in = if version == EagleVersion::Three { 3 * c.target_hidden_size.unwrap_or(h) } else { 2 * h };
        let fc_w = files.take("fc.weight", &[h, fc_in])?;
        let fc_b = match c.bias {
            Some(false) => None,
            _ => files.take_opt("fc.bias", &[h])?,
        };
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let mut lin = |name: &str, out: usize, inp: usize| -> Result<Proj> {
            let w = files.take(&format!("{prefix}.{name}.weight"), &[out, inp])?;
            let b = files.take_opt(&format!("{prefix}.{name}.bias"), &[out])?;
            Proj::new(w, b, quantize)
        };
        let (q, k, v) = (
            lin("self_attn.q_proj", q_out, attn_in)?,
            lin("self_attn.k_proj", kv_out, attn_in)?,
            lin("self_attn.v_proj", kv_out, attn_in)?,
        );
        let o = lin("self_attn.o_proj", h, q_out)?;
        let (gate, up) = (lin("mlp.gate_proj", s.intermediate, h)?, lin("mlp.up_proj", s.intermediate, h)?);
        let down = lin("mlp.down_proj", h, s.intermediate)?;
        let post_norm = files.take(&format!("{prefix}.post_attention_layernorm.weight"), &[h])?;
        let layer = DecoderLayer { shape: s, input_norm: None, q, k, v, o, post_norm, gate, up, down };
        let (norms, head_w, d2t, taps) = match version {
            EagleVersion::One => {
                // Our trained heads may carry a draft vocabulary (`d2t`, as EAGLE-3's): the
                // target's output rows for it alone.
                let d2t = files.tensors.remove("d2t").map(|d| draft_vocab(&d, None, t.vocab_size)).transpose()?;
                (None, cut_rows(&target.output, d2t.as_deref())?, d2t, vec![Tap::Final])
            }
            EagleVersion::Three => {
                let draft_vocab = c.draft_vocab_size.unwrap_or(t.vocab_size);
                let norms = [
                    files.take(&format!("{prefix}.input_layernorm.weight"), &[h])?,
                    files.take(&format!("{prefix}.hidden_norm.weight"), &[h])?,
                    files.take("norm.weight", &[h])?,
                ];
                let head_w = files.take("lm_head.weight", &[draft_vocab, h])?;
                let d2t = match files.tensors.remove("d2t") {
                    Some(d) => Some(super::target::draft_vocab(&d, Some(draft_vocab), t.vocab_size)?),
                    None if draft_vocab == t.vocab_size => None,
                    None => return Err(Error::MissingTensor("d2t".into())),
                };
                let l = t.num_layers;
                (
                    Some(norms),
                    head_w,
                    d2t,
                    vec![Tap::Residual(2.min(l)), Tap::Residual(l / 2), Tap::Residual(l.saturating_sub(3))],
                )
            }
        };
        let embed = match files.tensors.remove("embed_tokens.weight") {
            Some(e) if c.target_hidden_size.is_some() => {
                super::config::check_dims("embed_tokens.weight", &e, &[t.vocab_size, h])?;
                e
            }
            _ => target.embed.clone(),
        };
        let output = head_matrix(&head_w, quantize)?;
        Ok(Self {
            version,
            fc: Proj::new(fc_w, fc_b, quantize)?,
            layer,
            norms,
            embed,
            output,
            d2t,
            vocab: t.vocab_size,
            taps,
        })
    }

    /// The hidden states the head reads from its target, in order.
    pub fn taps(&self) -> &[Tap] {
        &self.taps
    }

    /// Which generation the head is.
    pub fn version(&self) -> EagleVersion {
        self.version
    }

    /// The target's vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The head's width (the target's hidden size).
    pub fn hidden(&self) -> usize {
        self.layer.shape.hidden
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.layer.shape.head_dim
    }

    /// RoPE base.
    pub fn rope_theta(&self) -> f64 {
        self.layer.shape.rope_theta
    }

    /// The device the head computes on.
    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    /// One pass over `(batch, t)` positions: position `i` reads `tokens[i]` and the state
    /// `input[i]` that precedes it, and the result `(batch, t, hidden)` is the head's guess of
    /// the state after `tokens[i]`. `rope` holds the positions' rotations and `mask` which
    /// keys each row sees (`cache`'s, then the new ones).
    ///
    /// # Errors
    /// Shape mismatches, backend failures.
    pub fn step(
        &self,
        tokens: &Tensor,
        input: HeadInput,
        rope: (&Tensor, &Tensor),
        mask: &Tensor,
        cache: Option<&mut LayerCache>,
    ) -> Result<Tensor> {
        let emb = self
            .embed
            .embedding(&tokens.flatten_all()?)?
            .reshape(tokens.dims().iter().copied().chain([self.embed.dim(1)?]).collect::<Vec<_>>())?;
        match (self.version, &self.norms) {
            (EagleVersion::Three, Some([emb_norm, state_norm, _])) => {
                let state = match input {
                    HeadInput::Target(x) => self.fc.forward(&x)?,
                    HeadInput::Own(x) => x,
                };
                let eps = self.layer.shape.eps;
                let attn_in =
                    Tensor::cat(&[rms_norm(&emb, emb_norm, eps)?, rms_norm(&state, state_norm, eps)?], D::Minus1)?;
                self.layer.forward(&attn_in, &state, rope, mask, cache)
            }
            _ => {
                let (HeadInput::Target(x) | HeadInput::Own(x)) = input;
                let fused = self.fc.forward(&Tensor::cat(&[&emb, &x], D::Minus1)?)?;
                self.layer.forward(&fused, &fused, rope, mask, cache)
            }
        }
    }

    /// Logits over the draft vocabulary of the head's states (`…, hidden`).
    ///
    /// # Errors
    /// Backend failures.
    pub fn draft_logits(&self, states: &Tensor) -> Result<Tensor> {
        match &self.norms {
            Some([_, _, norm]) => self.output.forward(&rms_norm(states, norm, self.layer.shape.eps)?),
            None => self.output.forward(states),
        }
    }

    /// Logits rows over the target's vocabulary of states `(rows, hidden)`; tokens outside an
    /// EAGLE-3 head's draft vocabulary get −∞.
    ///
    /// # Errors
    /// Backend failures.
    pub fn logits(&self, states: &Tensor) -> Result<Vec<Vec<f32>>> {
        let rows = self.draft_logits(states)?.to_vec2::<f32>()?;
        Ok(widen(rows, self.d2t.as_deref(), self.vocab))
    }
}
