//! How a model's matrix weights are held in memory: the choice both engines read at load.

use candle_core::quantized::GgmlDType;

use crate::error::{Error, Result};

/// How a model's matrix weights are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeightFormat {
    /// Dequantized to f32 (the exact target).
    F32,
    /// As stored in the file (quantized GGUF weights stay quantized; the native engine holds
    /// block types it has no kernel for, such as Q3_K or IQ4_XS, as Q8_0).
    Stored,
    /// Re-quantized at load to this GGUF block type (a quantized self-draft).
    Quantized(GgmlDType),
    /// At most Q4_1's 5 bits a weight, a draft's default: a matrix stored in a type as narrow
    /// (Q4_0, Q4_1, Q4_K) stays as stored, any other (Q5_x, Q6_K, Q8_0, f16, f32, and types
    /// the engine has no kernel for) is re-quantized to Q4_1. A draft's weights only change
    /// which tokens it proposes, never what decoding emits, and a draft that streams fewer
    /// bytes costs less a token.
    Compact,
}

/// Bits a weight of a GGUF type takes, its block's scales included.
fn bits_per_weight(t: GgmlDType) -> f64 {
    (8 * t.type_size()) as f64 / t.block_size() as f64
}

impl WeightFormat {
    /// The block type an engine holds a weight in under this format (`None`: f32), for a
    /// weight stored as `stored` with rows of `cols` values, on an engine whose kernels take
    /// the block types `supported` accepts. Both engines decide by it.
    /// - Dense weights (f32, f16, bf16) are held in f32 as stored.
    /// - Stored blocks of a type the engine lacks (Q2_K, Q3_K, IQ… on the native engine) are
    ///   re-quantized to Q8_0, whose step is finer than theirs, rather than widened to f32
    ///   (four times the bytes per token).
    /// - K-quants need rows of whole 256-value super-blocks; narrower rows take their 32-value
    ///   cousins (as llama.cpp falls back for such tensors), other types Q8_0; a row that no
    ///   block divides stays f32.
    pub(crate) fn held(
        self,
        stored: GgmlDType,
        cols: usize,
        supported: impl Fn(GgmlDType) -> bool,
    ) -> Option<GgmlDType> {
        let wanted = match self {
            Self::F32 => return None,
            Self::Stored if stored.block_size() == 1 => return None,
            Self::Stored if supported(stored) => stored,
            Self::Stored => GgmlDType::Q8_0,
            Self::Quantized(q) => q,
            Self::Compact if bits_per_weight(stored) <= bits_per_weight(GgmlDType::Q4_1) && supported(stored) => stored,
            Self::Compact => GgmlDType::Q4_1,
        };
        let fits = |q: GgmlDType| cols.is_multiple_of(q.block_size());
        let q = match wanted {
            q if fits(q) => q,
            GgmlDType::Q4K => GgmlDType::Q4_1,
            GgmlDType::Q5K => GgmlDType::Q5_1,
            _ => GgmlDType::Q8_0,
        };
        (supported(q) && fits(q)).then_some(q)
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = Error;

    /// `f32`, `stored`, `compact`, or a block type: `q8_0`, `q4_0`, `q4_1`, `q4k`, `q5k`, `q6k`,
    /// `q8k`.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" => Self::F32,
            "stored" => Self::Stored,
            "compact" => Self::Compact,
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
                    "f32, stored, compact, q8_0, q4_0, q4_1, q5_0, q4k, q5k, q6k or q8k",
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
            Self::Compact => write!(f, "compact"),
            Self::Quantized(t) => write!(f, "{}", format!("{t:?}").to_ascii_lowercase()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlDType::*;

    #[test]
    fn a_weight_is_held_by_one_rule() {
        let all = |_| true;
        let no_q3k = |q| q != Q3K;
        assert_eq!(WeightFormat::F32.held(Q4K, 256, all), None);
        assert_eq!(WeightFormat::Stored.held(F16, 256, all), None);
        assert_eq!(WeightFormat::Stored.held(Q4K, 512, all), Some(Q4K));
        assert_eq!(WeightFormat::Stored.held(Q3K, 256, all), Some(Q3K));
        assert_eq!(WeightFormat::Stored.held(Q3K, 256, no_q3k), Some(Q8_0));
        // 896 values a row: no whole super-block, so a K-quant takes its 32-value cousin.
        assert_eq!(WeightFormat::Quantized(Q4K).held(Q8_0, 896, all), Some(Q4_1));
        assert_eq!(WeightFormat::Quantized(Q6K).held(F32, 896, all), Some(Q8_0));
        assert_eq!(WeightFormat::Quantized(Q8_0).held(F32, 30, all), None);
        assert_eq!(WeightFormat::Quantized(Q4_0).held(Q4_0, 64, all), Some(Q4_0));
        // Compact: types of at most 5 bits a weight stay, wider ones and dense weights become
        // Q4_1, and so do narrow types the engine has no kernel for.
        let compact = |t, cols, ok: &dyn Fn(GgmlDType) -> bool| WeightFormat::Compact.held(t, cols, ok);
        for t in [Q4_0, Q4_1, Q4K] {
            assert_eq!(compact(t, 256, &all), Some(t), "{t:?}");
        }
        for t in [Q5_0, Q5_1, Q5K, Q6K, Q8_0, F16, F32] {
            assert_eq!(compact(t, 256, &all), Some(Q4_1), "{t:?}");
        }
        assert_eq!(compact(Q3K, 256, &no_q3k), Some(Q4_1));
        assert_eq!(compact(F32, 30, &all), None);
    }
}
