//! The llama forward pass on candle tensors: device-generic (CPU or CUDA), built from candle's
//! own ops. On CPU the native engine (`crate::native`) is faster; this one serves CUDA, the
//! weight formats the native engine lacks, and tests as an independent implementation.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::loading::TensorSource;
use crate::models::config::LlamaConfig;
use crate::models::kv_cache::KvCache;
use crate::models::linear::{Linear, WeightFormat};
use crate::models::llama::{check_shape, rope_angles};

/// One transformer block's weights.
#[derive(Debug)]
struct Block {
    attn_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// Weights as candle tensors on one device.
#[derive(Debug)]
pub struct CandleWeights {
    device: Device,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
}

impl CandleWeights {
    /// Reads every tensor of the model from `source` (GGUF names, interleaved-RoPE row order).
    ///
    /// # Errors
    /// Missing tensors, shape mismatches, backend failures.
    pub fn load(source: &mut dyn TensorSource, c: &LlamaConfig, format: WeightFormat, device: &Device) -> Result<Self> {
        let (q_out, kv_out) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let head_name = if source.has("output.weight") { "output.weight" } else { "token_embd.weight" };
        let mut linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
            let t = source.qtensor(name, device)?;
            check_shape(name, t.shape().dims(), &[rows, cols])?;
            Linear::new(t, format, device)
        };
        let mut blocks = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            blocks.push(Block {
                q: linear(&p("attn_q"), q_out, c.hidden_size)?,
                k: linear(&p("attn_k"), kv_out, c.hidden_size)?,
                v: linear(&p("attn_v"), kv_out, c.hidden_size)?,
                o: linear(&p("attn_output"), c.hidden_size, q_out)?,
                gate: linear(&p("ffn_gate"), c.intermediate_size, c.hidden_size)?,
                up: linear(&p("ffn_up"), c.intermediate_size, c.hidden_size)?,
                down: linear(&p("ffn_down"), c.hidden_size, c.intermediate_size)?,
                attn_norm: Tensor::zeros(1, DType::F32, device)?,
                ffn_norm: Tensor::zeros(1, DType::F32, device)?,
            });
        }
        let lm_head = linear(head_name, c.vocab_size, c.hidden_size)?;
        let mut vector = |name: &str, len: usize| -> Result<Tensor> {
            let t = source.qtensor(name, device)?.dequantize(device)?;
            check_shape(name, t.dims(), &[len])?;
            Ok(t)
        };
        for (i, b) in blocks.iter_mut().enumerate() {
            b.attn_norm = vector(&format!("blk.{i}.attn_norm.weight"), c.hidden_size)?;
            b.ffn_norm = vector(&format!("blk.{i}.ffn_norm.weight"), c.hidden_size)?;
        }
        let norm = vector("output_norm.weight", c.hidden_size)?;
        let embed = source.qtensor("token_embd.weight", device)?.dequantize(device)?;
        check_shape("token_embd.weight", embed.dims(), &[c.vocab_size, c.hidden_size])?;
        let angles = Tensor::from_vec(rope_angles(c), (c.max_context, c.head_dim / 2), device)?;
        Ok(Self { device: device.clone(), embed, blocks, norm, lm_head, cos: angles.cos()?, sin: angles.sin()? })
    }

    /// Empty KV caches, one per block in `layers`.
    ///
    /// # Errors
    /// Backend failures.
    pub fn caches(&self, c: &LlamaConfig, layers: usize) -> Result<Vec<KvCache>> {
        let capacity = 256.min(c.max_context);
        (0..layers).map(|_| KvCache::new(c.num_kv_heads, c.head_dim, capacity, &self.device)).collect()
    }

    /// Runs `tokens` at the caches' offset through the blocks in `layers` and returns the
    /// logits of the last `rows` positions, row-major on the host.
    ///
    /// # Errors
    /// Backend failures.
    pub fn forward(&self, c: &LlamaConfig, caches: &mut [KvCache], layers: &[usize], tokens: &[u32], rows: usize) -> Result<Vec<f32>> {
        let (n, pos) = (tokens.len(), caches.first().map_or(0, KvCache::len));
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        let cos = self.cos.narrow(0, pos, n)?;
        let sin = self.sin.narrow(0, pos, n)?;
        let mask = causal_mask(n, pos, &self.device)?;
        let eps = c.rms_norm_eps as f32;
        for (cache, &l) in caches.iter_mut().zip(layers) {
            let b = &self.blocks[l];
            let h = candle_nn::ops::rms_norm(&x, &b.attn_norm, eps)?;
            let attn = attention(c, b, &h, &cos, &sin, mask.as_ref(), cache)?;
            x = (x + b.o.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &b.ffn_norm, eps)?;
            let ffn = (candle_nn::ops::silu(&b.gate.forward(&h)?)? * b.up.forward(&h)?)?;
            x = (x + b.down.forward(&ffn)?)?;
        }
        if rows == 0 {
            return Ok(Vec::new());
        }
        let last = candle_nn::ops::rms_norm(&x.narrow(0, n - rows, rows)?, &self.norm, eps)?;
        Ok(self.lm_head.forward(&last)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// Self-attention of `n` new positions over the cache: queries (heads, n, hd) grouped as
/// (kv_heads, groups·n, hd) so each key/value head serves its query heads without copies.
fn attention(c: &LlamaConfig, b: &Block, h: &Tensor, cos: &Tensor, sin: &Tensor, mask: Option<&Tensor>, cache: &mut KvCache) -> Result<Tensor> {
    let n = h.dim(0)?;
    let (hd, kvh, groups) = (c.head_dim, c.num_kv_heads, c.num_heads / c.num_kv_heads);
    let heads = |t: Tensor, count: usize| -> Result<Tensor> {
        let t = t.reshape((n, count, hd))?.transpose(0, 1)?.contiguous()?.unsqueeze(0)?;
        Ok(candle_nn::rotary_emb::rope_i(&t, cos, sin)?.squeeze(0)?)
    };
    let q = heads(b.q.forward(h)?, c.num_heads)?;
    let k = heads(b.k.forward(h)?, kvh)?;
    let v = b.v.forward(h)?.reshape((n, kvh, hd))?.transpose(0, 1)?.contiguous()?;
    let (keys, values) = cache.append(&k, &v)?;
    let total = keys.dim(1)?;
    let q = q.reshape((kvh, groups * n, hd))?;
    let scores = (q.matmul(&keys.t()?)? * (1.0 / (hd as f64).sqrt()))?;
    let scores = match mask {
        Some(m) => scores.reshape((kvh, groups, n, total))?.broadcast_add(m)?.reshape((kvh, groups * n, total))?,
        None => scores,
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    let out = probs.matmul(&values.contiguous()?)?; // (kvh, groups·n, hd)
    Ok(out.reshape((c.num_heads, n, hd))?.transpose(0, 1)?.reshape((n, c.num_heads * hd))?)
}

/// (n, pos + n) additive mask: new position i sees cached and new positions up to pos + i.
fn causal_mask(n: usize, pos: usize, device: &Device) -> Result<Option<Tensor>> {
    if n == 1 {
        return Ok(None);
    }
    let total = pos + n;
    let data: Vec<f32> = (0..n).flat_map(|i| (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 })).collect();
    Ok(Some(Tensor::from_vec(data, (n, total), device)?))
}
