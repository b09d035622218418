//! The public kernels' size checks hold against overflowing sizes: a product whose row count
//! would wrap `m × cols` to a small number is refused (a panic in the caller's thread, or an
//! error), never run past the buffers; constructors whose sizes would overflow return
//! [`Error::TooLarge`].

use std::panic::catch_unwind;

use candle_core::quantized::GgmlDType;
use specdec::models::native::matmul::{matmul_parallel, Packed};
use specdec::models::native::quant::{QActs, QMatrix};
use specdec::Error;

#[test]
fn f32_product_with_a_wrapping_row_count_is_refused() {
    let w = Packed::pack(&[1.0, 2.0, 3.0, 4.0], 2, 2).expect("a 2x2 matrix");
    // 2^63 rows of 2 values wrap to 0 values: the check must not pass on the wrapped product.
    let refused = catch_unwind(|| matmul_parallel(&[], 1 << 63, &w, &mut [], 1)).is_err();
    assert!(refused, "a wrapped size passed the check");
}

#[test]
fn quantized_activations_with_a_wrapping_row_count_are_an_error() {
    // 2^63 rows of 32 values (64 when padded) wrap: an error before any buffer is sized, so the
    // product never meets them.
    let mut a = QActs::default();
    assert!(matches!(a.quantize(&[], 1 << 63, 32), Err(Error::TooLarge { .. })));
    assert!(matches!(a.quantize(&[], 1, usize::MAX - 1), Err(Error::TooLarge { .. })));
    // Fewer values than rows × cols: an error, not a panic in a worker.
    assert!(matches!(a.quantize(&[0.5; 63], 2, 32), Err(Error::InvalidSetting { .. })));
}

#[test]
fn f32_matrix_with_overflowing_sizes_is_an_error() {
    assert!(matches!(Packed::pack(&[], 1 << 62, 16), Err(Error::TooLarge { .. })));
    assert!(matches!(Packed::pack(&[1.0; 3], 2, 2), Err(Error::InvalidSetting { .. })));
}

#[test]
fn quantized_matrix_with_overflowing_sizes_is_an_error() {
    assert!(QMatrix::from_ggml(GgmlDType::Q8_0, &[0u8; 34], usize::MAX, 64).is_err());
    assert!(QMatrix::from_ggml(GgmlDType::Q8_0, &[0u8; 34], 1 << 62, 32).is_err());
    // No rows: the bytes (none) fit, but a row's size overflows.
    let cols = usize::MAX / 32 * 32;
    assert!(matches!(QMatrix::from_ggml(GgmlDType::Q8_0, &[], 0, cols), Err(Error::TooLarge { .. })));
}
