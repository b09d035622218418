//! The products of quantized weights with a few quantized activation rows: the dispatch to the
//! CPU's kernel (`avx512`: AVX-512 VNNI; `avx2`: AVX-VNNI or AVX2) and the portable reference
//! (see the parent module for the layout and the math).

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use super::{group_count, QActs, QMatrix, CHUNK};
#[cfg(target_arch = "x86_64")]
use crate::cpu::Level;
use crate::models::native::out_ptr::OutPtr;
use crate::models::native::pool::team;

/// `out = x · wᵀ` (m × w.rows, row-major) for activations `a` quantized from `x`, the weight
/// rows shared out over the thread team.
///
/// Panics if the sizes do not fit; callers check shapes when building a model.
pub fn qmatmul_parallel(a: &QActs, w: &QMatrix, out: &mut [f32], grain: usize) {
    let dst = OutPtr::new(out);
    check(a, w, dst, &(0..w.rows));
    // SAFETY: the team hands each job a distinct range of weight rows, so no two threads write
    // the same column of `out`.
    team().run(w.rows, grain, &|cols| unsafe { qmatmul(a, w, dst, cols) });
}

/// Columns `cols` of `out = x · wᵀ` (m × w.rows, row-major) for activations `a` quantized from
/// `x`, with the kernel [`crate::cpu::kernels`] chose.
///
/// Panics if the sizes do not fit.
///
/// # Safety
/// No other thread may touch columns `cols` of `out` while this runs (threads given disjoint
/// `cols` may run at once on the same `out`).
pub unsafe fn qmatmul(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    check(a, w, out, &cols);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `cpu::level` names a level only when the CPU has all its features, the sizes
    // were checked above, and the caller owns `cols` of `out`.
    unsafe {
        match crate::cpu::level() {
            Level::Avx512Vnni => return avx512::qmatmul_vnni(a, w, out, cols),
            Level::AvxVnni => return avx2::qmatmul_avxvnni(a, w, out, cols),
            Level::Avx2 | Level::Avx512 => return avx2::qmatmul_avx2(a, w, out, cols),
            Level::Portable => {}
        }
    }
    // SAFETY: the caller owns `cols` of `out`.
    unsafe { qmatmul_portable(a, w, out, cols) }
}

fn check(a: &QActs, w: &QMatrix, out: OutPtr, cols: &Range<usize>) {
    let outputs = a.rows.checked_mul(w.rows);
    assert!(
        a.padded == w.padded && cols.start <= cols.end && cols.end <= w.rows && outputs.is_some_and(|n| out.len() >= n),
        "qmatmul sizes"
    );
    let values = a.rows.checked_mul(a.padded);
    assert!(
        values.is_some_and(|n| a.xq.len() >= n && a.dx.len() >= n / 32 && a.sx16.len() >= n / 16)
            && a.lane_dx.len().min(a.lane_sx.len()) >= a.rows * 16 * group_count(a.padded / CHUNK),
        "qmatmul activations"
    );
}

/// The reference kernel, also the fallback: codes and activations in natural order, so that
/// the block dots are plain integer loops.
///
/// # Safety
/// As [`qmatmul`].
pub unsafe fn qmatmul_portable(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    check(a, w, out, &cols);
    let nb = w.padded / 32;
    let len = a.padded;
    let x: Vec<i8> = (0..a.rows * len).map(|j| a.xq[a.at(j / len, j % len)]).collect();
    let mut codes = vec![0u8; w.padded];
    let mut scales = vec![(0f32, 0f32); w.padded / 16];
    for c in cols {
        for (i, q) in codes.iter_mut().enumerate() {
            *q = w.code(c, i);
        }
        // Every type's scale and offset are constant over 16 values.
        for (h, s) in scales.iter_mut().enumerate() {
            *s = w.scale(c, h * 16);
        }
        for (r, xr) in x.chunks_exact(a.padded).enumerate() {
            let mut acc = 0f32;
            for (h, (qh, xh)) in codes.chunks_exact(16).zip(xr.chunks_exact(16)).enumerate() {
                let dot: i32 = qh.iter().zip(xh).map(|(&q, &v)| i32::from(q) * i32::from(v)).sum();
                let (d, m) = scales[h];
                acc += d * a.dx[r * nb + h / 2] * dot as f32 + m * a.sx16[r * 2 * nb + h];
            }
            // SAFETY: `write` checks the bounds; the caller owns column `c` of `out`.
            unsafe { out.write(r * w.rows + c, acc) };
        }
    }
}

#[cfg(test)]
mod candle_agreement {
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// For Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 candle's quantized matmul quantizes activations the
    /// same way (per 32 values, amax/127), so the products agree up to a few flipped roundings.
    /// (For the K-quants candle quantizes activations per 256 values, more coarsely, and is
    /// left out.)
    #[test]
    fn products_agree_with_candle_qmatmul() {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1] {
            let (n, k, m) = (24, 512, 3);
            let w: Vec<f32> = (0..n * k).map(|i| (((i * 7919) % 1013) as f32 / 506.0 - 1.0) * 0.1).collect();
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
            let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&wt, dtype).unwrap();
            let ours = QMatrix::from_ggml(dtype, &q.data().unwrap(), n, k).unwrap();
            let theirs = QMatMul::from_qtensor(q)
                .unwrap()
                .forward(&Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap())
                .unwrap();
            let theirs = theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let mut acts = QActs::default();
            acts.quantize(&x, m, k).expect("quantize");
            let mut got = vec![0f32; m * n];
            qmatmul_parallel(&acts, &ours, &mut got, 64);
            let scale = theirs.iter().fold(0f32, |s, v| s.max(v.abs()));
            let diff = got.iter().zip(&theirs).fold(0f32, |d, (a, b)| d.max((a - b).abs()));
            assert!(diff <= 1e-3 * scale, "{dtype:?}: max diff {diff} at scale {scale}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::native::quant::tests::{data, k_quant, repack, TYPES};
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    type Kernel = fn(&QActs, &QMatrix, OutPtr<'_>, Range<usize>);

    /// Every kernel this CPU can run, each called directly (not only through the dispatch): a
    /// CPU with AVX-512 VNNI and AVX-VNNI (Zen 5) tests all four.
    fn variants() -> Vec<(&'static str, Kernel)> {
        // SAFETY (all of these): the CPU has the level's features, and the tests call each
        // kernel on one thread at a time with fitting sizes.
        let mut ks: Vec<(&'static str, Kernel)> = vec![
            // SAFETY: one thread at a time, with fitting sizes.
            ("portable", |a, w, o, c| unsafe { qmatmul_portable(a, w, o, c) }),
            // SAFETY: one thread at a time, with fitting sizes.
            ("dispatch", |a, w, o, c| unsafe { qmatmul(a, w, o, c) }),
        ];
        #[cfg(target_arch = "x86_64")]
        {
            if Level::Avx2.available() {
                // SAFETY: the CPU has the features (checked just above).
                ks.push(("avx2", |a, w, o, c| unsafe { avx2::qmatmul_avx2(a, w, o, c) }));
            }
            if Level::AvxVnni.available() {
                // SAFETY: the CPU has the features (checked just above).
                ks.push(("avxvnni", |a, w, o, c| unsafe { avx2::qmatmul_avxvnni(a, w, o, c) }));
            }
            if Level::Avx512Vnni.available() {
                // SAFETY: the CPU has the features (checked just above).
                ks.push(("avx512vnni", |a, w, o, c| unsafe { avx512::qmatmul_vnni(a, w, o, c) }));
            }
        }
        eprintln!("quantized kernels tested: {:?}", ks.iter().map(|k| k.0).collect::<Vec<_>>());
        ks
    }

    /// Runs `kernel` over all columns in three ranges (as threads would split them), at any
    /// boundary: the kernels' tiles must not cross a range's end.
    fn run(kernel: Kernel, acts: &QActs, w: &QMatrix) -> Vec<f32> {
        let n = w.rows();
        let mut got = vec![f32::NAN; acts.rows * n];
        let out = OutPtr::new(&mut got);
        let (a, b) = (n / 3, n / 3 + n.div_ceil(3));
        kernel(acts, w, out, 0..a);
        kernel(acts, w, out, a..b.min(n));
        kernel(acts, w, out, b.min(n)..n);
        got
    }

    /// Every kernel, every format, 1..=9 activation rows and odd row counts, against the product
    /// of the dequantized weights with the (unquantized) activations.
    #[test]
    fn kernels_match_the_dequantized_product() {
        let kernels = variants();
        for dtype in TYPES {
            // Rows of 4, 8, 12, 9, 1, 3, 13, 14, 15 and 20 chunks: every tail of 2 and 1 chunks after
            // whole lane groups, and rows as wide as the 0.5B Qwen's (896 values).
            let shapes = [
                (7usize, 256usize),
                (13, 512),
                (3, 768),
                (6, 576),
                (5, 64),
                (11, 192),
                (3, 832),
                (4, 896),
                (3, 960),
                (2, 1280),
            ];
            for &(n, k) in &shapes {
                if k_quant(dtype) && k % 256 != 0 {
                    continue;
                }
                let (w, deq) = repack(dtype, n, k);
                for m in 1..=16 {
                    let x = data(m * k, 3);
                    let want: Vec<f32> = (0..m)
                        .flat_map(|r| {
                            (0..n).map({
                                let (x, deq) = (&x, &deq);
                                move |c| (0..k).map(|i| x[r * k + i] * deq[c * k + i]).sum::<f32>()
                            })
                        })
                        .collect();
                    let mut acts = QActs::default();
                    acts.quantize(&x, m, k).expect("quantize");
                    for (name, kernel) in &kernels {
                        let got = run(*kernel, &acts, &w);
                        // Activations are quantized to 8 bits: allow 1 % of the row's scale.
                        let scale: f32 = want.iter().fold(1e-3, |s, v| s.max(v.abs()));
                        for (g, e) in got.iter().zip(&want) {
                            assert!((g - e).abs() <= 0.01 * scale, "{name} {dtype:?} m{m} n{n} k{k}: {g} vs {e}");
                        }
                    }
                }
            }
        }
    }

    /// Batch invariance: a row's product is bit for bit the same alone or among M rows, at
    /// every M from 1 to 16, for every type and kernel (each row is summed in the same order
    /// whatever the tile it lands in), so verifying k + 1 rows scores each like a plain step.
    /// Long rows too (18 lane groups and a tail), which many activation rows take in K spans,
    /// and, for those, 100 rows: more than one block of passes (`pass_blocks`).
    #[test]
    fn each_row_is_bit_identical_alone_or_among_m_rows() {
        let kernels = variants();
        for (dtype, long) in TYPES.into_iter().flat_map(|t| [(t, false), (t, true)]) {
            let k = match (k_quant(dtype), long) {
                (true, false) => 512,
                (false, false) => 576,
                (true, true) => 18 * 256,
                (false, true) => 18 * 256 + 3 * 64,
            };
            let n = 9;
            let (w, _) = repack(dtype, n, k);
            let most = if long { 100 } else { 16 };
            assert!(!long || super::super::pass_blocks(most, k).count() > 1, "100 rows span blocks");
            let x = data(most * k, 5);
            for (name, kernel) in &kernels {
                let alone: Vec<Vec<f32>> = (0..most)
                    .map(|r| {
                        let mut acts = QActs::default();
                        acts.quantize(&x[r * k..(r + 1) * k], 1, k).expect("quantize");
                        run(*kernel, &acts, &w)
                    })
                    .collect();
                for m in (1..=16).chain(long.then_some(most)) {
                    let mut acts = QActs::default();
                    acts.quantize(&x[..m * k], m, k).expect("quantize");
                    let together = run(*kernel, &acts, &w);
                    for (r, row) in together.chunks_exact(n).enumerate() {
                        let same = row.iter().zip(&alone[r]).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{name} {dtype:?} k{k}: row {r} of {m} differs from the row alone");
                    }
                }
            }
        }
    }

    /// Same quantized inputs: the integer parts are exact, so only f32 rounding may differ.
    fn agree_with_portable(w: &QMatrix, x: &[f32], m: usize, what: &str) {
        let mut acts = QActs::default();
        acts.quantize(x, m, w.cols()).expect("quantize");
        let want = run(variants()[0].1, &acts, w);
        for (name, kernel) in variants() {
            for (p, q) in want.iter().zip(run(kernel, &acts, w)) {
                assert!((p - q).abs() <= 1e-4 * (1.0 + p.abs()), "{name} {what} m{m}: {p} vs {q}");
            }
        }
    }

    #[test]
    fn kernels_agree_exactly_with_the_portable_reference() {
        for dtype in TYPES {
            let k = if k_quant(dtype) { 768 } else { 576 };
            let (w, _) = repack(dtype, 9, k);
            for m in [1, 2, 3, 4, 5, 7] {
                agree_with_portable(&w, &data(m * k, 11), m, &format!("{dtype:?}"));
            }
            // Rows long enough that many activation rows take them in K spans.
            let k = if k_quant(dtype) { 18 * 256 } else { 18 * 256 + 3 * 64 };
            let (w, _) = repack(dtype, 9, k);
            for m in [5, 9, 16] {
                agree_with_portable(&w, &data(m * k, 12), m, &format!("{dtype:?} k{k}"));
            }
        }
    }

    /// The extremes of every code and activation, with signs that line up: a pair of 8-bit
    /// products summed in i16 without the sign trick would saturate here (2 × 255 × 127).
    #[test]
    fn extreme_codes_do_not_saturate() {
        let (n, k) = (5, 256);
        let w: Vec<f32> = (0..n * k).map(|i| if (i / 3) % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let wt = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu).expect("tensor");
        for dtype in TYPES {
            let q = QTensor::quantize(&wt, dtype).expect("quantize");
            let m = QMatrix::from_ggml(dtype, &q.data().expect("bytes"), n, k).expect("repack");
            // Activations equal to the first weight row, to its negation, and all at +max.
            let mut x: Vec<f32> = w[..k].to_vec();
            x.extend(w[..k].iter().map(|v| -v));
            x.extend(std::iter::repeat_n(1.0, k));
            agree_with_portable(&m, &x, 3, &format!("extreme {dtype:?}"));
        }
    }
}
