//! The public kernels' size checks hold against overflowing sizes: a product whose row count
//! would wrap `m × cols` to a small number is refused (a panic in the caller's thread, or an
//! error), never run past the buffers.

use std::panic::catch_unwind;

use candle_core::quantized::GgmlDType;
use specdec::models::native::matmul::{matmul_parallel, Packed};
use specdec::models::native::quant::{qmatmul_parallel, QActs, QMatrix};

#[test]
fn f32_product_with_a_wrapping_row_count_is_refused() {
    let w = Packed::pack(&[1.0, 2.0, 3.0, 4.0], 2, 2);
    // 2^63 rows of 2 values wrap to 0 values: the check must not pass on the wrapped product.
    let refused = catch_unwind(|| matmul_parallel(&[], 1 << 63, &w, &mut [], 1)).is_err();
    assert!(refused, "a wrapped size passed the check");
}

#[test]
fn quantized_product_with_a_wrapping_row_count_is_refused() {
    let bytes = vec![0u8; 34]; // one Q8_0 block: 32 values.
    let w = QMatrix::from_ggml(GgmlDType::Q8_0, &bytes, 1, 32).expect("one block");
    let refused = catch_unwind(|| {
        let mut a = QActs::default();
        a.quantize(&[], 1 << 63, 32);
        qmatmul_parallel(&a, &w, &mut [], 1);
    })
    .is_err();
    assert!(refused, "a wrapped size passed the check");
}

#[test]
fn quantized_matrix_with_overflowing_sizes_is_an_error() {
    assert!(QMatrix::from_ggml(GgmlDType::Q8_0, &[0u8; 34], usize::MAX, 64).is_err());
    assert!(QMatrix::from_ggml(GgmlDType::Q8_0, &[0u8; 34], 1 << 62, 32).is_err());
}
