//! What a head borrows from its target: the token embedding and the output head.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::models::engine::TokenMatrices;
use crate::models::{Linear, LlamaConfig, LlamaWeights};

/// The target's token embedding `(vocab, hidden)` and output head, as a head uses them.
#[derive(Debug, Clone)]
pub struct TargetParts {
    pub(crate) config: LlamaConfig,
    pub(crate) embed: Tensor,
    pub(crate) output: Tensor,
}

impl TargetParts {
    /// Takes them from the target's loaded `weights` (as they hold them: a target loaded
    /// re-quantized lends its re-quantized head), in f32 on `device`.
    ///
    /// # Errors
    /// Backend failures; [`Error::HeadMismatch`] for matrices that are not `(vocab, hidden)`.
    pub fn from_weights(weights: &LlamaWeights, device: &Device) -> Result<Self> {
        let config = weights.config().clone();
        let TokenMatrices { embed, output } = weights.token_matrices(device)?;
        let output = output.unwrap_or_else(|| embed.clone());
        for (name, t) in [("token embedding", &embed), ("output head", &output)] {
            if t.dims() != [config.vocab_size, config.hidden_size] {
                return Err(Error::HeadMismatch {
                    what: format!("the target's {name}"),
                    head: format!("{:?}", t.dims()),
                    target: format!("{:?}", [config.vocab_size, config.hidden_size]),
                });
            }
        }
        Ok(Self { config, embed, output })
    }

    /// The target's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The token embedding, `(vocab, hidden)` in f32.
    pub fn embed(&self) -> &Tensor {
        &self.embed
    }

    /// The output head (tied to the embedding or not), `(vocab, hidden)` in f32.
    pub fn output(&self) -> &Tensor {
        &self.output
    }
}

/// A draft vocabulary's target tokens from `d2t` (entry `i` is token `i + d2t[i]`), checked
/// against the expected size (when given) and the target's vocabulary.
///
/// # Errors
/// [`Error::HeadMismatch`] for another size or a token outside the vocabulary.
pub(crate) fn draft_vocab(d2t: &Tensor, size: Option<usize>, vocab: usize) -> Result<Vec<u32>> {
    let offsets = d2t.to_dtype(candle_core::DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    if let Some(n) = size.filter(|&n| n != offsets.len()) {
        return Err(Error::HeadMismatch {
            what: "d2t length".into(),
            head: offsets.len().to_string(),
            target: n.to_string(),
        });
    }
    (offsets.iter().enumerate())
        .map(|(i, &o)| {
            let t = i as f64 + o;
            match t >= 0.0 && (t as usize) < vocab {
                true => Ok(t as u32),
                false => Err(Error::HeadMismatch {
                    what: format!("d2t[{i}]"),
                    head: t.to_string(),
                    target: format!("a token below {vocab}"),
                }),
            }
        })
        .collect()
}

/// The rows of `output` for the tokens `vocab` (all rows without one).
///
/// # Errors
/// Backend failures.
pub(crate) fn cut_rows(output: &Tensor, vocab: Option<&[u32]>) -> Result<Tensor> {
    match vocab {
        None => Ok(output.clone()),
        Some(v) => Ok(output.index_select(&Tensor::new(v, output.device())?, 0)?),
    }
}

/// Draft-vocabulary logits rows widened to the target's `vocab`, −∞ for tokens outside it.
pub(crate) fn widen(rows: Vec<Vec<f32>>, draft_vocab: Option<&[u32]>, vocab: usize) -> Vec<Vec<f32>> {
    let Some(map) = draft_vocab else { return rows };
    rows.into_iter()
        .map(|r| {
            let mut full = vec![f32::NEG_INFINITY; vocab];
            for (&t, x) in map.iter().zip(r) {
                full[t as usize] = x;
            }
            full
        })
        .collect()
}

/// A linear map `x Wᵀ + b` of a head.
#[derive(Debug, Clone)]
pub struct Proj {
    weight: Linear,
    bias: Option<Tensor>,
}

impl Proj {
    /// `weight` `(out, in)` and an optional `bias` `(out)`, dense or (with `quantize`) Q8_0.
    ///
    /// # Errors
    /// Quantization failures.
    pub fn new(weight: Tensor, bias: Option<Tensor>, quantize: bool) -> Result<Self> {
        Ok(Self { weight: head_matrix(&weight, quantize)?, bias })
    }

    /// `x Wᵀ + b`.
    ///
    /// # Errors
    /// Shape mismatches.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.weight.forward(x)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// A head's matrix `(out, in)`: dense (differentiable, for training) or, with `quantize`, Q8_0
/// (for drafting) where its rows are whole 32-value blocks.
///
/// # Errors
/// Quantization failures.
pub(crate) fn head_matrix(w: &Tensor, quantize: bool) -> Result<Linear> {
    Linear::from_f32(w, quantize.then_some(GgmlDType::Q8_0))
}
