//! The engine layer: one trait for "a llama-family forward pass with its own cache",
//! implemented by the native CPU engine ([`super::native`]) and by the candle engine
//! ([`super::candle_llama`]).

use std::fmt::Debug;

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::models::config::LlamaConfig;
use crate::tree::TreeShape;

/// Which implementation computes the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Engine {
    /// Native on CPU where it has SIMD kernels for the weight format, candle otherwise.
    /// f32 weights always run natively on the CPU (the portable f32 kernel vectorizes for any
    /// target); quantized weights need AVX2 (see [`crate::cpu`]): on other CPUs, aarch64 among
    /// them, candle's quantized kernels (which have NEON paths) are faster than our portable
    /// reference.
    #[default]
    Auto,
    /// The native CPU engine.
    Native,
    /// candle's ops, on any device.
    Candle,
}

/// A model's token embedding and output head, `(vocab, hidden)` each, in f32
/// (`Backend::token_matrices`).
#[derive(Debug, Clone)]
pub struct TokenMatrices {
    /// The token embedding (unscaled, for the models that scale it at lookup).
    pub embed: Tensor,
    /// The output head, `None` when it is tied to the embedding.
    pub output: Option<Tensor>,
}

/// A llama-family forward pass over weights the backend owns (read-only, shared by every model
/// instance), with a KV cache per instance. A backend is built for one configuration, which it
/// keeps ([`config`](Backend::config)); its calls take only what changes from call to call.
///
/// Roll-back contract, the same for every backend: [`forward`](Backend::forward) at `pos`
/// attends to exactly the first `pos` positions of the cache (which earlier calls wrote) and
/// overwrites whatever the cache held from `pos` on. Rolling a model back to `len` tokens is
/// therefore nothing but passing `pos = len` next time, and a call that failed part-way leaves
/// nothing that a later call at the same `pos` would see.
///
/// A tree of drafts is scored by [`forward_tree`](Backend::forward_tree) (positions by depth,
/// a mask from the parent list) and its accepted path kept by
/// [`keep_path`](Backend::keep_path); [`forward_hidden`](Backend::forward_hidden) also hands
/// out hidden states ([`Tap`]) for draft heads; [`forward_batch`](Backend::forward_batch)
/// scores several sequences, each with its own cache, in one pass.
pub(crate) trait Backend: Debug + Send + Sync + 'static {
    /// The KV cache of one model instance.
    type Cache: Cache;

    /// Which engine this is.
    fn engine(&self) -> Engine;

    /// The configuration the weights were built for.
    fn config(&self) -> &LlamaConfig;

    /// An empty cache for an instance that runs the blocks `layers` (one cache layer each, in
    /// order): every call on the cache runs those blocks.
    ///
    /// # Errors
    /// Backend failures allocating it.
    fn new_cache(&self, layers: &[usize]) -> Result<Self::Cache>;

    /// Runs `tokens` at positions `pos..pos + tokens.len()` through the cache's blocks,
    /// writing their keys and values into `cache`, and returns the
    /// logits of the last `rows` tokens, row-major. The caller checks the tokens, `rows <=
    /// tokens.len()` and `pos + tokens.len() <= max_context`. It is
    /// [`forward_hidden`](Backend::forward_hidden) with no taps.
    ///
    /// # Errors
    /// Backend failures.
    fn forward(&self, cache: &mut Self::Cache, pos: usize, tokens: &[u32], rows: usize) -> Result<Vec<f32>> {
        Ok(self.forward_hidden(cache, pos, tokens, rows, &[])?.logits)
    }

    /// As [`forward`](Backend::forward), also returning the hidden states `taps` names, in
    /// that order, each `tokens.len() × hidden_size` row-major: what draft heads (EAGLE,
    /// Medusa) read, from the same pass. [`forward`](Backend::forward) copies none of them.
    ///
    /// # Errors
    /// Backend failures.
    fn forward_hidden(
        &self,
        cache: &mut Self::Cache,
        pos: usize,
        tokens: &[u32],
        rows: usize,
        taps: &[Tap],
    ) -> Result<Pass>;

    /// Scores a tree in one call: token 0 (the pending token) at position `pos`, token `i` at
    /// `pos + tree.depth(i)`, each attending to the cache's first `pos` positions and to its own
    /// ancestors in the tree (itself included). Token `i`'s keys and values go to cache slot
    /// `pos + i`; one logits row per token comes back, with the hidden states `taps` names (as
    /// in [`forward_hidden`](Backend::forward_hidden)). The caller checks, beside what
    /// [`forward`](Backend::forward) needs, that the tree has one entry per token.
    ///
    /// # Errors
    /// Backend failures.
    fn forward_tree(
        &self,
        cache: &mut Self::Cache,
        pos: usize,
        tokens: &[u32],
        tree: &TreeShape,
        taps: &[Tap],
    ) -> Result<Pass>;

    /// After a tree call at `pos`: moves the keys and values of the tokens `path` (indices into
    /// that call's tokens, root first, each the parent of the next) to slots `pos`, `pos + 1`,
    /// …, so that the cache holds the accepted path as if it had been fed as a chain. Their
    /// positions already are `pos + depth`, so nothing is recomputed.
    ///
    /// # Errors
    /// Backend failures.
    fn keep_path(&self, cache: &mut Self::Cache, pos: usize, path: &[usize]) -> Result<()>;

    /// Runs several sequences at once: `calls[i]` on `caches[i]`, as
    /// [`forward`](Backend::forward) would, returning each call's logits. A backend that can
    /// streams its weights once for all the calls' rows; the default runs them one by one. The
    /// caller checks each call as for `forward`, that there is one cache per call, and that
    /// the caches run the same blocks.
    ///
    /// # Errors
    /// Backend failures; caches that the calls before the failure wrote follow the roll-back
    /// contract like any other.
    fn forward_batch(&self, caches: &mut [&mut Self::Cache], calls: &[BatchCall]) -> Result<Vec<Vec<f32>>> {
        caches.iter_mut().zip(calls).map(|(cache, b)| self.forward(cache, b.pos, b.tokens, b.rows)).collect()
    }

    /// Bytes of weights one token's forward pass streams, where the backend knows it.
    fn bytes_per_token(&self) -> Option<usize> {
        None
    }

    /// The token embedding and output head as the weights hold them, in f32 on `device`:
    /// what a draft head borrows from its target.
    ///
    /// # Errors
    /// Backend failures.
    fn token_matrices(&self, device: &Device) -> Result<TokenMatrices>;

    /// Limits the logits of the calls on `cache` to the vocabulary entries `ids` (each below
    /// the vocabulary size, checked by the caller): every other entry of a row is −∞, and the
    /// output head streams only those rows. `None` gives back the whole vocabulary. Returns
    /// whether the backend does it; the default does not, and leaves the cache as it was.
    ///
    /// # Errors
    /// Backend failures.
    fn limit_output(&self, _cache: &mut Self::Cache, _ids: Option<&[u32]>) -> Result<bool> {
        Ok(false)
    }
}

/// The KV cache of one model instance: one cache layer for each block it runs.
pub(crate) trait Cache: Debug + Send + 'static {
    /// The blocks this cache's instance runs, in order (see [`Backend::new_cache`]).
    fn blocks(&self) -> &[usize];
}

/// What a forward pass returns: the logits rows (row-major) and the hidden states its taps
/// named, in their order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pass {
    /// The logits of the rows asked for, row-major.
    pub logits: Vec<f32>,
    /// One `tokens × hidden_size` block per tap, row-major.
    pub hidden: Vec<Vec<f32>>,
}

/// One sequence's part of a [`Backend::forward_batch`] call: `tokens` at positions
/// `pos..pos + tokens.len()`, logits for the last `rows` of them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchCall<'a> {
    /// Where the tokens go in the sequence's cache.
    pub pos: usize,
    /// The tokens.
    pub tokens: &'a [u32],
    /// How many logits rows come back.
    pub rows: usize,
}

/// A hidden state a forward pass can hand out beside its logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tap {
    /// The residual stream entering the model's `i`-th block (of the blocks it runs); `i`
    /// equal to the number of blocks: the last block's output, before the final norm. EAGLE-3
    /// reads three of these.
    Residual(usize),
    /// The last block's output after the final norm: what the output head reads, and what
    /// EAGLE-1/2 and Medusa heads take.
    Final,
}
