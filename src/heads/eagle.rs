//! EAGLE heads (Li et al. 2024): one decoder layer that predicts the target's next hidden
//! state from its current one and the next token, and drafts by feeding its own predictions
//! back. EAGLE-1/2 heads read the target's final (normed) hidden state and share its output
//! head; EAGLE-3 heads read three of its residual streams fused by `fc`, and carry their own
//! output head over a smaller draft vocabulary mapped back with `d2t`.

use candle_core::{Device, Tensor, D};

use super::config::HeadFiles;
use super::target::{cut_rows, draft_vocab, head_matrix, widen, Proj, TargetParts};
use crate::error::{Error, Result};
use crate::models::block::{rms_norm, rope_rows, Block};
use crate::models::kv_cache::KvCache;
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
pub(crate) enum HeadInput {
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
    /// The decoder layer: the candle engine's block, with HF's RoPE layout.
    layer: Block,
    hidden: usize,
    rope_theta: f32,
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
        let layer = layer(&mut files, prefix, attn_in, quantize)?;
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
            hidden: h,
            rope_theta: c.rope_theta as f32,
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
        self.hidden
    }

    /// The device the head computes on.
    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    /// An empty KV cache for the head's layer: growing in place (drafting) or
    /// `differentiable` (training's unrolled pass).
    ///
    /// # Errors
    /// Backend failures.
    pub(crate) fn cache(&self, differentiable: bool) -> Result<KvCache> {
        let s = &self.layer.shape;
        match differentiable {
            true => KvCache::differentiable(s.kv_heads, s.head_dim, self.device()),
            false => KvCache::new(s.kv_heads, s.head_dim, 256, self.device()),
        }
    }

    /// One pass over `t` rows: row `i` reads `tokens[i]` and the state `input[i]` that precedes
    /// it, at position `positions[i]`, and the result `(t, hidden)` is the head's guess of the
    /// state after `tokens[i]`. `mask`, when given, says which keys each row sees (`cache`'s,
    /// then the new ones, which are appended to it).
    ///
    /// # Errors
    /// Shape mismatches, backend failures.
    pub(crate) fn step(
        &self,
        tokens: &[u32],
        input: HeadInput,
        positions: &[usize],
        mask: Option<&Tensor>,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let dev = self.device();
        let emb = self.embed.embedding(&Tensor::new(tokens, dev)?)?;
        let rope = rope_rows(positions, self.layer.shape.head_dim, self.rope_theta, dev)?;
        let rope = (&rope.0, &rope.1);
        match (self.version, &self.norms) {
            (EagleVersion::Three, Some([emb_norm, state_norm, _])) => {
                let state = match input {
                    HeadInput::Target(x) => self.fc.forward(&x)?,
                    HeadInput::Own(x) => x,
                };
                let (eps, slow) = (self.layer.shape.eps, cache.is_differentiable());
                let attn_in = Tensor::cat(
                    &[rms_norm(&emb, emb_norm, eps, slow)?, rms_norm(&state, state_norm, eps, slow)?],
                    D::Minus1,
                )?;
                self.layer.forward(&state, Some(&attn_in), rope, mask, cache)
            }
            _ => {
                let (HeadInput::Target(x) | HeadInput::Own(x)) = input;
                let fused = self.fc.forward(&Tensor::cat(&[&emb, &x], D::Minus1)?)?;
                self.layer.forward(&fused, None, rope, mask, cache)
            }
        }
    }

    /// Logits over the draft vocabulary of the head's states (`…, hidden`), differentiable
    /// (training's loss reads them).
    ///
    /// # Errors
    /// Backend failures.
    pub fn draft_logits(&self, states: &Tensor) -> Result<Tensor> {
        self.output_of(states, true)
    }

    fn output_of(&self, states: &Tensor, differentiable: bool) -> Result<Tensor> {
        match &self.norms {
            Some([_, _, norm]) => {
                self.output.forward(&rms_norm(&states.contiguous()?, norm, self.layer.shape.eps, differentiable)?)
            }
            None => self.output.forward(states),
        }
    }

    /// Logits rows over the target's vocabulary of states `(rows, hidden)`; tokens outside an
    /// EAGLE-3 head's draft vocabulary get −∞.
    ///
    /// # Errors
    /// Backend failures.
    pub fn logits(&self, states: &Tensor) -> Result<Vec<Vec<f32>>> {
        let rows = self.output_of(states, false)?.to_vec2::<f32>()?;
        Ok(widen(rows, self.d2t.as_deref(), self.vocab))
    }
}

/// The decoder layer under `prefix`, its attention reading `attn_in` values a row: the
/// engine's block without an input norm (an EAGLE head's attention input comes normed, or is
/// its `fc` output as it is), in HF's RoPE layout.
///
/// # Errors
/// As [`EagleHead::load`].
fn layer(files: &mut HeadFiles, prefix: &str, attn_in: usize, quantize: bool) -> Result<Block> {
    let s = files.config.block_shape()?;
    let (h, ff) = (files.config.hidden_size, files.config.intermediate_size);
    let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let qkv_bias = qkv_bias(files, prefix, [q_out, kv_out, kv_out])?;
    let mut lin = |name: &str, out: usize, inp: usize| -> Result<Linear> {
        head_matrix(&files.take(&format!("{prefix}.{name}.weight"), &[out, inp])?, quantize)
    };
    Ok(Block {
        shape: s,
        attn_norm: None,
        q: lin("self_attn.q_proj", q_out, attn_in)?,
        k: lin("self_attn.k_proj", kv_out, attn_in)?,
        v: lin("self_attn.v_proj", kv_out, attn_in)?,
        o: lin("self_attn.o_proj", h, q_out)?,
        gate: lin("mlp.gate_proj", ff, h)?,
        up: lin("mlp.up_proj", ff, h)?,
        down: lin("mlp.down_proj", h, ff)?,
        ffn_norm: files.take(&format!("{prefix}.post_attention_layernorm.weight"), &[h])?,
        qkv_bias,
        qk_norm: None,
        post_norms: None,
        sliding: false,
    })
}

/// The query, key and value biases of the layer under `prefix`, if it has any (one missing
/// beside the others counts as zeros). Biases elsewhere in the layer have no place in the
/// block: a load error.
///
/// # Errors
/// [`Error::Load`] for a bias the block lacks; [`Error::HeadMismatch`] for another shape.
fn qkv_bias(files: &mut HeadFiles, prefix: &str, widths: [usize; 3]) -> Result<Option<[Tensor; 3]>> {
    for name in ["self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
        let bias = format!("{prefix}.{name}.bias");
        if files.tensors.contains_key(&bias) {
            return Err(Error::load(
                &files.path,
                format!("`{bias}`: the decoder block has biases on the query, key and value projections only"),
            ));
        }
    }
    let mut found = [None, None, None];
    for (slot, (name, width)) in found.iter_mut().zip(["q_proj", "k_proj", "v_proj"].into_iter().zip(widths)) {
        *slot = files.take_opt(&format!("{prefix}.self_attn.{name}.bias"), &[width])?;
    }
    let Some(device) = found.iter().flatten().next().map(|t| t.device().clone()) else { return Ok(None) };
    let or_zeros = |b: Option<Tensor>, width: usize| -> Result<Tensor> {
        Ok(match b {
            Some(b) => b,
            None => Tensor::zeros(width, candle_core::DType::F32, &device)?,
        })
    };
    let [q, k, v] = found;
    Ok(Some([or_zeros(q, widths[0])?, or_zeros(k, widths[1])?, or_zeros(v, widths[2])?]))
}
