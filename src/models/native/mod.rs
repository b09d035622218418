//! The native CPU engine: the llama forward pass on plain `f32` buffers with our own kernels,
//! one persistent thread team, no allocation per token. See `models::llama` for the model
//! type that uses it.

pub(crate) mod attention;
pub(crate) mod llama;
pub mod matmul;
pub mod out_ptr;
pub(crate) mod pool;
pub mod quant;
mod requant;
mod sizes;

pub(crate) use llama::{NativeCache, NativeWeights};
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub use pool::panic_after_chunks;
