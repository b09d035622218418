//! One llama decoder layer in candle ops, for draft heads: the same code runs a head while
//! drafting (a few rows against a small KV cache) and while training (whole sequences, with
//! gradients), so every op here has a backward pass.

use candle_core::{DType, Device, Tensor, D};

use super::target::Proj;
use crate::error::Result;

/// The shape of a head's decoder layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerShape {
    /// Model width.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Feed-forward width.
    pub intermediate: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
}

/// A decoder layer: attention with its residual, then a SwiGLU feed-forward with its own.
/// `input_norm` is absent in EAGLE-1 heads (their layer 0 reads the fc output as it is).
///
/// Not the candle engine's block (`models::candle_llama`): that one runs candle's fused
/// kernels (`rms_norm`, `rope_i`) on GGUF's interleaved rows, while a head trains through this
/// layer (every op here has a backward pass) and its checkpoints keep the halves RoPE layout.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub(crate) shape: LayerShape,
    pub(crate) input_norm: Option<Tensor>,
    pub(crate) q: Proj,
    pub(crate) k: Proj,
    pub(crate) v: Proj,
    pub(crate) o: Proj,
    pub(crate) post_norm: Tensor,
    pub(crate) gate: Proj,
    pub(crate) up: Proj,
    pub(crate) down: Proj,
}

/// Keys and values of earlier positions, `(1, kv_heads, len, head_dim)` each. It grows by
/// concatenation, not in place as the candle engine's `KvCache` does, because training's
/// unrolled pass ([`EagleHead::unroll`](super::EagleHead::unroll)) differentiates through it
/// (candle's in-place `slice_set` has no backward pass).
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    pub(crate) kv: Option<(Tensor, Tensor)>,
}

impl LayerCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.dim(2).unwrap_or(0))
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.kv.is_none()
    }

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len == 0 {
            self.kv = None;
        } else if let Some((k, v)) = &self.kv {
            if len < k.dim(2)? {
                self.kv = Some((k.narrow(2, 0, len)?, v.narrow(2, 0, len)?));
            }
        }
        Ok(())
    }

    /// Appends keys and values.
    pub fn push(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        self.kv = Some(match &self.kv {
            None => (k.clone(), v.clone()),
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2)?, Tensor::cat(&[pv, v], 2)?),
        });
        Ok(())
    }
}

/// RMSNorm over the last dimension, from differentiable ops.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    Ok(x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(weight)?)
}

/// Cosine and sine tables, `(positions.len(), head_dim / 2)`, for RoPE in the halves layout.
pub fn rope_tables(positions: &[usize], head_dim: usize, theta: f64, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for i in 0..half {
            let angle = p as f64 / theta.powf(2.0 * i as f64 / head_dim as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let shape = (positions.len(), half);
    Ok((Tensor::from_vec(cos, shape, device)?, Tensor::from_vec(sin, shape, device)?))
}

/// An additive mask `(rows, cols)`: 0 where `sees(row, col)`, −∞ elsewhere.
pub fn mask(rows: usize, cols: usize, device: &Device, sees: impl Fn(usize, usize) -> bool) -> Result<Tensor> {
    let data: Vec<f32> = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .map(|(r, c)| if sees(r, c) { 0.0 } else { f32::NEG_INFINITY })
        .collect();
    Ok(Tensor::from_vec(data, (rows, cols), device)?)
}

impl DecoderLayer {
    /// Runs the layer on `(batch, t, ·)`: attention reads `attn_in` (normed by `input_norm`
    /// when there is one) and adds to `residual`; `cos`/`sin` are the `t` rows' rotations;
    /// the keys attended are `cache`'s then the new ones, under `mask` `(t, cache + t)`. With
    /// a cache (batch 1) the new keys and values are appended to it.
    pub fn forward(
        &self,
        attn_in: &Tensor,
        residual: &Tensor,
        rope: (&Tensor, &Tensor),
        mask: &Tensor,
        cache: Option<&mut LayerCache>,
    ) -> Result<Tensor> {
        let s = self.shape;
        let (b, t, _) = attn_in.dims3()?;
        let x = match &self.input_norm {
            Some(w) => rms_norm(attn_in, w, s.eps)?,
            None => attn_in.clone(),
        };
        let split = |lin: &Proj, heads: usize| -> Result<Tensor> {
            Ok(lin.forward(&x)?.reshape((b, t, heads, s.head_dim))?.transpose(1, 2)?.contiguous()?)
        };
        let q = candle_nn::rotary_emb::rope_slow(&split(&self.q, s.heads)?, rope.0, rope.1)?;
        let k = candle_nn::rotary_emb::rope_slow(&split(&self.k, s.kv_heads)?, rope.0, rope.1)?;
        let v = split(&self.v, s.kv_heads)?;
        let (k, v) = match cache {
            Some(cache) => {
                cache.push(&k, &v)?;
                cache.kv.clone().unwrap_or((k, v))
            }
            None => (k, v),
        };
        let group = s.heads / s.kv_heads;
        let (k, v) = (repeat_kv(&k, group)?, repeat_kv(&v, group)?);
        let scores = (q.matmul(&k.t()?)? / (s.head_dim as f64).sqrt())?.broadcast_add(mask)?;
        let att = candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(&v.contiguous()?)?;
        let att = att.transpose(1, 2)?.reshape((b, t, s.heads * s.head_dim))?;
        let h = (residual + self.o.forward(&att)?)?;
        let m = rms_norm(&h, &self.post_norm, s.eps)?;
        let ff = (candle_nn::ops::silu(&self.gate.forward(&m)?)? * self.up.forward(&m)?)?;
        Ok((h + self.down.forward(&ff)?)?)
    }
}

fn repeat_kv(x: &Tensor, group: usize) -> Result<Tensor> {
    if group == 1 {
        return Ok(x.clone());
    }
    let (b, kvh, t, d) = x.dims4()?;
    Ok(x.unsqueeze(2)?.expand((b, kvh, group, t, d))?.reshape((b, kvh * group, t, d))?)
}

/// A tensor as f32 on `device`.
pub(crate) fn f32_on(t: Tensor, device: &Device) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.to_device(device)?)
}
