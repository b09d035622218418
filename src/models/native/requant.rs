//! Re-quantizing a stored matrix to another block type at load (a draft loaded as `@q4_1`, or
//! a file's Q3_K or IQ matrices held as Q8_0), runs of rows at a time over the thread team.

use std::sync::Mutex;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
use candle_core::Device;

use crate::error::{Error, Result};
use crate::models::native::pool::team;

/// Rows per run: candle dequantizes and quantizes on one thread, so each run is one job.
const RUN_ROWS: usize = 256;

/// The GGUF bytes of `t`, a (rows, cols) matrix, re-quantized to `to`: the same bytes as
/// quantizing the whole dequantized matrix (blocks never cross a row), in a fraction of the
/// time (one run of rows per job).
///
/// # Errors
/// Candle's, for types it cannot dequantize or rows that `to`'s blocks do not divide.
pub(crate) fn requantize(t: &QTensor, to: GgmlDType, rows: usize, cols: usize) -> Result<Vec<u8>> {
    let from = t.dtype();
    let row_bytes = |dtype: GgmlDType| cols / dtype.block_size() * dtype.type_size();
    let stored = t.data()?;
    if !cols.is_multiple_of(from.block_size()) || stored.len() != rows * row_bytes(from) {
        return Err(Error::setting("quantized tensor", format!("{from:?} {rows}x{cols}"), "whole blocks per row"));
    }
    let runs: Mutex<Vec<(usize, Result<Vec<u8>>)>> = Mutex::new(Vec::new());
    team().run(rows, RUN_ROWS, &|r| {
        let part = &stored[r.start * row_bytes(from)..r.end * row_bytes(from)];
        let run = qtensor_from_ggml(from, part, vec![r.len(), cols], &Device::Cpu)
            .and_then(|q| QTensor::quantize(&q.dequantize(&Device::Cpu)?, to))
            .and_then(|q| q.data().map(|b| b.to_vec()))
            .map_err(Error::from);
        runs.lock().unwrap_or_else(|e| e.into_inner()).push((r.start, run));
    });
    let mut runs = runs.into_inner().unwrap_or_else(|e| e.into_inner());
    runs.sort_by_key(|(start, _)| *start);
    let mut out = Vec::with_capacity(rows * row_bytes(to));
    for (_, run) in runs {
        out.extend_from_slice(&run?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    /// Run by run, the bytes are those of quantizing the whole matrix at once, for more rows
    /// than one run and a last run cut short.
    #[test]
    fn runs_give_the_bytes_of_the_whole_matrix() {
        let (rows, cols) = (2 * RUN_ROWS + 37, 512);
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0).collect();
        let w = Tensor::from_vec(values, (rows, cols), &Device::Cpu).expect("tensor");
        for (from, to) in
            [(GgmlDType::Q8_0, GgmlDType::Q4_1), (GgmlDType::Q5_0, GgmlDType::Q4_0), (GgmlDType::Q6K, GgmlDType::Q8_0)]
        {
            let stored = QTensor::quantize(&w, from).expect("quantize");
            let whole = QTensor::quantize(&stored.dequantize(&Device::Cpu).expect("dequantize"), to).expect("quantize");
            let got = requantize(&stored, to, rows, cols).expect("requantize");
            assert_eq!(got, whole.data().expect("bytes").to_vec(), "{from:?} → {to:?}");
        }
    }

    #[test]
    fn bytes_that_do_not_fit_the_shape_are_an_error() {
        let w = Tensor::zeros((4, 64), candle_core::DType::F32, &Device::Cpu).expect("tensor");
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).expect("quantize");
        assert!(matches!(requantize(&q, GgmlDType::Q4_0, 5, 64), Err(Error::InvalidSetting { .. })));
    }
}
