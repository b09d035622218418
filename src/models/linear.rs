//! The model's linear layers: f32 or quantized weights, and the choice between them at load.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::{Error, Result};

/// How a model's matrix weights are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// Dequantized to f32 (the exact target).
    F32,
    /// As stored in the file (quantized GGUF weights stay quantized).
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
            _ => return Err(Error::setting("weight format", s, "f32, stored, q8_0, q4_0, q4_1, q5_0, q4k, q5k, q6k or q8k")),
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

/// `y = x · Wᵀ` for activations `x` of shape (rows, in) and a weight W of shape (out, in).
#[derive(Debug, Clone)]
pub enum Linear {
    /// f32 weight kept transposed, (in, out), which candle multiplies fastest.
    Dense(Tensor),
    /// A quantized weight, multiplied by candle's quantized kernels.
    Quant(QMatMul),
}

impl Linear {
    /// Builds a layer from a weight of shape (out, in) in the requested format. A quantized
    /// format whose block does not divide the row length keeps the weight in f32.
    ///
    /// # Errors
    /// Backend failures.
    pub fn new(weight: QTensor, format: WeightFormat, device: &Device) -> Result<Self> {
        let stored = weight.dtype();
        let dense = matches!(stored, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        let row = weight.shape().dims().last().copied().unwrap_or(0);
        match format {
            WeightFormat::Stored if !dense => Ok(Self::Quant(QMatMul::from_qtensor(weight)?)),
            WeightFormat::Quantized(t) if row % t.block_size() == 0 && t != stored => {
                let w = weight.dequantize(device)?;
                Ok(Self::Quant(QMatMul::from_qtensor(QTensor::quantize(&w, t)?)?))
            }
            WeightFormat::Quantized(_) if !dense => Ok(Self::Quant(QMatMul::from_qtensor(weight)?)),
            _ => Ok(Self::Dense(weight.dequantize(device)?.t()?.contiguous()?)),
        }
    }

    /// Applies the layer to `x` of shape (rows, in).
    ///
    /// # Errors
    /// Backend failures and shape mismatches.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Dense(wt) => x.matmul(wt)?,
            Self::Quant(q) => q.forward(x)?,
        })
    }
}
