//! f32 matrix products for a few activation rows against a weight matrix kept as stored,
//! (out, in) row-major: `y[r][j] = x[r] · w[j]`. Each weight row is streamed from memory once
//! for all activation rows, so scoring k + 1 positions costs little more than scoring one.
//!
//! candle's CPU matmul is written for large products and pays a high fixed cost for 2..8
//! rows against a transposed weight (see `FACTS.md`), so this small-M kernel is our own:
//! AVX-512 or AVX2+FMA chosen at run time, with a portable fallback.

use std::ops::Range;

/// Activation rows processed together against one tile of weight rows.
const ROWS: usize = 4;
/// Weight rows per tile.
const TILE: usize = 4;

/// A raw view of the output that threads write in disjoint column ranges.
#[derive(Clone, Copy)]
pub struct OutPtr {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: threads write disjoint elements (distinct column ranges); see `matmul`.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Views `out`; the caller keeps `out` alive and unaliased while the view is used.
    pub fn new(out: &mut [f32]) -> Self {
        Self { ptr: out.as_mut_ptr(), len: out.len() }
    }

    /// Elements in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty view.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes one element.
    ///
    /// # Safety
    /// No other thread may touch element `i` at the same time.
    pub unsafe fn write(self, i: usize, value: f32) {
        assert!(i < self.len, "OutPtr::write out of bounds");
        *self.ptr.add(i) = value;
    }

    /// The elements `start..start + len` as a slice.
    ///
    /// # Safety
    /// No other thread may touch these elements while the slice lives.
    pub unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [f32] {
        assert!(start + len <= self.len, "OutPtr::slice out of bounds");
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

/// Computes columns `cols` of `y = x · wᵀ` for `m` rows of `x` (each `k` long) against `w`
/// (`n` rows of `k`), into `out` (m × n, row-major). Threads given disjoint `cols` may run at
/// once on the same `out`.
///
/// Panics (slice bounds) if the sizes do not fit; callers check shapes when building a model.
pub fn matmul(x: &[f32], m: usize, w: &[f32], k: usize, n: usize, out: OutPtr, cols: Range<usize>) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len >= m * n && cols.end <= n, "matmul sizes");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature is present and the bounds were checked above.
            return unsafe { x86::matmul_avx512(x, m, w, k, n, out, cols) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { x86::matmul_avx2(x, m, w, k, n, out, cols) };
        }
    }
    matmul_portable(x, m, w, k, n, out, cols)
}

/// The reference kernel, also the fallback: plain loops the compiler vectorizes.
pub fn matmul_portable(x: &[f32], m: usize, w: &[f32], k: usize, n: usize, out: OutPtr, cols: Range<usize>) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len >= m * n && cols.end <= n, "matmul sizes");
    for j in cols {
        let wj = &w[j * k..(j + 1) * k];
        for r in 0..m {
            let xr = &x[r * k..(r + 1) * k];
            let mut acc = [0f32; 8];
            let mut chunks = xr.chunks_exact(8).zip(wj.chunks_exact(8));
            for (a, b) in &mut chunks {
                for l in 0..8 {
                    acc[l] = a[l].mul_add(b[l], acc[l]);
                }
            }
            let tail: f32 = xr[k / 8 * 8..].iter().zip(&wj[k / 8 * 8..]).map(|(a, b)| a * b).sum();
            // SAFETY: r < m and j < n, within `out` (checked above).
            unsafe { *out.ptr.add(r * n + j) = acc.iter().sum::<f32>() + tail };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{OutPtr, ROWS, TILE};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Walks the column range in tiles of `TILE` weight rows (then single rows) and the
    /// activation rows in groups of up to `ROWS`, calling the kernel `f(xs, mrows, w, rows, out)`.
    #[inline(always)]
    unsafe fn drive(
        x: &[f32], m: usize, w: &[f32], k: usize, n: usize, out: OutPtr, cols: Range<usize>,
        f: impl Fn(*const f32, usize, *const f32, usize, *mut f32),
    ) {
        let mut j = cols.start;
        while j < cols.end {
            let rows = if cols.end - j >= TILE { TILE } else { 1 };
            let mut r = 0;
            while r < m {
                let mr = (m - r).min(ROWS);
                f(x.as_ptr().add(r * k), mr, w.as_ptr().add(j * k), rows, out.ptr.add(r * n + j));
                r += mr;
            }
            j += rows;
        }
    }

    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn matmul_avx512(x: &[f32], m: usize, w: &[f32], k: usize, n: usize, out: OutPtr, cols: Range<usize>) {
        drive(x, m, w, k, n, out, cols, |xp, mr, wp, rows, op| match (mr, rows) {
            (1, TILE) => tile512::<1, TILE>(xp, wp, k, op, n),
            (2, TILE) => tile512::<2, TILE>(xp, wp, k, op, n),
            (3, TILE) => tile512::<3, TILE>(xp, wp, k, op, n),
            (4, TILE) => tile512::<4, TILE>(xp, wp, k, op, n),
            (1, _) => tile512::<1, 1>(xp, wp, k, op, n),
            (2, _) => tile512::<2, 1>(xp, wp, k, op, n),
            (3, _) => tile512::<3, 1>(xp, wp, k, op, n),
            _ => tile512::<4, 1>(xp, wp, k, op, n),
        });
    }

    /// `out[r·n + i] = x[r] · w[i]` for r < M, i < R, 16 lanes at a time with a masked tail.
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    unsafe fn tile512<const M: usize, const R: usize>(x: *const f32, w: *const f32, k: usize, out: *mut f32, n: usize) {
        let mut acc = [[_mm512_setzero_ps(); R]; M];
        let mut i = 0;
        while i + 16 <= k {
            let mut wv = [_mm512_setzero_ps(); R];
            for (c, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(w.add(c * k + i));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add(r * k + i));
                for c in 0..R {
                    a[c] = _mm512_fmadd_ps(xv, wv[c], a[c]);
                }
            }
            i += 16;
        }
        if i < k {
            // 1..=15 lanes are left.
            let mask: __mmask16 = ((1u32 << (k - i)) - 1) as u16;
            for r in 0..M {
                let xv = _mm512_maskz_loadu_ps(mask, x.add(r * k + i));
                for c in 0..R {
                    acc[r][c] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(mask, w.add(c * k + i)), acc[r][c]);
                }
            }
        }
        for r in 0..M {
            for c in 0..R {
                *out.add(r * n + c) = _mm512_reduce_add_ps(acc[r][c]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn matmul_avx2(x: &[f32], m: usize, w: &[f32], k: usize, n: usize, out: OutPtr, cols: Range<usize>) {
        drive(x, m, w, k, n, out, cols, |xp, mr, wp, rows, op| {
            let mut r = 0;
            while r < mr {
                // Two activation rows at a time keep the accumulators within 16 registers.
                match ((mr - r).min(2), rows) {
                    (2, TILE) => tile256::<2, TILE>(xp.add(r * k), wp, k, op.add(r * n), n),
                    (_, TILE) => tile256::<1, TILE>(xp.add(r * k), wp, k, op.add(r * n), n),
                    (2, _) => tile256::<2, 1>(xp.add(r * k), wp, k, op.add(r * n), n),
                    _ => tile256::<1, 1>(xp.add(r * k), wp, k, op.add(r * n), n),
                }
                r += (mr - r).min(2);
            }
        });
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tile256<const M: usize, const R: usize>(x: *const f32, w: *const f32, k: usize, out: *mut f32, n: usize) {
        let mut acc = [[_mm256_setzero_ps(); R]; M];
        let mut i = 0;
        while i + 8 <= k {
            let mut wv = [_mm256_setzero_ps(); R];
            for (c, v) in wv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(w.add(c * k + i));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add(r * k + i));
                for c in 0..R {
                    a[c] = _mm256_fmadd_ps(xv, wv[c], a[c]);
                }
            }
            i += 8;
        }
        for r in 0..M {
            for c in 0..R {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][c]);
                let mut s: f32 = lanes.iter().sum();
                for t in i..k {
                    s += *x.add(r * k + t) * *w.add(c * k + t);
                }
                *out.add(r * n + c) = s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], m: usize, w: &[f32], k: usize, n: usize) -> Vec<f32> {
        (0..m).flat_map(|r| (0..n).map(move |j| (0..k).map(|i| x[r * k + i] as f64 * w[j * k + i] as f64).sum::<f64>() as f32)).collect()
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    type Kernel = fn(&[f32], usize, &[f32], usize, usize, OutPtr, Range<usize>);

    fn kernels() -> Vec<(&'static str, Kernel)> {
        let mut ks: Vec<(&'static str, Kernel)> = vec![("portable", matmul_portable), ("dispatch", matmul)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                ks.push(("avx512", |x, m, w, k, n, o, c| unsafe { x86::matmul_avx512(x, m, w, k, n, o, c) }));
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                ks.push(("avx2", |x, m, w, k, n, o, c| unsafe { x86::matmul_avx2(x, m, w, k, n, o, c) }));
            }
        }
        ks
    }

    #[test]
    fn every_kernel_matches_the_naive_product_on_odd_shapes() {
        for (name, kernel) in kernels() {
            for &(m, k, n) in &[(1, 1, 1), (1, 17, 5), (2, 31, 9), (3, 64, 7), (5, 100, 13), (8, 15, 4), (9, 576, 11), (4, 33, 3)] {
                let (x, w) = (data(m * k, 1), data(n * k, 2));
                let want = naive(&x, m, &w, k, n);
                let mut got = vec![f32::NAN; m * n];
                // Two column ranges, as two threads would split them.
                let out = OutPtr::new(&mut got);
                kernel(&x, m, &w, k, n, out, 0..n / 2);
                kernel(&x, m, &w, k, n, out, n / 2..n);
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{name} m{m} k{k} n{n}: {a} vs {b}");
                }
            }
        }
    }
}
