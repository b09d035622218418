//! How a model's matrix weights are held in memory: the choice both engines read at load.

use candle_core::quantized::GgmlDType;

use crate::error::{Error, Result};

/// How a model's matrix weights are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// Dequantized to f32 (the exact target).
    F32,
    /// As stored in the file (quantized GGUF weights stay quantized; the native engine holds
    /// block types it has no kernel for, such as Q3_K or IQ4_XS, as Q8_0).
    Stored,
    /// Re-quantized at load to this GGUF block type (a quantized self-draft).
    Quantized(GgmlDType),
}

impl std::str::FromStr for WeightFormat {
    type Err = Error;

    /// `f32`, `stored`, or a block type: `q8_0`, `q4_0`, `q4_1`, `q4k`, `q5k`, `q6k`, `q8k`.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" => Self::F32,
            "stored" => Self::Stored,
            "q8_0" => Self::Quantized(GgmlDType::Q8_0),
            "q4_0" => Self::Quantized(GgmlDType::Q4_0),
            "q4_1" => Self::Quantized(GgmlDType::Q4_1),
            "q5_0" => Self::Quantized(GgmlDType::Q5_0),
            "q4k" | "q4_k" => Self::Quantized(GgmlDType::Q4K),
            "q5k" | "q5_k" => Self::Quantized(GgmlDType::Q5K),
            "q6k" | "q6_k" => Self::Quantized(GgmlDType::Q6K),
            "q8k" | "q8_k" => Self::Quantized(GgmlDType::Q8K),
            _ => {
                return Err(Error::setting(
                    "weight format",
                    s,
                    "f32, stored, q8_0, q4_0, q4_1, q5_0, q4k, q5k, q6k or q8k",
                ))
            }
        })
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::F32 => write!(f, "f32"),
            Self::Stored => write!(f, "stored"),
            Self::Quantized(t) => write!(f, "{}", format!("{t:?}").to_ascii_lowercase()),
        }
    }
}
