//! The native CPU engine: the llama forward pass on plain `f32` buffers with our own kernels,
//! one persistent thread team, no allocation per token. See `models::llama` for the model
//! type that uses it.

pub mod attention;
pub mod llama;
pub mod matmul;
pub mod out_ptr;
pub mod pool;
pub mod quant;

pub use llama::{NativeCache, NativeWeights};
