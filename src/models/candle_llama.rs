//! The llama forward pass on candle tensors: device-generic (CPU or CUDA), built from candle's
//! own ops. On CPU the native engine (`crate::native`) is faster; this one serves CUDA, the
//! weight formats the native engine lacks, and tests as an independent implementation.

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::models::block::{mask, Block, BlockShape};
use crate::models::config::LlamaConfig;
use crate::models::engine::{Backend, Cache, Engine, Pass, Tap, TokenMatrices};
use crate::models::format::WeightFormat;
use crate::models::kv_cache::KvCache;
use crate::models::linear::Linear;
use crate::models::tensors::{map_parts, BlockTensors, OuterTensors, TensorSource};
use crate::tree::TreeShape;

/// Weights as candle tensors on one device.
#[derive(Debug)]
pub struct CandleWeights {
    config: LlamaConfig,
    device: Device,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    /// Whether the output head is the embedding.
    tied: bool,
    /// RoPE cosines and sines of the global layers, then, for a model with a sliding window,
    /// of the sliding-window ones.
    cos: Vec<Tensor>,
    sin: Vec<Tensor>,
}

impl CandleWeights {
    /// Reads every tensor of the model from `source` (see [`BlockTensors`]).
    ///
    /// # Errors
    /// Missing tensors, shape mismatches, backend failures.
    pub fn load(source: &mut dyn TensorSource, c: &LlamaConfig, format: WeightFormat, device: &Device) -> Result<Self> {
        let vector = |t: QTensor| -> Result<Tensor> { Ok(t.dequantize(device)?) };
        let mut blocks = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let t = BlockTensors::read(source, c, i, device)?;
            let (qkv_bias, qk_norm, post_norms) =
                (map_parts(t.qkv_bias, vector)?, map_parts(t.qk_norm, vector)?, map_parts(t.post_norms, vector)?);
            blocks.push(Block {
                shape: BlockShape::of(c),
                qkv_bias,
                qk_norm,
                post_norms,
                sliding: c.is_sliding(i),
                attn_norm: Some(vector(t.attn_norm)?),
                q: Linear::new(t.q, format, device)?,
                k: Linear::new(t.k, format, device)?,
                v: Linear::new(t.v, format, device)?,
                o: Linear::new(t.o, format, device)?,
                ffn_norm: vector(t.ffn_norm)?,
                gate: Linear::new(t.gate, format, device)?,
                up: Linear::new(t.up, format, device)?,
                down: Linear::new(t.down, format, device)?,
            });
        }
        let outer = OuterTensors::read(source, c, device)?;
        let embed = outer.embed.dequantize(device)?;
        let tied = outer.lm_head.is_none();
        let lm_head = Linear::new(outer.lm_head.unwrap_or(outer.embed), format, device)?;
        let kinds = [false, true].into_iter().take(1 + usize::from(c.sliding_window.is_some()));
        let angles: Vec<Tensor> = kinds
            .map(|local| Tensor::from_vec(c.rope_angles(local), (c.max_context, c.head_dim / 2), device))
            .collect::<candle_core::Result<_>>()?;
        Ok(Self {
            config: c.clone(),
            device: device.clone(),
            embed,
            blocks,
            norm: vector(outer.norm)?,
            lm_head,
            tied,
            cos: angles.iter().map(Tensor::cos).collect::<candle_core::Result<_>>()?,
            sin: angles.iter().map(Tensor::sin).collect::<candle_core::Result<_>>()?,
        })
    }
}

/// The KV cache of one model instance on the candle engine: the blocks it runs, and a
/// [`KvCache`] for each.
#[derive(Debug)]
pub struct CandleCache {
    blocks: Vec<usize>,
    layers: Vec<KvCache>,
}

impl Cache for CandleCache {
    fn blocks(&self) -> &[usize] {
        &self.blocks
    }
}

impl Backend for CandleWeights {
    type Cache = CandleCache;

    fn engine(&self) -> Engine {
        Engine::Candle
    }

    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The embedding as loaded, and the output head dequantized when it is the model's own.
    fn token_matrices(&self, device: &Device) -> Result<TokenMatrices> {
        let output = match self.tied {
            true => None,
            false => Some(self.lm_head.to_f32()?.to_device(device)?),
        };
        Ok(TokenMatrices { embed: self.embed.to_device(device)?, output })
    }

    /// One [`KvCache`] per block.
    fn new_cache(&self, layers: &[usize]) -> Result<CandleCache> {
        let c = &self.config;
        let capacity = 256.min(c.max_context);
        let kv = layers.iter().map(|_| KvCache::new(c.num_kv_heads, c.head_dim, capacity, &self.device));
        Ok(CandleCache { blocks: layers.to_vec(), layers: kv.collect::<Result<_>>()? })
    }

    fn forward_hidden(
        &self,
        cache: &mut CandleCache,
        pos: usize,
        tokens: &[u32],
        rows: usize,
        taps: &[Tap],
    ) -> Result<Pass> {
        self.run(cache, pos, tokens, rows, None, taps)
    }

    fn forward_tree(
        &self,
        cache: &mut CandleCache,
        pos: usize,
        tokens: &[u32],
        tree: &TreeShape,
        taps: &[Tap],
    ) -> Result<Pass> {
        self.run(cache, pos, tokens, tokens.len(), Some(tree), taps)
    }

    fn keep_path(&self, cache: &mut CandleCache, pos: usize, path: &[usize]) -> Result<()> {
        cache.layers.iter_mut().try_for_each(|k| k.keep(pos, path))
    }
}

impl CandleWeights {
    /// The forward pass of a chain (`tree` is `None`) or a tree (see [`Backend::forward_tree`]),
    /// with the hidden states `taps` asks for (none copied when it is empty).
    fn run(
        &self,
        cache: &mut CandleCache,
        pos: usize,
        tokens: &[u32],
        rows: usize,
        tree: Option<&TreeShape>,
        taps: &[Tap],
    ) -> Result<Pass> {
        let c = &self.config;
        let CandleCache { blocks: layers, layers: caches } = cache;
        let mut hidden = vec![Vec::new(); taps.len()];
        let tap = |slot: Tap, x: &Tensor, hidden: &mut Vec<Vec<f32>>| -> Result<()> {
            if let Some(k) = taps.iter().position(|&t| t == slot) {
                hidden[k] = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            }
            Ok(())
        };
        // The roll-back contract: positions from `pos` on are forgotten (a failed call may
        // have left some layers longer than others).
        caches.iter_mut().for_each(|k| k.truncate(pos));
        let n = tokens.len();
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        if c.family.gemma() {
            x = (x * (c.hidden_size as f64).sqrt())?;
        }
        // Each token's position: pos + i along a chain, pos + depth in a tree.
        let at: Vec<u32> = (0..n).map(|i| (pos + tree.map_or(i, |t| t.depth(i))) as u32).collect();
        let at = Tensor::new(at, &self.device)?;
        // Per kind of layer (global, then sliding-window where the model has a window): each
        // token's rotation and the attention mask.
        let kinds: Vec<(Tensor, Tensor, Option<Tensor>)> = (self.cos.iter().zip(&self.sin))
            .zip([None, c.sliding_window])
            .map(|((cos, sin), window)| {
                let mask = attention_mask(n, pos, tree, window, &self.device)?;
                Ok((cos.index_select(&at, 0)?, sin.index_select(&at, 0)?, mask))
            })
            .collect::<Result<_>>()?;
        let eps = c.rms_norm_eps as f32;
        for (slot, (cache, &l)) in caches.iter_mut().zip(layers.iter()).enumerate() {
            tap(Tap::Residual(slot), &x, &mut hidden)?;
            let b = &self.blocks[l];
            let (cos, sin, mask) = &kinds[usize::from(b.sliding)];
            x = b.forward(&x, None, (cos, sin), mask.as_ref(), cache)?;
        }
        tap(Tap::Residual(layers.len()), &x, &mut hidden)?;
        if taps.contains(&Tap::Final) {
            tap(Tap::Final, &candle_nn::ops::rms_norm(&x, &self.norm, eps)?, &mut hidden)?;
        }
        if rows == 0 {
            return Ok(Pass { logits: Vec::new(), hidden });
        }
        let last = candle_nn::ops::rms_norm(&x.narrow(0, n - rows, rows)?, &self.norm, eps)?;
        let logits = self.lm_head.forward(&last)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(Pass { logits, hidden })
    }
}

/// (n, pos + n) additive mask: new token i sees the cached positions and, of the new ones,
/// those up to itself (a chain) or its ancestors and itself (a tree); with a sliding `window`,
/// only the cached positions among its last `window` positions.
fn attention_mask(
    n: usize,
    pos: usize,
    tree: Option<&TreeShape>,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let position = |i: usize| pos + tree.map_or(i, |t| t.depth(i));
    let first = |i: usize| window.map_or(0, |w| (position(i) + 1).saturating_sub(w));
    if n == 1 && first(0) == 0 {
        return Ok(None);
    }
    let sees = |i: usize, j: usize| j <= i && tree.is_none_or(|t| t.sees(i)[j]);
    mask(n, pos + n, device, |i, j| {
        // Index j of the call is position j in the cache, or a new token at its own.
        let at = if j < pos { j } else { position(j - pos) };
        at >= first(i) && (j < pos || sees(i, j - pos))
    })
}
