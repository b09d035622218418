//! The transformer block on candle tensors, the one every model run on candle goes through:
//! the candle engine's layers, and an EAGLE draft head's decoder layer, both while drafting
//! (candle's fused kernels, a KV cache that grows in place) and while training (candle's
//! differentiable ops, a cache that concatenates: see [`KvCache`]).

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::models::config::{rope_angles, LlamaConfig};
use crate::models::kv_cache::KvCache;
use crate::models::linear::Linear;

/// Where the rotary pairs sit in a head's query and key rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeLayout {
    /// Elements `2i` and `2i + 1`: GGUF's order, into which the loaders put HF weights.
    Interleaved,
    /// Elements `i` and `i + head_dim / 2`: HF's order, which draft heads keep (a head trains
    /// on its files' own tensors, so it cannot hold reordered copies).
    #[cfg_attr(not(feature = "heads"), allow(dead_code))] // used by the draft heads
    Halves,
}

/// The sizes and kinds of a block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BlockShape {
    /// Query heads.
    pub(crate) heads: usize,
    /// Key/value heads (dividing the query heads).
    pub(crate) kv_heads: usize,
    /// Width of one head (even).
    pub(crate) head_dim: usize,
    /// RMSNorm epsilon.
    pub(crate) eps: f32,
    /// The rotary pairs' layout.
    pub(crate) rope: RopeLayout,
    /// GELU in the feed-forward layer (Gemma) instead of SiLU.
    pub(crate) gelu: bool,
}

impl BlockShape {
    /// The shape of a model's blocks, as the loaders hold them.
    pub(crate) fn of(c: &LlamaConfig) -> Self {
        Self {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            eps: c.rms_norm_eps as f32,
            rope: RopeLayout::Interleaved,
            gelu: c.family.gemma(),
        }
    }
}

/// One transformer block's weights: attention with its residual, then a gated feed-forward
/// layer with its own.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub(crate) shape: BlockShape,
    /// RMSNorm weight before attention; absent in EAGLE heads, whose attention input comes
    /// normed or is the `fc` output as it is.
    pub(crate) attn_norm: Option<Tensor>,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) ffn_norm: Tensor,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
    /// Query, key and value biases (Qwen2).
    pub(crate) qkv_bias: Option<[Tensor; 3]>,
    /// RMSNorm weights of each query head and each key head (Qwen3, Gemma 3).
    pub(crate) qk_norm: Option<[Tensor; 2]>,
    /// RMSNorm weights after attention and after the feed-forward layer (Gemma).
    pub(crate) post_norms: Option<[Tensor; 2]>,
    /// True for a sliding-window layer (Gemma 3).
    pub(crate) sliding: bool,
}

impl Block {
    /// The block on `n` rows of the residual stream `x` (n, hidden). Attention reads `x`, or
    /// `attn_in` (n, ·) where given (an EAGLE-3 head reads its token and its state side by
    /// side), through `attn_norm`; `rope` holds the rows' cosines and sines (n, head_dim / 2);
    /// `mask` (n, cached + n), when given, is added to the scores (the keys are `cache`'s, then
    /// the new rows', which are appended to it).
    ///
    /// The cache decides the ops: over a cache that grows in place, candle's fused kernels;
    /// over a differentiable one, the composed ops autograd differentiates.
    ///
    /// # Errors
    /// Shape mismatches, backend failures.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        attn_in: Option<&Tensor>,
        rope: (&Tensor, &Tensor),
        mask: Option<&Tensor>,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let (s, slow) = (self.shape, cache.is_differentiable());
        let h = attn_in.unwrap_or(x);
        let h = match &self.attn_norm {
            Some(w) => rms_norm(h, w, s.eps, slow)?,
            None => h.clone(),
        };
        let attn = self.attention(&h, rope, mask, cache)?;
        let residual = |x: &Tensor, y: Tensor, post: usize| -> Result<Tensor> {
            Ok(match &self.post_norms {
                Some(w) => (x + rms_norm(&y, &w[post], s.eps, slow)?)?,
                None => (x + y)?,
            })
        };
        let x = residual(x, self.o.forward(&attn)?, 0)?;
        let h = rms_norm(&x, &self.ffn_norm, s.eps, slow)?;
        let gate = self.gate.forward(&h)?;
        let gate = if s.gelu { gate.gelu()? } else { candle_nn::ops::silu(&gate)? };
        let ffn = (gate * self.up.forward(&h)?)?;
        residual(&x, self.down.forward(&ffn)?, 1)
    }

    /// Self-attention of `n` new rows over the cache: queries (heads, n, hd) grouped as
    /// (kv_heads, groups·n, hd) so each key/value head serves its query heads without copies.
    fn attention(
        &self,
        h: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        mask: Option<&Tensor>,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let (s, slow) = (self.shape, cache.is_differentiable());
        let n = h.dim(0)?;
        let (hd, kvh, groups) = (s.head_dim, s.kv_heads, s.heads / s.kv_heads);
        let project = |w: &Linear, i: usize| -> Result<Tensor> {
            let x = w.forward(h)?;
            Ok(match &self.qkv_bias {
                Some(bias) => x.broadcast_add(&bias[i])?,
                None => x,
            })
        };
        let heads = |t: Tensor, count: usize, norm: Option<&Tensor>| -> Result<Tensor> {
            let t = t.reshape((n, count, hd))?;
            let t = match norm {
                Some(w) => rms_norm(&t.contiguous()?, w, s.eps, slow)?,
                None => t,
            };
            let t = t.transpose(0, 1)?.contiguous()?.unsqueeze(0)?;
            Ok(rotate(&t, cos, sin, s.rope, slow)?.squeeze(0)?)
        };
        let norms = self.qk_norm.as_ref();
        let q = heads(project(&self.q, 0)?, s.heads, norms.map(|n| &n[0]))?;
        let k = heads(project(&self.k, 1)?, kvh, norms.map(|n| &n[1]))?;
        let v = project(&self.v, 2)?.reshape((n, kvh, hd))?.transpose(0, 1)?.contiguous()?;
        let (keys, values) = cache.append(&k, &v)?;
        let total = keys.dim(1)?;
        let q = q.reshape((kvh, groups * n, hd))?;
        let scores = (q.matmul(&keys.t()?)? * (1.0 / (hd as f64).sqrt()))?;
        let scores = match mask {
            Some(m) => scores.reshape((kvh, groups, n, total))?.broadcast_add(m)?.reshape((kvh, groups * n, total))?,
            None => scores,
        };
        let probs = match slow {
            true => candle_nn::ops::softmax(&scores, candle_core::D::Minus1)?,
            false => candle_nn::ops::softmax_last_dim(&scores)?,
        };
        let out = probs.matmul(&values.contiguous()?)?; // (kvh, groups·n, hd)
        Ok(out.reshape((s.heads, n, hd))?.transpose(0, 1)?.reshape((n, s.heads * hd))?)
    }
}

/// RMSNorm over the last dimension: candle's fused kernel, or (`differentiable`) its composed
/// version, which has a backward pass.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, differentiable: bool) -> Result<Tensor> {
    Ok(match differentiable {
        true => candle_nn::ops::rms_norm_slow(x, w, eps)?,
        false => candle_nn::ops::rms_norm(x, w, eps)?,
    })
}

/// RoPE on (1, heads, n, hd) rows in `layout`, fused or (`differentiable`) composed.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, layout: RopeLayout, differentiable: bool) -> Result<Tensor> {
    use candle_nn::rotary_emb::{rope, rope_i, rope_i_slow, rope_slow};
    Ok(match (layout, differentiable) {
        (RopeLayout::Interleaved, false) => rope_i(x, cos, sin)?,
        (RopeLayout::Interleaved, true) => rope_i_slow(x, cos, sin)?,
        (RopeLayout::Halves, false) => rope(x, cos, sin)?,
        (RopeLayout::Halves, true) => rope_slow(x, cos, sin)?,
    })
}

/// RoPE cosines and sines `(positions.len(), head_dim / 2)` of `positions`, with base `theta`.
///
/// # Errors
/// Backend failures.
#[cfg_attr(not(feature = "heads"), allow(dead_code))] // used by the draft heads
pub(crate) fn rope_rows(positions: &[usize], head_dim: usize, theta: f32, device: &Device) -> Result<(Tensor, Tensor)> {
    let angles = rope_angles(theta, head_dim, positions.iter().copied());
    let angles = Tensor::from_vec(angles, (positions.len(), head_dim / 2), device)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// An additive attention mask `(rows, cols)`: 0 where `sees(row, col)`, −∞ elsewhere; `None`
/// when every row sees every column.
///
/// # Errors
/// Backend failures.
pub(crate) fn mask(
    rows: usize,
    cols: usize,
    device: &Device,
    sees: impl Fn(usize, usize) -> bool,
) -> Result<Option<Tensor>> {
    let data: Vec<f32> = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .map(|(r, c)| if sees(r, c) { 0.0 } else { f32::NEG_INFINITY })
        .collect();
    if data.iter().all(|&x| x == 0.0) {
        return Ok(None);
    }
    Ok(Some(Tensor::from_vec(data, (rows, cols), device)?))
}
