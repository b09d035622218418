//! A llama-family model (embeddings, RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or
//! separate output head) that scores any number of new tokens at the current offset in one
//! call and rolls its KV cache back with `truncate`.
//!
//! Two engines compute it, behind one `Backend` (`models::engine`) trait: the native
//! CPU engine ([`super::native`], our own kernels) and a candle engine (any device).
//! [`Engine::Auto`] picks the native one on CPU when it has SIMD kernels for the weight
//! format.

use std::sync::Arc;

use candle_core::Device;

use crate::error::{Error, Result};
use crate::model::{KvRows, Logits, TargetModel, TokenModel};
use crate::models::candle_llama::CandleWeights;
use crate::models::config::LlamaConfig;
use crate::models::dispatch::{Bound, Weights};
use crate::models::engine::{BatchCall, Engine, Pass, Tap, TokenMatrices};
use crate::models::features::{interleave, Features};
use crate::models::format::WeightFormat;
use crate::models::native::NativeWeights;
use crate::models::tensors::TensorSource;
use crate::tree::TreeShape;

/// Everything read-only about a model, shareable between a target and a layer-skip draft.
#[derive(Debug)]
pub struct LlamaWeights {
    backend: Weights,
}

impl LlamaWeights {
    /// Reads the weights named in GGUF style (`token_embd.weight`, `blk.N.attn_q.weight`, …)
    /// from `source`, in `format`, for `engine`. Query and key weights must be in the
    /// interleaved-RoPE row order GGUF uses.
    ///
    /// # Errors
    /// [`Error::MissingTensor`], shape mismatches, [`Error::DeviceUnavailable`] when the native
    /// engine is asked for off the CPU, backend failures.
    pub fn load(
        source: &mut dyn TensorSource,
        config: LlamaConfig,
        format: WeightFormat,
        device: &Device,
        engine: Engine,
    ) -> Result<Self> {
        config.validate()?;
        let native_ok = device.is_cpu() && NativeWeights::supports(format);
        let auto_native = native_ok && (format == WeightFormat::F32 || crate::cpu::level().simd());
        let backend = match engine {
            Engine::Native if !device.is_cpu() => {
                return Err(Error::DeviceUnavailable {
                    device: format!("{device:?}"),
                    reason: "the native engine runs on the CPU".into(),
                })
            }
            Engine::Native if !native_ok => {
                return Err(Error::setting("weight format", format!("{format:?}"), "one the native engine supports"))
            }
            Engine::Native => Weights::Native(Arc::new(NativeWeights::load(source, &config, format)?)),
            Engine::Auto if auto_native => Weights::Native(Arc::new(NativeWeights::load(source, &config, format)?)),
            _ => Weights::Candle(Arc::new(CandleWeights::load(source, &config, format, device)?)),
        };
        Ok(Self { backend })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        self.backend.config()
    }

    /// Bytes of weights one token's forward pass reads (native engine; `None` for candle's).
    pub fn bytes_per_token(&self) -> Option<usize> {
        self.backend.bytes_per_token()
    }

    /// The token embedding and output head as these weights hold them, in f32 on `device`.
    ///
    /// # Errors
    /// Backend failures.
    pub fn token_matrices(&self, device: &Device) -> Result<TokenMatrices> {
        self.backend.token_matrices(device)
    }

    /// The engine that computes the forward pass.
    pub fn engine(&self) -> Engine {
        self.backend.engine()
    }
}

/// What [`Llama::forward_hidden`] returns: the logits rows asked for, and the hidden states
/// the taps named, in their order, each `tokens × hidden_size` row-major.
#[derive(Debug, Clone)]
pub struct TappedPass {
    /// The logits of the last `rows` tokens.
    pub logits: Logits,
    /// One block of hidden states per tap.
    pub hidden: Vec<Vec<f32>>,
}

/// A llama-family model with its own KV cache over shared weights.
///
/// `layers` selects which blocks run: all of them for the model itself, a prefix (or any
/// subset) for a layer-skip self-draft made with [`Llama::with_layers`].
#[derive(Debug)]
pub struct Llama {
    weights: Arc<LlamaWeights>,
    /// This model's cache with its engine's weights; it knows the blocks it runs.
    instance: Bound,
    len: usize,
    /// The last call's tree, while its path may still be kept.
    tree: Option<TreeShape>,
    /// The hidden states recorded for a draft head, and where they are tapped.
    record: Option<(Vec<Tap>, Features)>,
    /// The vocabulary entries the logits are limited to, if they are, in the engine's order,
    /// and sorted (for `keep_outputs` to search).
    output_ids: Option<(Vec<u32>, Vec<u32>)>,
}

impl Llama {
    /// A model running every block of `weights`.
    ///
    /// # Errors
    /// Backend failures allocating the cache.
    pub fn new(weights: Arc<LlamaWeights>) -> Result<Self> {
        let layers = (0..weights.config().num_layers).collect();
        Self::with_layers(weights, layers)
    }

    /// A model running only the blocks in `layers` (then the final norm and the output head),
    /// sharing the weights: the layer-skip self-draft.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for an empty or out-of-range layer list.
    pub fn with_layers(weights: Arc<LlamaWeights>, layers: Vec<usize>) -> Result<Self> {
        let c = weights.config();
        if layers.is_empty() || layers.iter().any(|&l| l >= c.num_layers) {
            return Err(Error::setting(
                "layers",
                format!("{layers:?}"),
                "a non-empty list of block indices below num_layers",
            ));
        }
        let instance = weights.backend.bind(&layers)?;
        Ok(Self { weights, instance, len: 0, tree: None, record: None, output_ids: None })
    }

    /// The shared weights.
    pub fn weights(&self) -> &Arc<LlamaWeights> {
        &self.weights
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        self.weights.config()
    }

    /// The blocks this model runs.
    pub fn layers(&self) -> &[usize] {
        self.instance.blocks()
    }

    /// Limits this model's logits to the vocabulary entries `ids`: every other entry of its
    /// rows is −∞ from now on, and its output head streams only those rows. For a draft with a
    /// large vocabulary whose head is a good part of its cost: drafting stays exact, because
    /// the decoder draws each draft token from the distribution it judges it by, which is then
    /// zero outside `ids` (the target's tokens there are reached through the residual). Returns
    /// whether the engine does it (the native one does; the candle one keeps its full rows).
    /// `None` gives back the whole vocabulary.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for no ids or an id outside the vocabulary.
    pub fn limit_output(&mut self, ids: Option<&[u32]>) -> Result<bool> {
        let vocab = self.config().vocab_size;
        if let Some(ids) = ids.filter(|ids| ids.is_empty() || ids.iter().any(|&id| id as usize >= vocab)) {
            return Err(Error::setting("output rows", ids.len(), "one or more ids below the vocabulary size"));
        }
        let limited = self.instance.limit_output(ids)?;
        self.output_ids = ids.filter(|_| limited).map(|ids| {
            let mut sorted = ids.to_vec();
            sorted.sort_unstable();
            (ids.to_vec(), sorted)
        });
        Ok(limited)
    }

    /// How many vocabulary entries this model's logits are limited to, if they are (see
    /// [`limit_output`](Self::limit_output)).
    pub fn output_limit(&self) -> Option<usize> {
        self.output_ids.as_ref().map(|(ids, _)| ids.len())
    }

    /// The vocabulary entries this model's logits are limited to, if they are.
    pub(crate) fn output_ids(&self) -> Option<&[u32]> {
        self.output_ids.as_ref().map(|(ids, _)| &ids[..])
    }

    /// Adds to the output limit (see [`limit_output`](Self::limit_output)) the ids of `tokens`
    /// it leaves out, so that a draft limited to part of its vocabulary can still propose
    /// what its context holds: a prompt's rare identifier, for one, which code edits copy.
    /// Ids past the vocabulary are left for the forward pass to refuse. The native engine
    /// appends the new ids' rows to the kept ones (a model whose limit is shared in a batch
    /// copies them first). Returns how many ids it added (none without a limit).
    ///
    /// # Errors
    /// Engine failures; the limit is then as before.
    pub fn keep_outputs(&mut self, tokens: &[u32]) -> Result<usize> {
        let vocab = self.config().vocab_size;
        let Some((ids, sorted)) = &self.output_ids else { return Ok(0) };
        let mut new: Vec<u32> =
            tokens.iter().copied().filter(|&t| (t as usize) < vocab && sorted.binary_search(&t).is_err()).collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return Ok(0);
        }
        // The engine appends the new rows to its own when the old ids come first.
        let wider: Vec<u32> = ids.iter().chain(&new).copied().collect();
        self.limit_output(Some(&wider))?;
        Ok(new.len())
    }

    /// From now on, records the hidden states `taps` names for every token the model
    /// processes (their rows concatenated per token, in the order of `taps`), in step with
    /// its roll-backs, for a draft head to read: [`Tap::Final`] for EAGLE-1/2 and Medusa, three
    /// [`Tap::Residual`]s for EAGLE-3. The log starts empty, and so that it stays in step with
    /// the context, this call **empties the model's context** too (`context_len` becomes 0):
    /// feed the context again before a head reads it.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for no taps or a [`Tap::Residual`] past the blocks this model
    /// runs.
    pub fn record_hidden(&mut self, taps: Vec<Tap>) -> Result<Features> {
        self.check_taps(&taps)?;
        if taps.is_empty() {
            return Err(Error::setting("hidden-state taps", "none", "at least one"));
        }
        let features = Features::new(taps.len() * self.weights.config().hidden_size);
        features.truncate(0);
        self.len = 0;
        self.record = Some((taps, features.clone()));
        Ok(features)
    }

    fn check_taps(&self, taps: &[Tap]) -> Result<()> {
        match taps.iter().find(|t| matches!(t, Tap::Residual(i) if *i > self.layers().len())) {
            Some(Tap::Residual(i)) => {
                Err(Error::setting("hidden-state tap", i, "a block index of the model, or the number of blocks"))
            }
            _ => Ok(()),
        }
    }

    /// Scores a tree of tokens after the context in one call: `tokens[0]` follows the context,
    /// and `tokens[i]` (i ≥ 1) follows `tokens[tree parent]`, seeing only its ancestors. Returns
    /// one logits row per token. The context does not grow until [`Llama::keep_tree_path`] keeps a
    /// path (or any other call forgets the tree).
    ///
    /// # Errors
    /// Out-of-vocabulary tokens, a tree that does not fit the tokens or the context, backend
    /// failures.
    pub fn forward_tree(&mut self, tokens: &[u32], tree: &TreeShape) -> Result<Logits> {
        self.tree = None;
        let c = self.weights.config();
        self.check_tokens(tokens)?;
        if tree.len() != tokens.len() {
            return Err(Error::setting("tree size", tree.len(), "one entry per token"));
        }
        // A sliding window shorter than the tree would have to mask a node's own ancestors,
        // which the engines do not do.
        let deepest = (0..tree.len()).map(|i| tree.depth(i)).max().unwrap_or(0);
        if c.sliding_window.is_some_and(|w| deepest + 1 >= w) {
            return Err(Error::setting("tree depth", deepest, "less than the sliding window minus one"));
        }
        let taps = self.record.as_ref().map_or(&[][..], |(t, _)| &t[..]);
        let Pass { logits: data, hidden } = self.instance.forward_tree(self.len, tokens, tree, taps)?;
        if let Some((_, f)) = &self.record {
            f.set_tree(interleave(hidden, tokens.len()));
        }
        self.tree = Some(tree.clone());
        Logits::new(data, c.vocab_size)
    }

    /// Keeps the path `path` of the last tree (indices into its tokens: 0, then each a child
    /// of the one before) as the continuation of the context.
    ///
    /// # Errors
    /// [`Error::NotReady`] without a tree call just before; [`Error::InvalidSetting`] for a
    /// list that is not a root path of that tree.
    pub fn keep_tree_path(&mut self, path: &[usize]) -> Result<()> {
        let tree = self.tree.take().ok_or(Error::NotReady("keep_tree_path needs a forward_tree call just before"))?;
        let is_path = path.iter().enumerate().all(|(j, &t)| {
            t < tree.len() && tree.depth(t) == j && (j == 0 || (path[j - 1] < t && tree.sees(t)[path[j - 1]]))
        });
        if path.is_empty() || !is_path {
            return Err(Error::setting("kept path", format!("{path:?}"), "a path from the tree's root"));
        }
        self.instance.keep_path(self.len, path)?;
        if let Some((_, f)) = &self.record {
            f.keep_path(self.len, path);
        }
        self.len += path.len();
        Ok(())
    }

    /// As [`TargetModel::forward`], also returning the hidden states `taps` names (see [`Tap`]),
    /// in that order, each `tokens.len() × hidden_size` row-major, from the same pass: what
    /// draft heads read. A plain `forward` copies none of them.
    ///
    /// # Errors
    /// As [`TargetModel::forward`]; [`Error::InvalidSetting`] for a [`Tap::Residual`] past the
    /// blocks this model runs.
    pub fn forward_hidden(&mut self, tokens: &[u32], rows: usize, taps: &[Tap]) -> Result<TappedPass> {
        self.check_taps(taps)?;
        let vocab = self.weights.config().vocab_size;
        if !self.start_forward(tokens, rows)? {
            return Ok(TappedPass { logits: Logits::new(Vec::new(), vocab)?, hidden: vec![Vec::new(); taps.len()] });
        }
        let (data, hidden) = self.run(tokens, rows, taps)?;
        Ok(TappedPass { logits: Logits::new(data, vocab)?, hidden })
    }

    /// One forward pass returning the hidden states `taps` names; the states the log records
    /// are tapped in the same pass and written to it. The context grows by `tokens`.
    fn run(&mut self, tokens: &[u32], rows: usize, taps: &[Tap]) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let mut all = taps.to_vec();
        if let Some((t, _)) = &self.record {
            all.extend_from_slice(t);
        }
        // On failure `len` stays, and the next call overwrites whatever this one wrote.
        let Pass { logits: data, mut hidden } = self.instance.forward_hidden(self.len, tokens, rows, &all)?;
        let recorded = hidden.split_off(taps.len());
        if let Some((_, f)) = &self.record {
            f.write(self.len, &interleave(recorded, tokens.len()));
        }
        self.len += tokens.len();
        Ok((data, hidden))
    }

    /// Runs `calls[i]` (tokens, rows) on `models[i]` as [`TargetModel::forward`] would, in one
    /// forward pass that streams the weights once for every row (native engine; the candle
    /// engine runs them one by one). The models must share their weights and blocks. Models
    /// that record hidden states for a draft head run on their own.
    ///
    /// On failure no model's context grows (the next call overwrites what this one wrote).
    ///
    /// # Errors
    /// As [`TargetModel::forward`] for each call; [`Error::InvalidSetting`] when the numbers
    /// of models and calls differ or the models do not share their weights and blocks.
    pub fn forward_batch(models: &mut [&mut Llama], calls: &[(&[u32], usize)]) -> Result<Vec<Logits>> {
        if models.len() != calls.len() {
            return Err(Error::setting("batch calls", calls.len(), "one per model"));
        }
        let Some(first) = models.first() else { return Ok(Vec::new()) };
        let (weights, layers) = (Arc::clone(&first.weights), first.layers().to_vec());
        if models.iter().any(|m| !Arc::ptr_eq(&m.weights, &weights) || m.layers() != layers) {
            return Err(Error::setting(
                "batch",
                "models with other weights",
                "models of the same LlamaWeights and blocks",
            ));
        }
        let mut active = Vec::new();
        for (i, (m, &(tokens, rows))) in models.iter_mut().zip(calls).enumerate() {
            if m.start_forward(tokens, rows)? && m.record.is_none() {
                active.push(i);
            }
        }
        let c = weights.config();
        let mut out = vec![None; models.len()];
        if active.len() > 1 {
            let batch: Vec<BatchCall> = active
                .iter()
                .map(|&i| BatchCall { pos: models[i].len, tokens: calls[i].0, rows: calls[i].1 })
                .collect();
            let mut instances: Vec<&mut Bound> = Vec::with_capacity(active.len());
            for (i, m) in models.iter_mut().enumerate() {
                if active.contains(&i) {
                    instances.push(&mut m.instance);
                }
            }
            let rows = weights.backend.forward_batch(&mut instances, &batch)?;
            for (&i, data) in active.iter().zip(rows) {
                models[i].len += calls[i].0.len();
                out[i] = Some(Logits::new(data, c.vocab_size)?);
            }
        }
        models
            .iter_mut()
            .zip(calls)
            .zip(out)
            .map(|((m, &(tokens, rows)), done)| match done {
                Some(logits) => Ok(logits),
                None => m.forward(tokens, rows),
            })
            .collect()
    }

    /// The checks before a forward call; false when there is nothing to run.
    fn start_forward(&mut self, tokens: &[u32], rows: usize) -> Result<bool> {
        self.tree = None;
        self.check_tokens(tokens)?;
        if rows > tokens.len() {
            return Err(Error::setting("rows", rows, "at most the number of tokens fed"));
        }
        Ok(!tokens.is_empty())
    }

    /// Checks tokens against the vocabulary and the room left in the context.
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let c = self.weights.config();
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::TokenOutOfRange { token, vocab: c.vocab_size });
        }
        if self.len + tokens.len() > c.max_context {
            return Err(Error::ContextTooLong { len: self.len + tokens.len(), max: c.max_context });
        }
        Ok(())
    }
}

impl TokenModel for Llama {
    fn vocab_size(&self) -> usize {
        self.weights.config().vocab_size
    }

    fn context_len(&self) -> usize {
        self.len
    }

    /// Rolls the context back to `len` tokens: the next forward runs at position `len` (see
    /// the roll-back contract of `Backend` (`models::engine`)).
    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::BadTruncate { len: self.len, to: len });
        }
        self.len = len;
        self.tree = None;
        if let Some((_, f)) = &self.record {
            f.truncate(len);
        }
        Ok(())
    }

    /// The keys and values of positions `from..` on the native engine; none while it records
    /// hidden states for a draft head (a restore would leave the head without them).
    fn save_rows(&self, from: usize) -> Option<KvRows> {
        if from >= self.len || self.record.is_some() {
            return None;
        }
        self.instance.save_rows(from, self.len)
    }

    fn restore_rows(&mut self, tokens: &[u32], rows: &KvRows) -> Result<bool> {
        let len = std::mem::take(&mut self.len);
        let checked = self.check_tokens(tokens);
        self.len = len;
        checked?;
        if self.record.is_some() || rows.len() != tokens.len() || !self.instance.restore_rows(rows) {
            return Ok(false);
        }
        self.len = tokens.len();
        self.tree = None;
        Ok(true)
    }
}

impl TargetModel for Llama {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        if !self.start_forward(tokens, rows)? {
            return Logits::new(Vec::new(), self.weights.config().vocab_size);
        }
        let (data, _) = self.run(tokens, rows, &[])?;
        Logits::new(data, self.weights.config().vocab_size)
    }

    fn forward_tree(&mut self, tokens: &[u32], tree: &TreeShape) -> Result<Logits> {
        Llama::forward_tree(self, tokens, tree)
    }

    fn keep_path(&mut self, _tokens: &[u32], path: &[usize]) -> Result<()> {
        Llama::keep_tree_path(self, path)
    }

    fn forward_batch(models: &mut [&mut Self], calls: &[(&[u32], usize)]) -> Result<Vec<Logits>> {
        Llama::forward_batch(models, calls)
    }
}
