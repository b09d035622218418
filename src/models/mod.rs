//! The llama-family model and what it is built from, in layers (each imports only those
//! above it in this list):
//!
//! - `config`, `format`, `tensors`: the model's shape, how its weights are held, and the one
//!   place that names its tensors ([`tensors::TensorSource`] is what loaders implement);
//! - `engine`: the `Backend` trait, one forward pass with its own cache;
//! - `native` (our CPU kernels) and `candle_llama` (candle's ops, any device, with `linear`,
//!   `kv_cache` and `block`, the transformer block that draft heads run too): the two
//!   backends;
//! - `dispatch`: either engine's weights, and a model's cache bound to them, as one type each;
//! - `llama`: [`Llama`], a model instance over shared [`LlamaWeights`] and one backend.

pub(crate) mod block;
pub(crate) mod candle_llama;
pub(crate) mod config;
pub(crate) mod dispatch;
pub(crate) mod engine;
pub(crate) mod features;
pub(crate) mod format;
pub(crate) mod kv_cache;
pub(crate) mod linear;
pub(crate) mod llama;
// The kernels are public only for the benches and the soundness tests (feature
// `bench-internals`).
#[cfg(feature = "bench-internals")]
pub mod native;
#[cfg(not(feature = "bench-internals"))]
pub(crate) mod native;
pub(crate) mod tensors;

pub use config::{Family, LlamaConfig};
pub use engine::{Engine, Tap, TokenMatrices};
pub use features::Features;
pub use format::WeightFormat;
pub use linear::Linear;
pub use llama::{Llama, LlamaWeights, TappedPass};
