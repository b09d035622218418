//! A llama-family model (embeddings, RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or
//! separate output head) that scores any number of new tokens at the current offset in one
//! call and rolls its KV cache back with `truncate`.
//!
//! Two engines compute it: the native CPU engine ([`crate::native`], our own kernels) and a
//! candle engine (any device). [`Engine::Auto`] picks the native one on CPU when it has SIMD
//! kernels for the weight format.

use std::sync::Arc;

use candle_core::Device;

use crate::error::{Error, Result};
use crate::loading::TensorSource;
use crate::model::{Logits, TargetModel};
use crate::models::candle_llama::CandleWeights;
use crate::models::config::LlamaConfig;
use crate::models::kv_cache::KvCache;
use crate::models::linear::WeightFormat;
use crate::native::{NativeCache, NativeWeights};

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

// One value per model, built once: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Weights {
    Native(NativeWeights),
    Candle(CandleWeights),
}

/// Everything read-only about a model, shareable between a target and a layer-skip draft.
#[derive(Debug)]
pub struct LlamaWeights {
    config: LlamaConfig,
    weights: Weights,
}

impl LlamaWeights {
    /// Reads the weights named in GGUF style (`token_embd.weight`, `blk.N.attn_q.weight`, …)
    /// from `source`, in `format`, for `engine`. Query and key weights must be in the
    /// interleaved-RoPE row order GGUF uses.
    ///
    /// # Errors
    /// [`Error::MissingTensor`], shape mismatches, [`Error::DeviceUnavailable`] when the native
    /// engine is asked for off the CPU, backend failures.
    pub fn load(source: &mut dyn TensorSource, config: LlamaConfig, format: WeightFormat, device: &Device, engine: Engine) -> Result<Self> {
        config.validate()?;
        let native_ok = device.is_cpu() && NativeWeights::supports(format);
        let auto_native = native_ok && (format == WeightFormat::F32 || crate::cpu::level().simd());
        let weights = match engine {
            Engine::Native if !device.is_cpu() => {
                return Err(Error::DeviceUnavailable { device: format!("{device:?}"), reason: "the native engine runs on the CPU".into() })
            }
            Engine::Native if !native_ok => return Err(Error::setting("weight format", format!("{format:?}"), "one the native engine supports")),
            Engine::Native => Weights::Native(NativeWeights::load(source, &config, format)?),
            Engine::Auto if auto_native => Weights::Native(NativeWeights::load(source, &config, format)?),
            _ => Weights::Candle(CandleWeights::load(source, &config, format, device)?),
        };
        Ok(Self { config, weights })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Bytes of weights one token's forward pass reads (native engine; `None` for candle's).
    pub fn bytes_per_token(&self) -> Option<usize> {
        match &self.weights {
            Weights::Native(w) => Some(w.matrix_bytes()),
            Weights::Candle(_) => None,
        }
    }

    /// The engine that computes the forward pass.
    pub fn engine(&self) -> Engine {
        match self.weights {
            Weights::Native(_) => Engine::Native,
            Weights::Candle(_) => Engine::Candle,
        }
    }
}

pub(crate) fn check_shape(name: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got != want {
        return Err(Error::Load { path: name.into(), reason: format!("tensor `{name}` has shape {got:?}, expected {want:?}") });
    }
    Ok(())
}

/// Position × frequency for interleaved RoPE, (max_context, head_dim / 2) row-major.
pub(crate) fn rope_angles(c: &LlamaConfig) -> Vec<f32> {
    let half = c.head_dim / 2;
    let inv_freq: Vec<f32> = (0..half).map(|i| 1.0 / c.rope_theta.powf(2.0 * i as f32 / c.head_dim as f32)).collect();
    (0..c.max_context).flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f)).collect()
}

// One value per model, built once: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum State {
    Native(NativeCache),
    Candle(Vec<KvCache>),
}

/// A llama-family model with its own KV cache over shared weights.
///
/// `layers` selects which blocks run: all of them for the model itself, a prefix (or any
/// subset) for a layer-skip self-draft made with [`Llama::with_layers`].
#[derive(Debug)]
pub struct Llama {
    weights: Arc<LlamaWeights>,
    layers: Vec<usize>,
    state: State,
    len: usize,
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
        let c = &weights.config;
        if layers.is_empty() || layers.iter().any(|&l| l >= c.num_layers) {
            return Err(Error::setting("layers", format!("{layers:?}"), "a non-empty list of block indices below num_layers"));
        }
        let state = match &weights.weights {
            Weights::Native(_) => State::Native(NativeCache::new(layers.len())),
            Weights::Candle(w) => State::Candle(w.caches(c, layers.len())?),
        };
        Ok(Self { weights, layers, state, len: 0 })
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

    /// Tokens in the context (the same as [`TargetModel::context_len`], callable without
    /// naming the trait when both model traits are in scope).
    pub fn context_len(&self) -> usize {
        self.len
    }

    /// Rolls the context back to `len` tokens ([`TargetModel::truncate`]).
    ///
    /// # Errors
    /// [`Error::BadTruncate`] when `len` exceeds the context.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::BadTruncate { len: self.len, to: len });
        }
        self.len = len;
        if let State::Candle(caches) = &mut self.state {
            caches.iter_mut().for_each(|c| c.truncate(len));
        }
        Ok(())
    }
}

impl TargetModel for Llama {
    fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }

    fn context_len(&self) -> usize {
        self.len
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
        if self.len + tokens.len() > c.max_context {
            return Err(Error::ContextTooLong { len: self.len + tokens.len(), max: c.max_context });
        }
        if tokens.is_empty() {
            return Logits::new(Vec::new(), c.vocab_size);
        }
        let data = match (&weights.weights, &mut self.state) {
            (Weights::Native(w), State::Native(cache)) => w.forward(c, cache, &self.layers, self.len, tokens, rows)?,
            (Weights::Candle(w), State::Candle(caches)) => {
                let before = self.len;
                let out = w.forward(c, caches, &self.layers, tokens, rows);
                if out.is_err() {
                    // A failure part-way leaves some layers longer than others: undo them all.
                    caches.iter_mut().for_each(|k| k.truncate(before));
                }
                out?
            }
            _ => return Err(Error::NotReady("model state does not match its engine")),
        };
        self.len += tokens.len();
        Logits::new(data, c.vocab_size)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        Llama::truncate(self, len)
    }
}
