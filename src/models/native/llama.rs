//! The llama forward pass of the native CPU engine.
//!
//! Per block: RMSNorm → one fused q|k|v product (+ biases, Qwen2) → (per-head RMSNorm of q
//! and k, Qwen3) → RoPE → cache append → attention → output
//! product + residual → RMSNorm → one fused gate|up product → SiLU·up → down product +
//! residual. Products and attention run on the thread team; the element-wise steps are a few
//! microseconds and run on the calling thread.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::models::config::LlamaConfig;
use crate::models::engine::{Backend, BatchCall, Cache, Engine, Pass, Tap, TokenMatrices};
use crate::models::format::WeightFormat;
use crate::models::native::attention::{self, Shape};
use crate::models::native::matmul::{matmul_parallel, Packed};
use crate::models::native::out_ptr::OutPtr;
use crate::models::native::pool::team;
use crate::models::native::quant::{qmatmul_parallel, QActs, QMatrix};
use crate::models::native::requant::requantize;
use crate::models::native::sizes::product;
use crate::models::tensors::{map_parts, BlockTensors, OuterTensors, TensorSource};
use crate::tree::TreeShape;
use candle_core::quantized::QTensor;

/// Weight rows per chunk of a parallel product: a multiple of the kernels' 4-row tiles, small
/// enough that a busy thread's chunks can be taken over, large enough to amortize a claim.
const GRAIN: usize = 64;

/// A weight matrix, (rows, cols) row-major as stored in GGUF (out, in): f32, or quantized in
/// the engine's layout.
#[derive(Debug)]
pub enum Matrix {
    /// f32 values, packed for the small-M kernel.
    F32(Packed),
    /// Quantized blocks.
    Quant(QMatrix),
    /// Parts stacked by rows that cannot share one layout (a Q4_K_M file's q, k and v may mix
    /// Q4_K and Q6_K): each part runs its own product into its columns of the output.
    Parts(Vec<Matrix>),
}

impl Matrix {
    /// Holds `parts`, (rows_i, cols) tensors stacked by rows (a fused q|k|v or gate|up
    /// matrix), in `format`, each as [`WeightFormat::held`] says for this engine's kernels.
    /// Parts of different layouts stay apart.
    fn load(parts: Vec<QTensor>, format: WeightFormat) -> Result<Self> {
        let mut loaded = Vec::with_capacity(parts.len());
        for t in parts {
            let (rows, cols) = t.shape().dims2()?;
            loaded.push(match format.held(t.dtype(), cols, QMatrix::supports) {
                Some(q) if q == t.dtype() => Self::Quant(QMatrix::from_ggml(q, &t.data()?, rows, cols)?),
                Some(q) => Self::Quant(QMatrix::from_ggml(q, &requantize(&t, q, rows, cols)?, rows, cols)?),
                None => {
                    Self::F32(Packed::pack(&t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?, rows, cols)?)
                }
            });
        }
        if loaded.len() == 1 {
            return Ok(loaded.remove(0));
        }
        let quant: Vec<QMatrix> =
            loaded.iter().filter_map(|m| if let Self::Quant(q) = m { Some(q.clone()) } else { None }).collect();
        if quant.len() == loaded.len() {
            if let Some(q) = QMatrix::stack(quant) {
                return Ok(Self::Quant(q));
            }
        }
        Ok(Self::Parts(loaded))
    }

    fn rows(&self) -> usize {
        match self {
            Self::F32(p) => p.rows(),
            Self::Quant(q) => q.rows(),
            Self::Parts(parts) => parts.iter().map(Self::rows).sum(),
        }
    }

    /// Bytes held.
    fn size_bytes(&self) -> usize {
        match self {
            Self::F32(p) => p.size_bytes(),
            Self::Quant(q) => q.size_bytes(),
            Self::Parts(parts) => parts.iter().map(Self::size_bytes).sum(),
        }
    }

    /// A matrix of the rows `ids`, in that order: the same blocks for a quantized matrix, the
    /// same values otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] if an id is out of range.
    fn select_rows(&self, ids: &[usize]) -> Result<Matrix> {
        let out_of_range = || Error::setting("output rows", ids.len(), "ids in the vocabulary");
        match self {
            Self::Quant(q) => q.select_rows(ids).map(Self::Quant).ok_or_else(out_of_range),
            _ if ids.iter().any(|&r| r >= self.rows()) => Err(out_of_range()),
            _ => {
                let (mut values, cols) = (Vec::new(), self.cols());
                ids.iter().for_each(|&r| self.row_into(r, &mut values));
                Ok(Self::F32(Packed::pack(&values, ids.len(), cols)?))
            }
        }
    }

    fn cols(&self) -> usize {
        match self {
            Self::F32(p) => p.cols(),
            Self::Quant(q) => q.cols(),
            Self::Parts(parts) => parts.first().map_or(0, Self::cols),
        }
    }

    /// Row `r` as f32 values (an embedding lookup).
    fn row_into(&self, r: usize, out: &mut Vec<f32>) {
        match self {
            Self::F32(p) => p.row_into(r, out),
            Self::Quant(q) => {
                let start = out.len();
                out.resize(start + q.cols(), 0.0);
                q.dequantize_row(r, &mut out[start..]);
            }
            Self::Parts(parts) => {
                let mut r = r;
                for part in parts {
                    if r < part.rows() {
                        return part.row_into(r, out);
                    }
                    r -= part.rows();
                }
            }
        }
    }

    /// `out = x · selfᵀ` for `m` rows of `x`; `out` is resized to m × rows. `acts` is scratch
    /// for quantized activations.
    ///
    /// # Errors
    /// [`Error::TooLarge`] for sizes that overflow; [`Error::InvalidSetting`] for an `x` of
    /// fewer than `m` rows.
    pub fn apply(&self, x: &[f32], m: usize, out: &mut Vec<f32>, acts: &mut QActs) -> Result<()> {
        out.resize(product("product output", &[m, self.rows()])?, 0.0);
        match self {
            Self::F32(p) => matmul_parallel(x, m, p, out, GRAIN),
            Self::Quant(q) => {
                acts.quantize(x, m, q.cols())?;
                qmatmul_parallel(acts, q, out, GRAIN);
            }
            Self::Parts(parts) => {
                // Quantized parts share one quantization of `x` (it depends on the width alone):
                // a Q4_K_M file's q|k and v parts quantized it twice a layer.
                let shared = parts.iter().all(|p| matches!(p, Self::Quant(_)));
                if shared {
                    acts.quantize(x, m, self.cols())?;
                }
                let (rows, mut first, mut part_out) = (self.rows(), 0, Vec::new());
                for part in parts {
                    match part {
                        Self::Quant(q) if shared => {
                            part_out.resize(m * q.rows(), 0.0);
                            qmatmul_parallel(acts, q, &mut part_out, GRAIN);
                        }
                        _ => part.apply(x, m, &mut part_out, acts)?,
                    }
                    let n = part.rows();
                    for (dst, src) in out.chunks_exact_mut(rows).zip(part_out.chunks_exact(n)) {
                        dst[first..first + n].copy_from_slice(src);
                    }
                    first += n;
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Block {
    attn_norm: Vec<f32>,
    qkv: Matrix,
    /// q|k|v biases, one row's worth (Qwen2).
    qkv_bias: Option<Vec<f32>>,
    /// RMSNorm weights of each query head and each key head (Qwen3, Gemma 3).
    qk_norm: Option<[Vec<f32>; 2]>,
    /// RMSNorm weights after attention and after the feed-forward layer (Gemma).
    post_norms: Option<[Vec<f32>; 2]>,
    /// True for a sliding-window layer (Gemma 3).
    sliding: bool,
    o: Matrix,
    ffn_norm: Vec<f32>,
    gate_up: Matrix,
    down: Matrix,
}

/// Weights in the layout the native kernels want.
#[derive(Debug)]
pub struct NativeWeights {
    config: LlamaConfig,
    embed: Matrix,
    blocks: Vec<Block>,
    norm: Vec<f32>,
    /// `None` when the output head is tied to the embeddings.
    lm_head: Option<Matrix>,
    /// RoPE cosines and sines of the global layers, then, for a model with a sliding window,
    /// of the sliding-window ones.
    cos: Vec<Vec<f32>>,
    sin: Vec<Vec<f32>>,
}

impl NativeWeights {
    /// True for the weight formats this engine computes with.
    pub fn supports(format: WeightFormat) -> bool {
        match format {
            WeightFormat::F32 | WeightFormat::Stored | WeightFormat::Compact => true,
            WeightFormat::Quantized(q) => QMatrix::supports(q),
        }
    }

    /// Reads every tensor from `source` (see [`BlockTensors`]).
    ///
    /// # Errors
    /// Missing tensors, shape mismatches.
    pub fn load(source: &mut dyn TensorSource, c: &LlamaConfig, format: WeightFormat) -> Result<Self> {
        let vector = |t: QTensor| -> Result<Vec<f32>> { Ok(t.dequantize(&Device::Cpu)?.to_vec1::<f32>()?) };
        let mut blocks = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let t = BlockTensors::read(source, c, i, &Device::Cpu)?;
            let qkv_bias = map_parts(t.qkv_bias, vector)?.map(|parts| parts.concat());
            let (qk_norm, post_norms) = (map_parts(t.qk_norm, vector)?, map_parts(t.post_norms, vector)?);
            blocks.push(Block {
                attn_norm: vector(t.attn_norm)?,
                qkv: Matrix::load(vec![t.q, t.k, t.v], format)?,
                qkv_bias,
                qk_norm,
                post_norms,
                sliding: c.is_sliding(i),
                o: Matrix::load(vec![t.o], format)?,
                ffn_norm: vector(t.ffn_norm)?,
                gate_up: Matrix::load(vec![t.gate, t.up], format)?,
                down: Matrix::load(vec![t.down], format)?,
            });
        }
        let outer = OuterTensors::read(source, c, &Device::Cpu)?;
        let angles: Vec<Vec<f32>> = [false, true]
            .into_iter()
            .take(1 + usize::from(c.sliding_window.is_some()))
            .map(|l| c.rope_angles(l))
            .collect();
        Ok(Self {
            config: c.clone(),
            embed: Matrix::load(vec![outer.embed], format)?,
            blocks,
            norm: vector(outer.norm)?,
            lm_head: outer.lm_head.map(|t| Matrix::load(vec![t], format)).transpose()?,
            cos: angles.iter().map(|a| a.iter().map(|a| a.cos()).collect()).collect(),
            sin: angles.iter().map(|a| a.iter().map(|a| a.sin()).collect()).collect(),
        })
    }

    /// Bytes of the matrices, which one token's forward pass streams (the embedding is read
    /// one row at a time, so it counts only when it is also the output head).
    pub fn matrix_bytes(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| b.qkv.size_bytes() + b.o.size_bytes() + b.gate_up.size_bytes() + b.down.size_bytes())
            .sum();
        blocks + self.head().size_bytes()
    }

    /// The output head: its own matrix, or the embeddings when tied.
    fn head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// Some rows of the output head, and the vocabulary entries they score: a draft that needs
/// only part of a large vocabulary streams only those rows.
#[derive(Debug)]
struct OutputRows {
    matrix: Matrix,
    ids: Vec<u32>,
}

impl OutputRows {
    /// Full logits rows (`vocab` each) from rows of `short` (`ids.len()` each): −∞ but at
    /// `ids`.
    fn widen(&self, short: &[f32], vocab: usize) -> Vec<f32> {
        let rows = short.len() / self.ids.len().max(1);
        let mut all = vec![f32::NEG_INFINITY; rows * vocab];
        for (row, values) in all.chunks_exact_mut(vocab).zip(short.chunks_exact(self.ids.len())) {
            self.ids.iter().zip(values).for_each(|(&id, &v)| row[id as usize] = v);
        }
        all
    }

    /// Sets every entry of the `vocab`-long rows of `logits` outside `ids` to −∞.
    fn mask(&self, logits: &mut [f32], vocab: usize) {
        let mut keep = vec![false; vocab];
        self.ids.iter().for_each(|&id| keep[id as usize] = true);
        for row in logits.chunks_exact_mut(vocab) {
            row.iter_mut().zip(&keep).filter(|(_, &k)| !k).for_each(|(v, _)| *v = f32::NEG_INFINITY);
        }
    }
}

impl Backend for NativeWeights {
    type Cache = NativeCache;

    fn engine(&self) -> Engine {
        Engine::Native
    }

    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn new_cache(&self, layers: &[usize]) -> Result<NativeCache> {
        Ok(NativeCache::new(layers))
    }

    fn bytes_per_token(&self) -> Option<usize> {
        Some(self.matrix_bytes())
    }

    fn token_matrices(&self, device: &Device) -> Result<TokenMatrices> {
        let f32 = |m: &Matrix| -> Result<Tensor> {
            let mut values = Vec::with_capacity(m.rows() * m.cols());
            (0..m.rows()).for_each(|r| m.row_into(r, &mut values));
            Ok(Tensor::from_vec(values, (m.rows(), m.cols()), device)?)
        };
        Ok(TokenMatrices { embed: f32(&self.embed)?, output: self.lm_head.as_ref().map(f32).transpose()? })
    }

    fn limit_output(&self, cache: &mut NativeCache, ids: Option<&[u32]>) -> Result<bool> {
        // A limit that extends this cache's own appends the new rows in place (see
        // `Llama::keep_outputs`), where selecting them all again would copy the whole head.
        if let (Some(ids), Some(out)) = (ids, cache.output.as_mut().and_then(Arc::get_mut)) {
            if let (Some(new), Matrix::Quant(rows), Matrix::Quant(head)) =
                (ids.strip_prefix(&out.ids[..]), &mut out.matrix, self.head())
            {
                let new_rows: Vec<usize> = new.iter().map(|&id| id as usize).collect();
                if rows.append_rows(head, &new_rows) {
                    out.ids.extend_from_slice(new);
                    return Ok(true);
                }
            }
        }
        cache.output = match ids {
            None => None,
            Some(ids) => {
                let rows: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
                let matrix = self.head().select_rows(&rows)?;
                Some(Arc::new(OutputRows { matrix, ids: ids.to_vec() }))
            }
        };
        Ok(true)
    }

    /// Writing at `pos` overwrites the cache from there: values are cut to `pos` positions
    /// before the new ones are appended, and keys are stored at their positions.
    fn forward_hidden(
        &self,
        cache: &mut NativeCache,
        pos: usize,
        tokens: &[u32],
        rows: usize,
        taps: &[Tap],
    ) -> Result<Pass> {
        self.run_one(cache, pos, tokens, rows, None, taps)
    }

    fn forward_tree(
        &self,
        cache: &mut NativeCache,
        pos: usize,
        tokens: &[u32],
        tree: &TreeShape,
        taps: &[Tap],
    ) -> Result<Pass> {
        self.run_one(cache, pos, tokens, tokens.len(), Some(tree), taps)
    }

    fn forward_batch(&self, caches: &mut [&mut NativeCache], calls: &[BatchCall]) -> Result<Vec<Vec<f32>>> {
        let Some(first) = caches.first_mut() else { return Ok(Vec::new()) };
        // The first cache lends its scratch buffers to the whole pass (and names the blocks,
        // which every cache of a batch shares).
        let mut scratch = std::mem::take(&mut first.scratch);
        let blocks = first.blocks.clone();
        // One limited head serves the pass when every cache has the same; otherwise the full
        // head does, and each limited cache's rows are masked after.
        let same = |o: &Arc<OutputRows>, c: &NativeCache| c.output.as_ref().is_some_and(|p| Arc::ptr_eq(o, p));
        let shared = first.output.clone().filter(|o| caches.iter().all(|c| same(o, c)));
        let mut parts: Vec<Part> = caches
            .iter_mut()
            .zip(calls)
            .map(|(cache, b)| Part { cache: &mut cache.layers, pos: b.pos, tokens: b.tokens, rows: b.rows, tree: None })
            .collect();
        let out = self.run(&self.config, &mut parts, &blocks, &[], shared.as_deref(), &mut scratch);
        caches[0].scratch = scratch;
        let mut logits = out?.0;
        if shared.is_none() {
            for (cache, rows) in caches.iter().zip(&mut logits) {
                if let Some(output) = &cache.output {
                    output.mask(rows, self.config.vocab_size);
                }
            }
        }
        Ok(logits)
    }

    fn keep_path(&self, cache: &mut NativeCache, pos: usize, path: &[usize]) -> Result<()> {
        let c = &self.config;
        let (hd, kv_out) = (c.head_dim, c.num_kv_heads * c.head_dim);
        for kv in &mut cache.layers {
            // `path` rises (ancestors come first), so slot `pos + j` is never a later source.
            for (j, &t) in path.iter().enumerate().filter(|(j, t)| j != *t) {
                let (from, to) = (pos + t, pos + j);
                if (from + 1) * kv_out > kv.values.len() {
                    return Err(Error::setting("kept path", t, "a token of the last tree call"));
                }
                kv.values.copy_within(from * kv_out..(from + 1) * kv_out, to * kv_out);
                for blocks in &mut kv.keys {
                    let key = attention::load_key(blocks, hd, from);
                    attention::store_key(blocks, hd, to, &key);
                }
            }
            kv.values.truncate((pos + path.len()) * kv_out);
        }
        Ok(())
    }
}

/// One sequence's part of a forward pass: its cache layers, where its tokens go, how many
/// logits rows it wants, and its tree (`None` for a chain).
struct Part<'a> {
    cache: &'a mut [LayerCache],
    pos: usize,
    tokens: &'a [u32],
    rows: usize,
    tree: Option<&'a TreeShape>,
}

impl Part<'_> {
    /// The position of this part's token `i`: `pos + i` along a chain, `pos + depth` in a tree.
    fn position(&self, i: usize) -> usize {
        self.pos + self.tree.map_or(i, |t| t.depth(i))
    }
}

/// Each part's logits, and the hidden states the taps asked for over all rows.
type PassOutput = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// The rotary angles of each row for one kind of layer, and the first cache position each row
/// sees.
struct Rotation {
    cos: Vec<f32>,
    sin: Vec<f32>,
    first: Vec<usize>,
}

impl NativeWeights {
    /// One sequence's chain or tree, through [`run`](Self::run).
    fn run_one(
        &self,
        cache: &mut NativeCache,
        pos: usize,
        tokens: &[u32],
        rows: usize,
        tree: Option<&TreeShape>,
        taps: &[Tap],
    ) -> Result<Pass> {
        let NativeCache { blocks, layers, scratch, output } = cache;
        let part = Part { cache: layers, pos, tokens, rows, tree };
        let (mut logits, hidden) = self.run(&self.config, &mut [part], blocks, taps, output.as_deref(), scratch)?;
        Ok(Pass { logits: logits.pop().unwrap_or_default(), hidden })
    }

    /// The forward pass of the rows of every part at once: the matrix products take all rows
    /// together (the weights are streamed once), attention runs per part over its own cache.
    /// Returns each part's logits and the hidden states `taps` asks for over all rows (none
    /// copied when it is empty).
    fn run(
        &self,
        c: &LlamaConfig,
        parts: &mut [Part],
        layers: &[usize],
        taps: &[Tap],
        output: Option<&OutputRows>,
        s: &mut Scratch,
    ) -> Result<PassOutput> {
        let mut hidden = vec![Vec::new(); taps.len()];
        // Each row's part and its index in the part.
        let owner: Vec<(usize, usize)> =
            parts.iter().enumerate().flat_map(|(p, part)| (0..part.tokens.len()).map(move |i| (p, i))).collect();
        s.x.clear();
        for &t in parts.iter().flat_map(|p| p.tokens) {
            self.embed.row_into(t as usize, &mut s.x);
        }
        if c.family.gemma() {
            let scale = (c.hidden_size as f32).sqrt();
            s.x.iter_mut().for_each(|x| *x *= scale);
        }
        let rotations = self.rotations(c, parts, &owner);
        for (slot, &l) in layers.iter().enumerate() {
            tap_residual(taps, slot, &s.x, &mut hidden);
            let b = &self.blocks[l];
            self.attention_block(c, b, slot, parts, &owner, &rotations[usize::from(b.sliding)], s)?;
            self.feed_forward_block(c, b, owner.len(), s)?;
        }
        tap_residual(taps, layers.len(), &s.x, &mut hidden);
        if let Some(k) = taps.iter().position(|&t| t == Tap::Final) {
            hidden[k].resize(owner.len() * c.hidden_size, 0.0);
            attention::rms_norm(&s.x, &self.norm, c.rms_norm_eps as f32, &mut hidden[k]);
        }
        Ok((self.logits(c, parts, output, s)?, hidden))
    }

    /// Per kind of layer (global, then sliding-window where the model has a window): each
    /// row's rotation, and the first position it sees (its last `w`, itself included).
    fn rotations(&self, c: &LlamaConfig, parts: &[Part], owner: &[(usize, usize)]) -> Vec<Rotation> {
        let half = c.head_dim / 2;
        let positions: Vec<usize> = owner.iter().map(|&(p, i)| parts[p].position(i)).collect();
        let angles = |table: &[f32]| -> Vec<f32> {
            positions.iter().flat_map(|&at| &table[at * half..][..half]).copied().collect()
        };
        (self.cos.iter().zip(&self.sin))
            .zip([None, c.sliding_window])
            .map(|((cos, sin), window)| Rotation {
                cos: angles(cos),
                sin: angles(sin),
                first: positions.iter().map(|&at| window.map_or(0, |w| (at + 1).saturating_sub(w))).collect(),
            })
            .collect()
    }

    /// `x += attention(norm(x))` for block `b` (cache layer `slot`): the fused q|k|v product,
    /// each row's keys and values appended to its part's cache, attention per part, the output
    /// product.
    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        c: &LlamaConfig,
        b: &Block,
        slot: usize,
        parts: &mut [Part],
        owner: &[(usize, usize)],
        rot: &Rotation,
        s: &mut Scratch,
    ) -> Result<()> {
        let (n, h, hd) = (owner.len(), c.hidden_size, c.head_dim);
        let (q_out, kv_out) = (c.num_heads * hd, c.num_kv_heads * hd);
        let eps = c.rms_norm_eps as f32;
        s.xb.resize(n * h, 0.0);
        attention::rms_norm(&s.x, &b.attn_norm, eps, &mut s.xb);
        b.qkv.apply(&s.xb, n, &mut s.qkv, &mut s.acts)?;
        if let Some(bias) = &b.qkv_bias {
            s.qkv.chunks_exact_mut(bias.len()).for_each(|row| row.iter_mut().zip(bias).for_each(|(x, b)| *x += b));
        }
        // Split q|k|v rows, rotate q and k, append k and v to each part's cache.
        s.q.clear();
        s.k.clear();
        for (row, &(p, i)) in s.qkv.chunks_exact(q_out + 2 * kv_out).zip(owner) {
            let kv = &mut parts[p].cache[slot];
            if i == 0 {
                kv.values.truncate(parts[p].pos * kv_out);
            }
            s.q.extend_from_slice(&row[..q_out]);
            s.k.extend_from_slice(&row[q_out..q_out + kv_out]);
            kv.values.extend_from_slice(&row[q_out + kv_out..]);
        }
        if let Some([q_norm, k_norm]) = &b.qk_norm {
            // Each head is one row of `head_dim` for the norm.
            for (x, w) in [(&mut s.q, q_norm), (&mut s.k, k_norm)] {
                s.tmp.resize(x.len(), 0.0);
                attention::rms_norm(x, w, eps, &mut s.tmp);
                std::mem::swap(x, &mut s.tmp);
            }
        }
        attention::rope(&mut s.q, c.num_heads, hd, &rot.cos, &rot.sin);
        attention::rope(&mut s.k, c.num_kv_heads, hd, &rot.cos, &rot.sin);
        for (row, &(p, i)) in s.k.chunks_exact(kv_out).zip(owner) {
            let (kv, at) = (&mut parts[p].cache[slot], parts[p].pos + i);
            kv.keys.resize_with(c.num_kv_heads, Default::default);
            for (h, blocks) in kv.keys.iter_mut().enumerate() {
                attention::store_key(blocks, hd, at, &row[h * hd..(h + 1) * hd]);
            }
        }
        let views: Vec<View> = parts
            .iter()
            .map(|p| View { keys: &p.cache[slot].keys, values: &p.cache[slot].values, pos: p.pos, tree: p.tree })
            .collect();
        let shape = Shape { heads: c.num_heads, kv_heads: c.num_kv_heads, head_dim: hd };
        attend(shape, &s.q, &views, owner, &rot.first, &mut s.att);
        b.o.apply(&s.att, n, &mut s.tmp, &mut s.acts)?;
        add_residual(&mut s.x, &s.tmp, b.post_norms.as_ref().map(|p| &p[0][..]), eps, &mut s.xb);
        Ok(())
    }

    /// `x += down(act(gate(norm(x))) · up(norm(x)))` for block `b`, over `n` rows.
    fn feed_forward_block(&self, c: &LlamaConfig, b: &Block, n: usize, s: &mut Scratch) -> Result<()> {
        let (ff, eps) = (c.intermediate_size, c.rms_norm_eps as f32);
        attention::rms_norm(&s.x, &b.ffn_norm, eps, &mut s.xb);
        b.gate_up.apply(&s.xb, n, &mut s.gu, &mut s.acts)?;
        let gate = if c.family.gemma() { attention::gelu_tanh_gate } else { attention::silu_gate };
        gated(gate, &s.gu, n, ff, &mut s.ff);
        b.down.apply(&s.ff, n, &mut s.tmp, &mut s.acts)?;
        add_residual(&mut s.x, &s.tmp, b.post_norms.as_ref().map(|p| &p[1][..]), eps, &mut s.xb);
        Ok(())
    }

    /// The logits of each part's last `rows` rows of the final residual stream `s.x`, in one
    /// product with the output head (or with the rows `output` keeps, the rest −∞).
    fn logits(
        &self,
        c: &LlamaConfig,
        parts: &[Part],
        output: Option<&OutputRows>,
        s: &mut Scratch,
    ) -> Result<Vec<Vec<f32>>> {
        let (h, eps) = (c.hidden_size, c.rms_norm_eps as f32);
        s.tmp.clear();
        let mut end = 0;
        for p in parts {
            end += p.tokens.len();
            s.tmp.extend_from_slice(&s.x[(end - p.rows) * h..end * h]);
        }
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        if rows == 0 {
            return Ok(vec![Vec::new(); parts.len()]);
        }
        s.xb.resize(rows * h, 0.0);
        attention::rms_norm(&s.tmp, &self.norm, eps, &mut s.xb[..rows * h]);
        let mut all = Vec::new();
        match output {
            None => self.head().apply(&s.xb[..rows * h], rows, &mut all, &mut s.acts)?,
            Some(o) => {
                o.matrix.apply(&s.xb[..rows * h], rows, &mut s.tmp, &mut s.acts)?;
                all = o.widen(&s.tmp, c.vocab_size);
            }
        }
        let mut rest = &all[..];
        Ok(parts
            .iter()
            .map(|p| {
                let (mine, after) = rest.split_at(p.rows * c.vocab_size);
                rest = after;
                mine.to_vec()
            })
            .collect())
    }
}

/// Copies the residual stream `x` into the slots of `taps` that ask for it before block `slot`.
fn tap_residual(taps: &[Tap], slot: usize, x: &[f32], hidden: &mut [Vec<f32>]) {
    for (t, h) in taps.iter().zip(hidden) {
        if *t == Tap::Residual(slot) {
            h.clear();
            h.extend_from_slice(x);
        }
    }
}

/// `x += y`, or `x += rms_norm(y)` with a post-norm weight (Gemma); `scratch` holds the norm.
fn add_residual(x: &mut [f32], y: &[f32], post_norm: Option<&[f32]>, eps: f32, scratch: &mut Vec<f32>) {
    let y = match post_norm {
        Some(w) => {
            scratch.resize(y.len(), 0.0);
            attention::rms_norm(y, w, eps, scratch);
            &scratch[..]
        }
        None => y,
    };
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}

/// Values of a row per item of [`gated`]'s job.
const GATE_SPAN: usize = 1024;

/// `out[r][j] = gate(gu[r][j], gu[r][ff + j])` for `n` rows of `gu` (each the gate's `ff`
/// values, then the up projection's), shared out over the thread team in spans of a row
/// (alone, the calling thread spent a twentieth of a five-row forward pass here, the other
/// waiting); `out` is resized to n × ff.
fn gated(gate: fn(&[f32], &[f32], &mut [f32]), gu: &[f32], n: usize, ff: usize, out: &mut Vec<f32>) {
    out.resize(n * ff, 0.0);
    let spans = ff.div_ceil(GATE_SPAN);
    let dst = OutPtr::new(out);
    team().run(n * spans, 1, &|items| {
        for item in items {
            let (r, span) = (item / spans, item % spans);
            let cols = span * GATE_SPAN..((span + 1) * GATE_SPAN).min(ff);
            let row = &gu[r * 2 * ff..(r + 1) * 2 * ff];
            // SAFETY: each (row, span) item owns its own part of `out`.
            let slot = unsafe { dst.slice(r * ff + cols.start, cols.len()) };
            gate(&row[cols.clone()], &row[ff + cols.start..ff + cols.end], slot);
        }
    });
}

/// What one part's attention reads: its cache layer, where its new rows start, its tree.
struct View<'a> {
    keys: &'a [Vec<f32>],
    values: &'a [f32],
    pos: usize,
    tree: Option<&'a TreeShape>,
}

/// Attention of the new rows (row r is row `owner[r].1` of part `owner[r].0`, and sees that
/// part's cache positions from `first[r]` on), shared out over the thread team by (row,
/// key/value head, part of its query heads); `out` is resized to rows × heads·hd. The query
/// heads of a key/value head go together, since they read the same keys and values, in parts
/// of at most `attention::MAX_HEADS`, and in more parts where there would be fewer items than
/// threads (one row of a model with one key/value head); a head's output does not depend on
/// its part.
fn attend(s: Shape, q: &[f32], views: &[View], owner: &[(usize, usize)], first: &[usize], out: &mut Vec<f32>) {
    let (hd, n) = (s.head_dim, owner.len());
    out.resize(n * s.heads * hd, 0.0);
    let dst = OutPtr::new(out);
    let group = s.heads / s.kv_heads;
    let wanted = team().threads().div_ceil(n * s.kv_heads).max(group.div_ceil(attention::MAX_HEADS));
    let per = group.div_ceil(wanted.min(group));
    let parts = group.div_ceil(per);
    team().run(n * s.kv_heads * parts, 1, &|items| {
        let mut scores = Vec::new();
        for item in items {
            let (r, kv_head, part) = (item / (s.kv_heads * parts), item / parts % s.kv_heads, item % parts);
            let h0 = kv_head * group + part * per;
            let heads = per.min(group - part * per);
            let (i, v) = (owner[r].1, &views[owner[r].0]);
            let qv = &q[(r * s.heads + h0) * hd..][..heads * hd];
            // SAFETY: each (row, key/value head, part) item owns its heads' slots of `out`.
            let slot = unsafe { dst.slice((r * s.heads + h0) * hd, heads * hd) };
            let sees = v.tree.map_or(&[][..], |t| t.sees(i));
            attention::heads(s, qv, &v.keys[kv_head], v.values, first[r], v.pos + i + 1, sees, h0, &mut scores, slot);
        }
    });
}

#[derive(Debug, Default)]
struct LayerCache {
    /// Per key/value head, keys in blocks of 16 positions (see `attention::store_key`).
    keys: Vec<Vec<f32>>,
    /// `[pos][kv_head][head_dim]`
    values: Vec<f32>,
}

#[derive(Debug, Default)]
struct Scratch {
    x: Vec<f32>,
    xb: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    att: Vec<f32>,
    tmp: Vec<f32>,
    gu: Vec<f32>,
    ff: Vec<f32>,
    acts: QActs,
}

/// The KV cache of one model instance plus reusable buffers. Rolling back is free: the next
/// forward overwrites from its position on.
#[derive(Debug, Default)]
pub struct NativeCache {
    /// The blocks it runs, and a cache layer for each.
    blocks: Vec<usize>,
    layers: Vec<LayerCache>,
    scratch: Scratch,
    /// The output rows its logits are limited to (see [`Backend::limit_output`]).
    output: Option<Arc<OutputRows>>,
}

impl Cache for NativeCache {
    fn blocks(&self) -> &[usize] {
        &self.blocks
    }
}

impl NativeCache {
    /// An empty cache for an instance running the blocks `blocks`.
    pub fn new(blocks: &[usize]) -> Self {
        let layers = blocks.iter().map(|_| LayerCache::default()).collect();
        Self { blocks: blocks.to_vec(), layers, scratch: Scratch::default(), output: None }
    }

    /// Floats per position in [`save_rows`](Self::save_rows): each block's key and value.
    pub fn row_width(&self, c: &LlamaConfig) -> usize {
        self.layers.len() * 2 * c.num_kv_heads * c.head_dim
    }

    /// The keys and values of positions `from..to` (which earlier calls wrote), position by
    /// position, each block's key (head by head) then its value.
    pub fn save_rows(&self, c: &LlamaConfig, from: usize, to: usize) -> Vec<f32> {
        let (hd, kv_out) = (c.head_dim, c.num_kv_heads * c.head_dim);
        let mut out = Vec::with_capacity(to.saturating_sub(from) * self.row_width(c));
        for pos in from..to {
            for kv in &self.layers {
                for blocks in &kv.keys {
                    out.extend(attention::load_key(blocks, hd, pos));
                }
                out.extend_from_slice(&kv.values[pos * kv_out..(pos + 1) * kv_out]);
            }
        }
        out
    }

    /// Makes `rows` (as [`save_rows`](Self::save_rows) lays them out, a whole number of
    /// positions of [`row_width`](Self::row_width)) the cache's first positions.
    pub fn restore_rows(&mut self, c: &LlamaConfig, rows: &[f32]) {
        let (hd, kv_out) = (c.head_dim, c.num_kv_heads * c.head_dim);
        for kv in &mut self.layers {
            kv.values.clear();
            kv.keys.resize_with(c.num_kv_heads, Default::default);
        }
        for (pos, row) in rows.chunks_exact(self.row_width(c)).enumerate() {
            for (kv, layer) in self.layers.iter_mut().zip(row.chunks_exact(2 * kv_out)) {
                let (keys, values) = layer.split_at(kv_out);
                for (blocks, key) in kv.keys.iter_mut().zip(keys.chunks_exact(hd)) {
                    attention::store_key(blocks, hd, pos, key);
                }
                kv.values.extend_from_slice(values);
            }
        }
    }
}
