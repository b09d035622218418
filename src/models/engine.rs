//! The engine layer: one trait for "a llama-family forward pass with its own cache",
//! implemented by the native CPU engine ([`super::native`]) and by the candle engine
//! ([`super::candle_llama`]).

use std::fmt::Debug;
use std::sync::Arc;

use crate::error::Result;
use crate::models::config::LlamaConfig;

/// Which implementation computes the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

/// A llama-family forward pass over weights the backend owns (read-only, shared by every model
/// instance), with a KV cache per instance.
///
/// Roll-back contract, the same for every backend: [`forward`](Backend::forward) at `pos`
/// attends to exactly the first `pos` positions of the cache (which earlier calls wrote) and
/// overwrites whatever the cache held from `pos` on. Rolling a model back to `len` tokens is
/// therefore nothing but passing `pos = len` next time, and a call that failed part-way leaves
/// nothing that a later call at the same `pos` would see.
///
/// Tree verification and batches will add methods beside `forward` (positions with a parent
/// list as the attention mask; several caches in one call); a chain stays this method.
pub trait Backend: Debug + Send + Sync + 'static {
    /// The KV cache of one model instance.
    type Cache: Debug + Send;

    /// Which engine this is.
    fn engine(&self) -> Engine;

    /// An empty cache for `layers` blocks.
    ///
    /// # Errors
    /// Backend failures allocating it.
    fn new_cache(&self, c: &LlamaConfig, layers: usize) -> Result<Self::Cache>;

    /// Runs `tokens` at positions `pos..pos + tokens.len()` through the blocks `layers` (one
    /// cache layer each, in order), writing their keys and values into `cache`, and returns the
    /// logits of the last `rows` tokens, row-major. The caller checks the tokens, `rows <=
    /// tokens.len()` and `pos + tokens.len() <= c.max_context`.
    ///
    /// # Errors
    /// Backend failures.
    fn forward(&self, c: &LlamaConfig, cache: &mut Self::Cache, layers: &[usize], pos: usize, tokens: &[u32], rows: usize) -> Result<Vec<f32>>;

    /// Bytes of weights one token's forward pass streams, where the backend knows it.
    fn bytes_per_token(&self) -> Option<usize> {
        None
    }
}

/// A backend with its concrete type erased, so that a model holds any of them.
pub(crate) trait AnyBackend: Debug + Send + Sync {
    /// Which engine this is.
    fn engine(&self) -> Engine;

    /// A model instance: this backend with an empty cache for `layers` blocks.
    fn instance(self: Arc<Self>, c: &LlamaConfig, layers: usize) -> Result<Box<dyn Instance>>;

    /// As [`Backend::bytes_per_token`].
    fn bytes_per_token(&self) -> Option<usize>;
}

impl<B: Backend> AnyBackend for B {
    fn engine(&self) -> Engine {
        Backend::engine(self)
    }

    fn instance(self: Arc<Self>, c: &LlamaConfig, layers: usize) -> Result<Box<dyn Instance>> {
        let cache = self.new_cache(c, layers)?;
        Ok(Box::new(Bound { backend: self, cache }))
    }

    fn bytes_per_token(&self) -> Option<usize> {
        Backend::bytes_per_token(self)
    }
}

/// A backend bound to one instance's cache.
pub(crate) trait Instance: Debug + Send {
    /// As [`Backend::forward`] on the bound cache.
    fn forward(&mut self, c: &LlamaConfig, layers: &[usize], pos: usize, tokens: &[u32], rows: usize) -> Result<Vec<f32>>;
}

#[derive(Debug)]
struct Bound<B: Backend> {
    backend: Arc<B>,
    cache: B::Cache,
}

impl<B: Backend> Instance for Bound<B> {
    fn forward(&mut self, c: &LlamaConfig, layers: &[usize], pos: usize, tokens: &[u32], rows: usize) -> Result<Vec<f32>> {
        self.backend.forward(c, &mut self.cache, layers, pos, tokens, rows)
    }
}
