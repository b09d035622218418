//! The one maybe-quantized matrix on candle tensors: the candle engine's linear layers and the
//! draft heads' (which train through it with candle's autograd) are both a [`Linear`]. The
//! native CPU engine holds its weights in its own blocked layouts (`native::Matrix`).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::Result;
use crate::models::format::WeightFormat;

/// `y = x · Wᵀ` for activations `x` of shape (…, rows, in) and a weight W of shape (out, in).
#[derive(Debug, Clone)]
pub enum Linear {
    /// f32 weight kept transposed, (in, out): a contiguous copy at load (which candle
    /// multiplies fastest), or a transposed view of a head's (out, in) weight, so that
    /// gradients reach it.
    Dense(Tensor),
    /// A quantized weight, multiplied by candle's quantized kernels.
    Quant(QMatMul),
}

impl Linear {
    /// Builds a layer from a weight of shape (out, in) in the requested format, held as
    /// `WeightFormat::held`, the rule of both engines, says (candle has kernels for every GGUF
    /// block type).
    ///
    /// # Errors
    /// Backend failures.
    pub fn new(weight: QTensor, format: WeightFormat, device: &Device) -> Result<Self> {
        let cols = weight.shape().dims().last().copied().unwrap_or(0);
        Ok(match format.held(weight.dtype(), cols, |_| true) {
            Some(q) if q == weight.dtype() => Self::Quant(QMatMul::from_qtensor(weight)?),
            Some(q) => Self::Quant(QMatMul::from_qtensor(QTensor::quantize(&weight.dequantize(device)?, q)?)?),
            None => Self::Dense(weight.dequantize(device)?.t()?.contiguous()?),
        })
    }

    /// A layer from f32 weights `w` of shape (out, in), held as given (a transposed view) or,
    /// with `quantize`, as that block type where its block divides the row length (a Q8_0
    /// copy of a draft head streams a quarter of the f32 bytes per token).
    ///
    /// # Errors
    /// Backend failures.
    pub fn from_f32(w: &Tensor, quantize: Option<GgmlDType>) -> Result<Self> {
        let row = w.dims().last().copied().unwrap_or(0);
        Ok(match quantize {
            Some(t) if row > 0 && row % t.block_size() == 0 => {
                Self::Quant(QMatMul::from_qtensor(QTensor::quantize(w, t)?)?)
            }
            _ => Self::Dense(w.t()?),
        })
    }

    /// Applies the layer to `x` of shape (…, rows, in).
    ///
    /// # Errors
    /// Backend failures and shape mismatches.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Dense(wt) => x.broadcast_matmul(wt)?,
            Self::Quant(q) if x.device().is_cuda() => Self::cuda_rows(q, x)?,
            Self::Quant(q) => q.forward(x)?,
        })
    }

    /// Rows of activations on CUDA at most 8 at a time. On an H200, candle 0.11.1's
    /// quantized product for more than 8 rows (its `fast_mmq` path) returned NaN for every
    /// value of a 9-row pass of the stories model with Q8_0 or Q4_0 weights, while its
    /// 1–8-row path (`fast_mmvq`) agreed with the CPU, so verifying more than 7 drafts (a tree,
    /// or a long block) scored NaN (see `docs/cuda.md`).
    fn cuda_rows(q: &QMatMul, x: &Tensor) -> Result<Tensor> {
        const MMVQ_ROWS: usize = 8;
        let dims = x.dims().to_vec();
        let Some((&cols, lead)) = dims.split_last() else { return Ok(q.forward(x)?) };
        let rows: usize = lead.iter().product();
        if rows <= MMVQ_ROWS {
            return Ok(q.forward(x)?);
        }
        let flat = x.reshape((rows, cols))?;
        let mut parts = Vec::with_capacity(rows.div_ceil(MMVQ_ROWS));
        for start in (0..rows).step_by(MMVQ_ROWS) {
            parts.push(q.forward(&flat.narrow(0, start, MMVQ_ROWS.min(rows - start))?.contiguous()?)?);
        }
        let out = Tensor::cat(&parts, 0)?;
        let mut shape = lead.to_vec();
        shape.push(out.dim(1)?);
        Ok(out.reshape(shape)?)
    }

    /// The weight W, (out, in), in f32 (dequantized where it is quantized).
    ///
    /// # Errors
    /// Backend failures.
    pub fn to_f32(&self) -> Result<Tensor> {
        let w = match self {
            Self::Dense(wt) => wt.t()?.contiguous()?,
            Self::Quant(QMatMul::QTensor(q)) => q.dequantize(&q.device())?,
            Self::Quant(QMatMul::Tensor(w) | QMatMul::TensorF16(w)) => w.clone(),
        };
        Ok(w.to_dtype(candle_core::DType::F32)?)
    }
}
