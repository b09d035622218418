//! The shape of a llama-family model, read from GGUF metadata or an HF `config.json`.

use serde::Serialize;

use crate::error::{Error, Result};

/// Which member of the llama family a model is: the same block with small additions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Family {
    /// Llama 2/3 without rope scaling, SmolLM2, TinyLlama, the tinyllamas stories models.
    #[default]
    Llama,
    /// Qwen2 and Qwen2.5: biases on the query, key and value products.
    Qwen2,
    /// Qwen3: an RMSNorm over each query and key head before RoPE, no biases.
    Qwen3,
    /// Gemma 3: embeddings scaled by √hidden, RMSNorm weights used as (1 + w) (GGUF files
    /// store the sum), norms after attention and after the feed-forward layer too, a GELU-tanh
    /// gate, q/k norms, and sliding-window layers (with their own RoPE base) between global ones.
    Gemma3,
    /// Mistral (HF folders; llama.cpp writes Mistral GGUF files as `llama`): the llama block,
    /// with a sliding window on every layer where the config sets one.
    Mistral,
    /// Phi-3 (GGUF): the llama block with q|k|v and gate|up stored as one matrix each.
    Phi3,
}

impl Family {
    /// The family named by a GGUF `general.architecture` or an HF `model_type`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            "gemma3" | "gemma3_text" => Some(Self::Gemma3),
            "mistral" => Some(Self::Mistral),
            "phi3" => Some(Self::Phi3),
            _ => None,
        }
    }

    /// The name GGUF files use, and the prefix of their metadata keys.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3",
            Self::Mistral => "mistral",
            Self::Phi3 => "phi3",
        }
    }

    /// True when the files store query and key rows in halves order (each head's first
    /// rotary elements, then its second ones: RoPE "NeoX" style). GGUF llama files are
    /// stored interleaved already; Qwen's are not, in GGUF as in HF files.
    pub fn gguf_rows_in_halves(self) -> bool {
        matches!(self, Self::Qwen2 | Self::Qwen3 | Self::Gemma3 | Self::Phi3)
    }

    /// True when q|k|v and gate|up are stored as one matrix each (Phi-3).
    pub fn fused(self) -> bool {
        self == Self::Phi3
    }

    /// True when the query, key and value products have biases.
    pub fn qkv_bias(self) -> bool {
        self == Self::Qwen2
    }

    /// True when each query and key head is RMS-normalized before RoPE.
    pub fn qk_norm(self) -> bool {
        matches!(self, Self::Qwen3 | Self::Gemma3)
    }

    /// True for Gemma's block: embeddings scaled by √hidden, a norm after attention and after
    /// the feed-forward layer, a GELU-tanh gate, RMSNorm weights as (1 + w).
    pub fn gemma(self) -> bool {
        self == Self::Gemma3
    }
}

/// Sizes and constants of a llama-family model (see [`Family`] for the members).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaConfig {
    /// Which member of the family.
    pub family: Family,
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
    /// Positions a sliding-window layer sees (its own included), for the families that have
    /// such layers (Gemma 3).
    pub sliding_window: Option<usize>,
    /// With a sliding window: every this many layers, one is global (layers `n − 1`, `2n − 1`,
    /// …); 0: every layer slides.
    pub sliding_pattern: usize,
    /// The RoPE base of sliding-window layers (Gemma's differs from `rope_theta`).
    pub rope_local_theta: f32,
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
        match self.sliding_window {
            Some(0) => Err(Error::setting("sliding_window", 0, "at least 1 position")),
            _ => Ok(()),
        }
    }

    /// True when layer `layer` attends through a sliding window.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_window.is_some()
            && (self.sliding_pattern == 0 || !(layer + 1).is_multiple_of(self.sliding_pattern))
    }

    /// Position × frequency for interleaved RoPE, (max_context, head_dim / 2) row-major: the
    /// angles both engines take the sines and cosines of, for the global layers (`local`
    /// false) or the sliding-window ones.
    pub fn rope_angles(&self, local: bool) -> Vec<f32> {
        let theta = if local { self.rope_local_theta } else { self.rope_theta };
        rope_angles(theta, self.head_dim, 0..self.max_context)
    }
}

/// Position × frequency (base `theta`) of each of `positions`, `head_dim / 2` a position: the
/// angles of RoPE, for models and draft heads alike.
pub(crate) fn rope_angles(theta: f32, head_dim: usize, positions: impl Iterator<Item = usize>) -> Vec<f32> {
    let inv_freq: Vec<f32> = (0..head_dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32)).collect();
    positions.flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f)).collect()
}

/// The fields of an HF `config.json` this crate reads (for the loaders).
#[cfg(feature = "llama")]
#[derive(Debug, serde::Deserialize)]
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
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    sliding_window_pattern: Option<usize>,
    #[serde(default)]
    rope_local_base_freq: Option<f32>,
    #[serde(default)]
    query_pre_attn_scalar: Option<usize>,
    #[serde(default)]
    final_logit_softcapping: Option<f64>,
    #[serde(default)]
    attn_logit_softcapping: Option<f64>,
}

#[cfg(feature = "llama")]
fn default_theta() -> f32 {
    10_000.0
}

#[cfg(feature = "llama")]
fn default_eps() -> f64 {
    1e-6
}

#[cfg(feature = "llama")]
fn default_context() -> usize {
    2048
}

#[cfg(feature = "llama")]
impl HfConfig {
    /// True when the output head is the embedding matrix (Gemma's default).
    pub(crate) fn tied(&self) -> bool {
        self.tie_word_embeddings.unwrap_or(self.model_type.as_deref().is_some_and(|k| k.starts_with("gemma")))
    }

    /// Converts to a [`LlamaConfig`].
    ///
    /// # Errors
    /// [`Error::UnsupportedArchitecture`] for a model type outside [`Family`], rope scaling, a
    /// sliding window, or biases where the family has none.
    pub(crate) fn to_llama(&self) -> Result<LlamaConfig> {
        let kind = self.model_type.as_deref().unwrap_or("llama");
        let family = Family::from_name(kind).ok_or_else(|| Error::UnsupportedArchitecture(kind.to_string()))?;
        let unsupported = [
            (self.attention_bias && !family.qkv_bias(), "attention_bias"),
            (family.fused(), "weights from an HF folder (its GGUF files load)"),
            (self.use_sliding_window, "use_sliding_window"),
            (self.final_logit_softcapping.is_some() || self.attn_logit_softcapping.is_some(), "logit soft-capping"),
            (self.query_pre_attn_scalar.is_some_and(|s| Some(s) != self.head_dim), "query_pre_attn_scalar ≠ head_dim"),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(bad, _)| *bad) {
            return Err(Error::UnsupportedArchitecture(format!("{kind} with {what}")));
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
            family,
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
            // Qwen2's `sliding_window` applies only with `use_sliding_window`, refused above.
            sliding_window: self.sliding_window.filter(|_| matches!(family, Family::Gemma3 | Family::Mistral)),
            sliding_pattern: if family.gemma() { self.sliding_window_pattern.unwrap_or(6) } else { 0 },
            rope_local_theta: match family.gemma() {
                true => self.rope_local_base_freq.unwrap_or(10_000.0),
                false => self.rope_theta,
            },
        };
        config.validate()?;
        Ok(config)
    }
}
