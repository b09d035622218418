//! A llama-family transformer on candle: embeddings, RMSNorm, RoPE, grouped-query attention,
//! SwiGLU, tied or separate output head. One `forward` scores any number of new tokens at the
//! current offset and returns a logits row for each of the last `rows`; the KV cache rolls back
//! with `truncate`.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::loading::TensorSource;
use crate::model::{Logits, TargetModel};
use crate::models::config::LlamaConfig;
use crate::models::kv_cache::KvCache;
use crate::models::linear::{Linear, WeightFormat};

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

/// Everything read-only about a model, shareable between a target and a layer-skip draft.
#[derive(Debug)]
pub struct LlamaWeights {
    config: LlamaConfig,
    device: Device,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
}

/// Initial KV cache capacity; it doubles as needed.
const INITIAL_CACHE: usize = 256;

impl LlamaWeights {
    /// Reads the weights named in GGUF style (`token_embd.weight`, `blk.N.attn_q.weight`, …)
    /// from `source`. Query and key weights must be in the interleaved-RoPE row order GGUF uses.
    ///
    /// # Errors
    /// [`Error::MissingTensor`], shape mismatches, backend failures.
    pub fn load(source: &mut dyn TensorSource, config: LlamaConfig, format: WeightFormat, device: &Device) -> Result<Self> {
        config.validate()?;
        let c = &config;
        let (q_out, kv_out) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let head_name = if source.has("output.weight") { "output.weight" } else { "token_embd.weight" };
        let mut linear = |name: &str, shape: (usize, usize)| -> Result<Linear> {
            let t = source.qtensor(name, device)?;
            expect_shape(name, t.shape().dims(), &[shape.0, shape.1])?;
            Linear::new(t, format, device)
        };
        let mut blocks = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            blocks.push(Block {
                q: linear(&p("attn_q"), (q_out, c.hidden_size))?,
                k: linear(&p("attn_k"), (kv_out, c.hidden_size))?,
                v: linear(&p("attn_v"), (kv_out, c.hidden_size))?,
                o: linear(&p("attn_output"), (c.hidden_size, q_out))?,
                gate: linear(&p("ffn_gate"), (c.intermediate_size, c.hidden_size))?,
                up: linear(&p("ffn_up"), (c.intermediate_size, c.hidden_size))?,
                down: linear(&p("ffn_down"), (c.hidden_size, c.intermediate_size))?,
                attn_norm: Tensor::zeros(1, DType::F32, device)?,
                ffn_norm: Tensor::zeros(1, DType::F32, device)?,
            });
        }
        let lm_head = linear(head_name, (c.vocab_size, c.hidden_size))?;
        let mut vector = |name: &str, len: usize| -> Result<Tensor> {
            let t = source.qtensor(name, device)?.dequantize(device)?;
            expect_shape(name, t.dims(), &[len])?;
            Ok(t)
        };
        for (i, b) in blocks.iter_mut().enumerate() {
            b.attn_norm = vector(&format!("blk.{i}.attn_norm.weight"), c.hidden_size)?;
            b.ffn_norm = vector(&format!("blk.{i}.ffn_norm.weight"), c.hidden_size)?;
        }
        let norm = vector("output_norm.weight", c.hidden_size)?;
        let embed = source.qtensor("token_embd.weight", device)?.dequantize(device)?;
        expect_shape("token_embd.weight", embed.dims(), &[c.vocab_size, c.hidden_size])?;
        let (cos, sin) = rope_tables(c, device)?;
        Ok(Self { config, device: device.clone(), embed, blocks, norm, lm_head, cos, sin })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }
}

fn expect_shape(name: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got != want {
        return Err(Error::Load { path: name.into(), reason: format!("tensor `{name}` has shape {got:?}, expected {want:?}") });
    }
    Ok(())
}

/// cos and sin of position × frequency, (max_context, head_dim / 2), for interleaved RoPE.
fn rope_tables(c: &LlamaConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let inv_freq: Vec<f32> = (0..half).map(|i| 1.0 / c.rope_theta.powf(2.0 * i as f32 / c.head_dim as f32)).collect();
    let angles: Vec<f32> = (0..c.max_context).flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f)).collect();
    let angles = Tensor::from_vec(angles, (c.max_context, half), device)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// A llama-family model with its own KV cache over shared weights.
///
/// `layers` selects which blocks run: all of them for the model itself, a prefix (or any
/// subset) for a layer-skip self-draft made with [`Llama::with_layers`].
#[derive(Debug)]
pub struct Llama {
    weights: Arc<LlamaWeights>,
    layers: Vec<usize>,
    caches: Vec<KvCache>,
}

impl Llama {
    /// A model running every block of `weights`.
    ///
    /// # Errors
    /// Backend failures allocating the cache.
    pub fn new(weights: Arc<LlamaWeights>) -> Result<Self> {
        let layers = (0..weights.config.num_layers).collect();
        Self::with_layers(weights, layers)
    }

    /// A model running only the blocks in `layers` (then the final norm and the output head),
    /// sharing the weights: the layer-skip self-draft.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for an empty or out-of-range layer list.
    pub fn with_layers(weights: Arc<LlamaWeights>, layers: Vec<usize>) -> Result<Self> {
        let n = weights.config.num_layers;
        if layers.is_empty() || layers.iter().any(|&l| l >= n) {
            return Err(Error::setting("layers", format!("{layers:?}"), "a non-empty list of block indices below num_layers"));
        }
        let c = &weights.config;
        let capacity = INITIAL_CACHE.min(c.max_context);
        let caches = layers.iter().map(|_| KvCache::new(c.num_kv_heads, c.head_dim, capacity, &weights.device)).collect::<Result<_>>()?;
        Ok(Self { weights, layers, caches })
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<LlamaWeights> {
        &self.weights
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.weights.config
    }

    /// The blocks this model runs.
    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    fn len(&self) -> usize {
        self.caches.first().map_or(0, KvCache::len)
    }

    /// Tokens in the context (the same as [`TargetModel::context_len`], callable without
    /// naming the trait when both model traits are in scope).
    pub fn context_len(&self) -> usize {
        self.len()
    }

    /// Rolls the context back to `len` tokens ([`TargetModel::truncate`]).
    ///
    /// # Errors
    /// [`Error::BadTruncate`] when `len` exceeds the context.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len() {
            return Err(Error::BadTruncate { len: self.len(), to: len });
        }
        self.caches.iter_mut().for_each(|c| c.truncate(len));
        Ok(())
    }

    /// Runs `tokens` through the model at the current offset and returns the final hidden
    /// states of the last `rows` positions, (rows, hidden).
    fn hidden(&mut self, tokens: &[u32], rows: usize) -> Result<Tensor> {
        let w = Arc::clone(&self.weights);
        let c = &w.config;
        let (n, pos) = (tokens.len(), self.len());
        let ids = Tensor::new(tokens, &w.device)?;
        let mut x = w.embed.index_select(&ids, 0)?;
        let cos = w.cos.narrow(0, pos, n)?;
        let sin = w.sin.narrow(0, pos, n)?;
        let mask = causal_mask(n, pos, &w.device)?;
        for (cache, &l) in self.caches.iter_mut().zip(&self.layers) {
            let b = &w.blocks[l];
            let h = candle_nn::ops::rms_norm(&x, &b.attn_norm, c.rms_norm_eps as f32)?;
            let attn = attention(c, b, &h, &cos, &sin, mask.as_ref(), cache)?;
            x = (x + b.o.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &b.ffn_norm, c.rms_norm_eps as f32)?;
            let ffn = (candle_nn::ops::silu(&b.gate.forward(&h)?)? * b.up.forward(&h)?)?;
            x = (x + b.down.forward(&ffn)?)?;
        }
        let last = x.narrow(0, n - rows, rows)?;
        Ok(candle_nn::ops::rms_norm(&last, &w.norm, c.rms_norm_eps as f32)?)
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

impl TargetModel for Llama {
    fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }

    fn context_len(&self) -> usize {
        Llama::context_len(self)
    }

    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        let weights = Arc::clone(&self.weights);
        let c = &weights.config;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::TokenOutOfRange { token, vocab: c.vocab_size });
        }
        if rows > tokens.len() {
            return Err(Error::setting("rows", rows, "at most the number of tokens fed"));
        }
        if self.len() + tokens.len() > c.max_context {
            return Err(Error::ContextTooLong { len: self.len() + tokens.len(), max: c.max_context });
        }
        if tokens.is_empty() {
            return Logits::new(Vec::new(), c.vocab_size);
        }
        let before = self.len();
        let result = self.hidden(tokens, rows).and_then(|h| {
            if rows == 0 {
                return Ok(Vec::new());
            }
            let logits = weights.lm_head.forward(&h)?;
            Ok(logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
        });
        match result {
            Ok(data) => Logits::new(data, c.vocab_size),
            Err(e) => {
                // A failure part-way leaves some layers longer than others: undo them all.
                self.caches.iter_mut().for_each(|k| k.truncate(before));
                Err(e)
            }
        }
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        Llama::truncate(self, len)
    }
}
