//! The products of quantized weights with a few quantized activation rows: an AVX-512 VNNI
//! kernel and the portable reference (see the parent module for the layout and the math).

use std::ops::Range;

use super::{half, position, Bits, QActs, QMatrix, CHUNK};
use crate::native::matmul::OutPtr;

/// Columns `cols` of `out = x · wᵀ` (m × w.rows, row-major) for activations `a` quantized from
/// `x`. Threads given disjoint `cols` may run at once on the same `out`.
pub fn qmatmul(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    assert!(a.padded == w.padded && cols.end <= w.rows && out.len() >= a.rows * w.rows, "qmatmul sizes");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
            // SAFETY: the features are present and the sizes were checked above.
            return unsafe { x86::qmatmul_vnni(a, w, out, cols) };
        }
    }
    qmatmul_portable(a, w, out, cols)
}

/// The reference kernel, also the fallback.
pub fn qmatmul_portable(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    assert!(a.padded == w.padded && cols.end <= w.rows && out.len() >= a.rows * w.rows, "qmatmul sizes");
    let nb = w.padded / 32;
    for c in cols {
        for r in 0..a.rows {
            let mut acc = 0f32;
            for b in 0..nb {
                let mut dot = 0i32;
                for i in b * 32..(b + 1) * 32 {
                    let x = a.xq[r * a.padded + i / CHUNK * CHUNK + position(i % CHUNK)];
                    dot += w.code(c, i) as i32 * x as i32;
                }
                acc += half(w.d[c * nb + b]) * a.dx[r * nb + b] * dot as f32 + half(w.m[c * nb + b]) * a.sx[r * nb + b];
            }
            // SAFETY: r < rows and c < w.rows, inside `out` (checked above).
            unsafe { out.write(r * w.rows + c, acc) };
        }
    }
}

// The kernels index register arrays by (row, column) to mirror the tile's math.
#[allow(clippy::needless_range_loop)]
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Bits, QActs, QMatrix, CHUNK};
    use crate::native::matmul::OutPtr;
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Weight rows per tile and activation rows per group.
    const TILE: usize = 4;
    const GROUP: usize = 4;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn qmatmul_vnni(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
        let mut c = cols.start;
        while c < cols.end {
            let tile = if cols.end - c >= TILE { TILE } else { 1 };
            let mut r = 0;
            while r < a.rows {
                let g = (a.rows - r).min(GROUP);
                match (g, tile) {
                    (1, TILE) => tile_vnni::<1, TILE>(a, w, r, c, out),
                    (2, TILE) => tile_vnni::<2, TILE>(a, w, r, c, out),
                    (3, TILE) => tile_vnni::<3, TILE>(a, w, r, c, out),
                    (4, TILE) => tile_vnni::<4, TILE>(a, w, r, c, out),
                    (1, _) => tile_vnni::<1, 1>(a, w, r, c, out),
                    (2, _) => tile_vnni::<2, 1>(a, w, r, c, out),
                    (3, _) => tile_vnni::<3, 1>(a, w, r, c, out),
                    _ => tile_vnni::<4, 1>(a, w, r, c, out),
                }
                r += g;
            }
            c += tile;
        }
    }

    /// Two f32 scales `[s0, s1]` at `p` broadcast as `[s0, s1, s0, s1, …]`, the lane order of a
    /// `vpdpbusd` over an interleaved chunk.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn pair(p: *const f32) -> __m512 {
        _mm512_castsi512_ps(_mm512_set1_epi64(std::ptr::read_unaligned(p as *const i64)))
    }

    /// The same for two f16 scales.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn pair_f16(p: *const u16) -> __m512 {
        _mm512_cvtph_ps(_mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32)))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn tile_vnni<const M: usize, const R: usize>(a: &QActs, w: &QMatrix, r0: usize, c0: usize, out: OutPtr) {
        let nb = w.padded / 32;
        let chunks = w.padded / CHUNK;
        let four = w.bits == Bits::Four;
        let row_bytes = if four { w.padded / 2 } else { w.padded };
        let qs = w.qs.as_ptr().add(c0 * row_bytes);
        let wd = w.d.as_ptr().add(c0 * nb);
        let xq = a.xq.as_ptr().add(r0 * a.padded);
        let dx = a.dx.as_ptr().add(r0 * nb);
        let low = _mm512_set1_epi8(0x0F);
        let mut acc = [[_mm512_setzero_ps(); R]; M];
        // One chunk: codes of each weight row in `wq`, scales at block 2p.
        let mut step = |p: usize, wq: &[__m512i; R]| {
            let mut scale = [_mm512_setzero_ps(); R];
            for (i, s) in scale.iter_mut().enumerate() {
                *s = pair_f16(wd.add(i * nb + 2 * p));
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let x = _mm512_loadu_si512(xq.add(r * a.padded + p * CHUNK) as *const _);
                let sx = pair(dx.add(r * nb + 2 * p));
                for i in 0..R {
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[i], x);
                    acc_r[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale[i], sx), acc_r[i]);
                }
            }
        };
        if four {
            let mut p = 0;
            while p + 1 < chunks {
                let (mut lo, mut hi) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
                for i in 0..R {
                    // The rows are short streams the prefetcher misses: fetch the same bytes two
                    // tiles ahead into L2 (measured best: one tile ahead into L1 fills the miss
                    // slots and is 20-40 % slower for one activation row).
                    _mm_prefetch::<_MM_HINT_T1>(qs.add((2 * R + i) * row_bytes + p * 32) as *const i8);
                    let v = _mm512_loadu_si512(qs.add(i * row_bytes + p * 32) as *const _);
                    lo[i] = _mm512_and_si512(v, low);
                    hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                }
                step(p, &lo);
                step(p + 1, &hi);
                p += 2;
            }
            if p < chunks {
                let mut last = [_mm512_setzero_si512(); R];
                for (i, l) in last.iter_mut().enumerate() {
                    let v = _mm256_loadu_si256(qs.add(i * row_bytes + p * 32) as *const __m256i);
                    let lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
                    *l = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                }
                step(p, &last);
            }
        } else {
            for p in 0..chunks {
                let mut codes = [_mm512_setzero_si512(); R];
                for (i, c) in codes.iter_mut().enumerate() {
                    _mm_prefetch::<_MM_HINT_T1>(qs.add((2 * R + i) * row_bytes + p * CHUNK) as *const i8);
                    *c = _mm512_loadu_si512(qs.add(i * row_bytes + p * CHUNK) as *const _);
                }
                step(p, &codes);
            }
        }
        for r in 0..M {
            for i in 0..R {
                let offset = dot_f32(w.m.as_ptr().add((c0 + i) * nb), a.sx.as_ptr().add((r0 + r) * nb), nb);
                out.write((r0 + r) * w.rows + c0 + i, _mm512_reduce_add_ps(acc[r][i]) + offset);
            }
        }
    }

    /// Σ a[i]·b[i] for i < n (a in f16), 16 lanes at a time.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn dot_f32(a: *const u16, b: *const f32, n: usize) -> f32 {
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let left = n - i;
            let mask: __mmask16 = if left >= 16 { 0xFFFF } else { ((1u32 << left) - 1) as u16 };
            let a16 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, a.add(i) as *const i16));
            acc = _mm512_fmadd_ps(a16, _mm512_maskz_loadu_ps(mask, b.add(i)), acc);
            i += 16;
        }
        _mm512_reduce_add_ps(acc)
    }
}

#[cfg(test)]
mod candle_agreement {
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// For Q8_0, Q4_0 and Q4_1 candle's quantized matmul quantizes activations the same way
    /// (per 32 values, amax/127), so the products agree up to a few flipped roundings. (For Q4_K
    /// candle quantizes activations per 256 values, more coarsely, and is left out.)
    #[test]
    fn products_agree_with_candle_qmatmul() {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1] {
            let (n, k, m) = (24, 512, 3);
            let w: Vec<f32> = (0..n * k).map(|i| (((i * 7919) % 1013) as f32 / 506.0 - 1.0) * 0.1).collect();
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
            let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&wt, dtype).unwrap();
            let ours = QMatrix::from_ggml(dtype, &q.data().unwrap(), n, k).unwrap();
            let theirs = QMatMul::from_qtensor(q).unwrap().forward(&Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap()).unwrap();
            let theirs = theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let mut acts = QActs::default();
            acts.quantize(&x, m, k);
            let mut got = vec![0f32; m * n];
            qmatmul(&acts, &ours, OutPtr::new(&mut got), 0..n);
            let scale = theirs.iter().fold(0f32, |s, v| s.max(v.abs()));
            let diff = got.iter().zip(&theirs).fold(0f32, |d, (a, b)| d.max((a - b).abs()));
            assert!(diff <= 1e-3 * scale, "{dtype:?}: max diff {diff} at scale {scale}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::quant::tests::{data, repack, TYPES};
    use candle_core::quantized::GgmlDType;

    /// Every kernel, every format, 1..=9 activation rows and odd row counts, against the product
    /// of the dequantized weights with the (unquantized) activations.
    #[test]
    fn kernels_match_the_dequantized_product() {
        type Kernel = fn(&QActs, &QMatrix, OutPtr, Range<usize>);
        let mut kernels: Vec<(&str, Kernel)> = vec![("portable", qmatmul_portable), ("dispatch", qmatmul)];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
            kernels.push(("vnni", |a, w, o, c| unsafe { x86::qmatmul_vnni(a, w, o, c) }));
        }
        for dtype in TYPES {
            for &(n, k) in &[(7usize, 256usize), (13, 512), (3, 768), (6, 576), (5, 64)] {
                if dtype == GgmlDType::Q4K && k % 256 != 0 {
                    continue;
                }
                let (w, deq) = repack(dtype, n, k);
                for m in 1..=9 {
                    let x = data(m * k, 3);
                    let want: Vec<f32> = (0..m).flat_map(|r| (0..n).map({ let (x, deq) = (&x, &deq); move |c| (0..k).map(|i| x[r * k + i] * deq[c * k + i]).sum::<f32>() })).collect();
                    let mut acts = QActs::default();
                    acts.quantize(&x, m, k);
                    for (name, kernel) in &kernels {
                        let mut got = vec![f32::NAN; m * n];
                        let out = OutPtr::new(&mut got);
                        kernel(&acts, &w, out, 0..n / 2);
                        kernel(&acts, &w, out, n / 2..n);
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

    #[test]
    fn kernels_agree_exactly_with_the_portable_reference() {
        // Same quantized inputs: the integer parts are exact, so only f32 rounding may differ.
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
            for dtype in TYPES {
                let k = if dtype == GgmlDType::Q4K { 512 } else { 576 };
                let (w, _) = repack(dtype, 9, k);
                let x = data(5 * k, 11);
                let mut acts = QActs::default();
                acts.quantize(&x, 5, k);
                let (mut a, mut b) = (vec![0f32; 45], vec![0f32; 45]);
                qmatmul_portable(&acts, &w, OutPtr::new(&mut a), 0..9);
                unsafe { x86::qmatmul_vnni(&acts, &w, OutPtr::new(&mut b), 0..9) };
                for (p, q) in a.iter().zip(&b) {
                    assert!((p - q).abs() <= 1e-4 * (1.0 + p.abs()), "{dtype:?}: {p} vs {q}");
                }
            }
        }
    }
}
