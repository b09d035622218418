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
        let ([q, k, v], [gate, up]) = match c.family.fused() {
            // Phi-3 stores q|k|v and gate|up as one matrix each.
            true => {
                let [q, k, v] =
                    split_rows(&read("attn_qkv", &[q_out + 2 * kv_out, h])?, [q_out, kv_out, kv_out], device)?;
                ([q, k, v], split_rows(&read("ffn_up", &[2 * ff, h])?, [ff, ff], device)?)
            }
            false => (
                [read("attn_q", &[q_out, h])?, read("attn_k", &[kv_out, h])?, read("attn_v", &[kv_out, h])?],
                [read("ffn_gate", &[ff, h])?, read("ffn_up", &[ff, h])?],
            ),
        };
        Ok(Self {
            attn_norm: read("attn_norm", &[h])?,
            q,
            k,
            v,
            o: read("attn_output", &[h, q_out])?,
            ffn_norm: read("ffn_norm", &[h])?,
            gate,
            up,
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
        return Err(Error::load("", format!("tensor `{name}` has shape {got:?}, expected {want:?}")));
    }
    Ok(())
}

/// Applies `f` to each of a block's optional tensors (biases, extra norms), keeping `None`.
///
/// # Errors
/// The first error `f` returns.
pub(crate) fn map_parts<const N: usize, T>(
    parts: Option<[QTensor; N]>,
    f: impl FnMut(QTensor) -> Result<T>,
) -> Result<Option<[T; N]>> {
    let Some(parts) = parts else { return Ok(None) };
    let mapped: Vec<T> = parts.into_iter().map(f).collect::<Result<_>>()?;
    // N in, N out.
    Ok(mapped.try_into().ok())
}

/// Splits a matrix into consecutive blocks of rows, moving whole rows of bytes (quantized rows
/// stay exactly as stored).
///
/// # Errors
/// [`Error::Load`] when the row counts do not add up to the matrix's.
pub(crate) fn split_rows<const N: usize>(t: &QTensor, rows: [usize; N], device: &Device) -> Result<[QTensor; N]> {
    let dims = t.shape().dims();
    let total = dims.first().copied().unwrap_or(0);
    if rows.iter().sum::<usize>() != total || dims.len() != 2 {
        let reason = format!("cannot split a tensor of shape {dims:?} into rows {rows:?}");
        return Err(Error::load("", reason));
    }
    if total == 0 {
        return Err(Error::load("", "cannot split a tensor of no rows"));
    }
    let data = t.data()?;
    let row_bytes = data.len() / total;
    let mut start = 0;
    let mut parts = Vec::with_capacity(N);
    for r in rows {
        let bytes = data[start * row_bytes..(start + r) * row_bytes].to_vec();
        parts.push(QTensor::new(QStorage::from_data(Cow::Owned(bytes), device, t.dtype())?, (r, dims[1]))?);
        start += r;
    }
    parts.try_into().map_err(|_| Error::load("", "split"))
}

/// Puts the query and key rows of tensor `name` (HF files, Qwen, Gemma and Phi-3 GGUF files
/// store each head's first rotary elements, then its second ones: halves order) into the
/// interleaved order this crate's RoPE uses: `attn_q` weights and biases by `heads` heads,
/// `attn_k` by `kv_heads`, per-head q/k norm weights as one head, and the query and key heads
/// of a fused `attn_qkv` matrix (its values kept). Other tensors come back as they are. Whole
/// rows of bytes move, so quantized rows stay exactly as stored.
///
/// # Errors
/// [`Error::Load`] when the rows do not split into those heads of an even width, or a 1-D
/// tensor is quantized.
#[cfg(feature = "llama")]
pub(crate) fn to_interleaved(
    name: &str,
    t: QTensor,
    heads: usize,
    kv_heads: usize,
    device: &Device,
) -> Result<QTensor> {
    let rows = t.shape().dims().first().copied().unwrap_or(0);
    // (heads in the tensor, of which reordered)
    let (all, reordered) = match name.split('.').nth(2) {
        Some("attn_q") => (heads, heads),
        Some("attn_k") => (kv_heads, kv_heads),
        Some("attn_q_norm" | "attn_k_norm") => (1, 1),
        Some("attn_qkv") => (heads + 2 * kv_heads, heads + kv_heads),
        _ => return Ok(t),
    };
    if all == 0 || !rows.is_multiple_of(all) {
        let reason = format!("`{name}`: {rows} rows do not split into {all} heads");
        return Err(Error::load("", reason));
    }
    let hd = rows / all;
    reorder_heads(&t, hd, reordered * hd, device)
}

/// Reorders the first `count` rows of `t`, head by head of `hd` rows, from halves into
/// interleaved order; the rows after them stay (the values of a fused q|k|v matrix).
///
/// # Errors
/// [`Error::Load`] when `hd` is odd or zero, `count` is not a whole number of heads or more
/// than the rows, or a 1-D tensor is quantized.
#[cfg(feature = "llama")]
fn reorder_heads(t: &QTensor, hd: usize, count: usize, device: &Device) -> Result<QTensor> {
    let dims = t.shape().dims();
    let rows = dims.first().copied().unwrap_or(0);
    let fits = rows > 0 && hd > 0 && hd.is_multiple_of(2) && count.is_multiple_of(hd) && count <= rows;
    if !fits || (dims.len() == 1 && t.dtype().block_size() != 1) {
        let reason = format!("cannot reorder {count} query/key rows of {hd} per head in a tensor of shape {dims:?}");
        return Err(Error::load("", reason));
    }
    let data = t.data()?;
    let (row_bytes, half) = (data.len() / rows, hd / 2);
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        // Interleaved row 2i + j of a head is its halves row j·half + i.
        let (head, within) = (r / hd, r % hd);
        let from = if r < count { head * hd + (within % 2) * half + within / 2 } else { r };
        out.extend_from_slice(&data[from * row_bytes..(from + 1) * row_bytes]);
    }
    Ok(QTensor::new(QStorage::from_data(Cow::Owned(out), device, t.dtype())?, dims)?)
}
