//! Model implementations.

pub mod candle_llama;
pub mod config;
pub mod kv_cache;
pub mod linear;
pub mod llama;

pub use config::LlamaConfig;
pub use linear::WeightFormat;
pub use llama::{Engine, Llama, LlamaWeights};
