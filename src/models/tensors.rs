//! The tensors of a llama-family model, named once: what a model needs from a file, for both
//! engines. Loaders (GGUF files, HF folders) implement [`TensorSource`]; the engines turn the
//! [`BlockTensors`] and [`OuterTensors`] read here into their own layouts.

use std::borrow::Cow;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::Device;

use crate::error::{Error, Result};
use crate::models::config::LlamaConfig;

/// A store of named tensors in GGUF naming (`blk.0.attn_q.weight`, …), with query and key
/// rows in the interleaved-RoPE order GGUF uses.
pub trait TensorSource {
    /// True when the tensor exists.
    fn has(&self, name: &str) -> bool;

    /// Reads a tensor onto `device`, quantized or not as stored.
    ///
    /// # Errors
    /// [`Error::MissingTensor`] and read failures.
    fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor>;
}

/// One transformer block's tensors, each checked against the config's shape.
#[derive(Debug)]
pub struct BlockTensors {
    /// RMSNorm weight before attention, (hidden).
    pub attn_norm: QTensor,
    /// Query weight, (heads·head_dim, hidden).
    pub q: QTensor,
    /// Key weight, (kv_heads·head_dim, hidden).
    pub k: QTensor,
    /// Value weight, (kv_heads·head_dim, hidden).
    pub v: QTensor,
    /// Attention output weight, (hidden, heads·head_dim).
    pub o: QTensor,
    /// RMSNorm weight before the feed-forward layer, (hidden).
    pub ffn_norm: QTensor,
    /// SwiGLU gate weight, (intermediate, hidden).
    pub gate: QTensor,
    /// SwiGLU up weight, (intermediate, hidden).
    pub up: QTensor,
    /// Feed-forward output weight, (hidden, intermediate).
    pub down: QTensor,
    /// Query, key and value biases, (heads·head_dim), (kv_heads·head_dim) twice, for the
    /// families that have them (Qwen2).
    pub qkv_bias: Option<[QTensor; 3]>,
    /// RMSNorm weights of each query and key head, (head_dim) each, for the families that
    /// have them (Qwen3, Gemma 3).
    pub qk_norm: Option<[QTensor; 2]>,
    /// RMSNorm weights after attention and after the feed-forward layer, (hidden) each (Gemma).
    pub post_norms: Option<[QTensor; 2]>,
}

impl BlockTensors {
    /// Reads block `i` from `source` onto `device`.
    ///
    /// # Errors
    /// [`Error::MissingTensor`], shape mismatches, read failures.
    pub fn read(source: &mut dyn TensorSource, c: &LlamaConfig, i: usize, device: &Device) -> Result<Self> {
        let (h, q_out, kv_out, ff) =
            (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size);
        let mut read = |name: &str, shape: &[usize]| read_checked(source, &format!("blk.{i}.{name}"), shape, device);
        let qkv_bias = match c.family.qkv_bias() {
            true => {
                Some([read("attn_q.bias", &[q_out])?, read("attn_k.bias", &[kv_out])?, read("attn_v.bias", &[kv_out])?])
            }
            false => None,
        };
        let qk_norm = match c.family.qk_norm() {
            true => Some([read("attn_q_norm.weight", &[c.head_dim])?, read("attn_k_norm.weight", &[c.head_dim])?]),
            false => None,
        };
        let post_norms = match c.family.gemma() {
            true => Some([read("post_attention_norm.weight", &[h])?, read("post_ffw_norm.weight", &[h])?]),
            false => None,
        };
        let mut read = |name: &str, shape: &[usize]| read(&format!("{name}.weight"), shape);
        Ok(Self {
            attn_norm: read("attn_norm", &[h])?,
            q: read("attn_q", &[q_out, h])?,
            k: read("attn_k", &[kv_out, h])?,
            v: read("attn_v", &[kv_out, h])?,
            o: read("attn_output", &[h, q_out])?,
            ffn_norm: read("ffn_norm", &[h])?,
            gate: read("ffn_gate", &[ff, h])?,
            up: read("ffn_up", &[ff, h])?,
            down: read("ffn_down", &[h, ff])?,
            qkv_bias,
            qk_norm,
            post_norms,
        })
    }
}

/// The tensors outside the blocks.
#[derive(Debug)]
pub struct OuterTensors {
    /// Token embeddings, (vocab, hidden).
    pub embed: QTensor,
    /// The final RMSNorm weight, (hidden).
    pub norm: QTensor,
    /// The output head, (vocab, hidden); `None` when it is tied to the embeddings.
    pub lm_head: Option<QTensor>,
}

impl OuterTensors {
    /// Reads them from `source` onto `device`.
    ///
    /// # Errors
    /// [`Error::MissingTensor`], shape mismatches, read failures.
    pub fn read(source: &mut dyn TensorSource, c: &LlamaConfig, device: &Device) -> Result<Self> {
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let lm_head = match source.has("output.weight") {
            true => Some(read_checked(source, "output.weight", &[vocab, h], device)?),
            false => None,
        };
        Ok(Self {
            embed: read_checked(source, "token_embd.weight", &[vocab, h], device)?,
            norm: read_checked(source, "output_norm.weight", &[h], device)?,
            lm_head,
        })
    }
}

fn read_checked(source: &mut dyn TensorSource, name: &str, shape: &[usize], device: &Device) -> Result<QTensor> {
    let t = source.qtensor(name, device)?;
    check_shape(name, t.shape().dims(), shape)?;
    Ok(t)
}

/// [`Error::Load`] unless `got == want`.
pub(crate) fn check_shape(name: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got != want {
        return Err(Error::Load {
            path: name.into(),
            reason: format!("tensor `{name}` has shape {got:?}, expected {want:?}"),
        });
    }
    Ok(())
}

/// Reorders the rows of a query or key tensor (a weight, a bias, or a per-head norm weight
/// with `heads` = 1) from halves order (each head's first rotary elements, then its second
/// ones: HF files, Qwen GGUF files) into the interleaved order this crate's RoPE uses, moving
/// whole rows of bytes so quantized rows stay exactly as stored.
///
/// # Errors
/// [`Error::Load`] when the rows do not split into `heads` heads of an even width, or a 1-D
/// tensor is quantized.
pub(crate) fn halves_to_interleaved(t: &QTensor, heads: usize, device: &Device) -> Result<QTensor> {
    let dims = t.shape().dims();
    let rows = dims.first().copied().unwrap_or(0);
    let data = t.data()?;
    let bad = || Error::Load { path: "".into(), reason: format!("cannot reorder query/key rows of shape {dims:?}") };
    if heads == 0 || !rows.is_multiple_of(2 * heads) || (dims.len() == 1 && t.dtype().block_size() != 1) {
        return Err(bad());
    }
    let row_bytes = data.len() / rows;
    let (hd, half) = (rows / heads, rows / heads / 2);
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        // Interleaved row 2i + j of a head is its halves row j·half + i.
        let (head, within) = (r / hd, r % hd);
        let from = head * hd + (within % 2) * half + within / 2;
        out.extend_from_slice(&data[from * row_bytes..(from + 1) * row_bytes]);
    }
    Ok(QTensor::new(QStorage::from_data(Cow::Owned(out), device, t.dtype())?, dims)?)
}
