//! The shape of a llama-family model, read from GGUF metadata or an HF `config.json`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Sizes and constants of a llama-family model (Llama 2/3 without rope scaling, SmolLM2,
/// TinyLlama, the tinyllamas stories models).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU feed-forward layer.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Longest context the model supports.
    pub max_context: usize,
    /// Token ids that end a generation (end-of-sequence, end-of-turn).
    pub eos_token_ids: Vec<u32>,
}

impl LlamaConfig {
    /// Checks that the sizes fit together.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] naming the first size that does not fit.
    pub fn validate(&self) -> Result<()> {
        let checks: [(&'static str, usize, bool, &'static str); 7] = [
            ("vocab_size", self.vocab_size, self.vocab_size > 0, "at least 1"),
            ("num_layers", self.num_layers, self.num_layers > 0, "at least 1"),
            ("num_heads", self.num_heads, self.num_heads > 0, "at least 1"),
            (
                "num_kv_heads",
                self.num_kv_heads,
                self.num_kv_heads > 0 && self.num_heads.is_multiple_of(self.num_kv_heads),
                "a divisor of num_heads",
            ),
            ("head_dim", self.head_dim, self.head_dim > 0 && self.head_dim.is_multiple_of(2), "a positive even number"),
            ("hidden_size", self.hidden_size, self.hidden_size > 0, "at least 1"),
            ("max_context", self.max_context, self.max_context > 0, "at least 1"),
        ];
        for (name, value, ok, expected) in checks {
            if !ok {
                return Err(Error::setting(name, value, expected));
            }
        }
        Ok(())
    }

    /// Position × frequency for interleaved RoPE, (max_context, head_dim / 2) row-major: the
    /// angles both engines take the sines and cosines of.
    pub fn rope_angles(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        let inv_freq: Vec<f32> =
            (0..half).map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f32 / self.head_dim as f32)).collect();
        (0..self.max_context).flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f)).collect()
    }
}

/// The fields of an HF `config.json` this crate reads.
#[derive(Debug, Deserialize)]
pub(crate) struct HfConfig {
    #[serde(default)]
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_context")]
    max_position_embeddings: usize,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub(crate) tie_word_embeddings: bool,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

fn default_theta() -> f32 {
    10_000.0
}

fn default_eps() -> f64 {
    1e-6
}

fn default_context() -> usize {
    2048
}

impl HfConfig {
    /// Converts to a [`LlamaConfig`].
    ///
    /// # Errors
    /// [`Error::UnsupportedArchitecture`] for another model type or rope scaling.
    pub(crate) fn to_llama(&self) -> Result<LlamaConfig> {
        let kind = self.model_type.as_deref().unwrap_or("llama");
        if kind != "llama" {
            return Err(Error::UnsupportedArchitecture(kind.to_string()));
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(Error::UnsupportedArchitecture("llama with rope_scaling".into()));
        }
        let eos_token_ids = match &self.eos_token_id {
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
            Some(serde_json::Value::Array(ids)) => ids.iter().filter_map(|v| v.as_u64()).map(|id| id as u32).collect(),
            _ => Vec::new(),
        };
        let config = LlamaConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1)),
            rope_theta: self.rope_theta,
            rms_norm_eps: self.rms_norm_eps,
            max_context: self.max_position_embeddings,
            eos_token_ids,
        };
        config.validate()?;
        Ok(config)
    }
}
