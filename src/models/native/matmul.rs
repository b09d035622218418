//! f32 matrix products for a few activation rows against a weight matrix, `y[r][j] = x[r] · w[j]`.
//! Each weight row is streamed from memory once for all activation rows, so scoring k + 1
//! positions costs little more than scoring one.
//!
//! candle's CPU matmul is written for large products and pays a high fixed cost for 2..8 rows
//! against a transposed weight (docs/perf/kernels.md), so this small-M kernel is our own:
//! AVX-512 or AVX2+FMA chosen at run time, with a portable fallback. The weights are packed for
//! it: rows in tiles of four, interleaved 16 values at a time, so that a tile is one sequential
//! stream the hardware prefetcher follows (four separate 2 KB streams defeat it).

use std::ops::Range;

pub use super::out_ptr::OutPtr;
use super::pool::team;
use super::sizes::{product, round_up};
use crate::error::{Error, Result};

/// Activation rows processed together against one tile of weight rows. Four keep the 16
/// accumulators in registers; six (24 accumulators) made LLVM spill them to the stack, which
/// cost more than the second pass over the tile (from L1) that groups of four need for 5..8
/// rows.
const ROWS: usize = 4;
/// Weight rows per tile.
const TILE: usize = 4;
/// Values per interleaved slice.
const LANES: usize = 16;

/// A (rows, cols) f32 matrix packed for [`matmul`]: full tiles of four rows interleaved 16
/// values at a time, then the last `rows % 4` rows plainly; every row padded with zeros to a
/// multiple of 16 values.
#[derive(Debug, Clone)]
pub struct Packed {
    data: Vec<f32>,
    rows: usize,
    cols: usize,
    /// `cols` rounded up to a multiple of 16.
    stride: usize,
}

impl Packed {
    /// Packs `w`, row-major (rows, cols).
    ///
    /// # Errors
    /// [`Error::TooLarge`] when the packed size overflows `usize`; [`Error::InvalidSetting`]
    /// when `w` does not hold rows × cols values.
    pub fn pack(w: &[f32], rows: usize, cols: usize) -> Result<Self> {
        const WHAT: &str = "f32 matrix";
        let stride = round_up(WHAT, cols, LANES)?;
        let len = product(WHAT, &[rows, stride])?;
        if product(WHAT, &[rows, cols])? != w.len() {
            return Err(Error::setting(WHAT, format!("{} values for {rows}x{cols}", w.len()), "rows × cols values"));
        }
        let mut data = vec![0f32; len];
        for r in 0..rows {
            for c in 0..cols {
                data[Self::index(rows, stride, r, c)] = w[r * cols + c];
            }
        }
        Ok(Self { data, rows, cols, stride })
    }

    fn index(rows: usize, stride: usize, r: usize, c: usize) -> usize {
        let full = rows / TILE * TILE;
        if r < full {
            let (tile, i) = (r / TILE, r % TILE);
            tile * TILE * stride + (c / LANES) * TILE * LANES + i * LANES + c % LANES
        } else {
            r * stride + c
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Appends row `r` to `out`.
    pub fn row_into(&self, r: usize, out: &mut Vec<f32>) {
        out.extend((0..self.cols).map(|c| self.data[Self::index(self.rows, self.stride, r, c)]));
    }
}

/// `out = x · wᵀ` for `m` rows of `x` (each `w.cols()` long), into `out` (m × w.rows(),
/// row-major), the weight rows shared out over the thread team.
///
/// Panics if the sizes do not fit; callers check shapes when building a model.
pub fn matmul_parallel(x: &[f32], m: usize, w: &Packed, out: &mut [f32], grain: usize) {
    let dst = OutPtr::new(out);
    check(x, m, w, dst, &(0..w.rows));
    // Chunks of a multiple of 4 rows keep every range on whole tiles.
    let grain = grain.div_ceil(TILE).max(1) * TILE;
    // SAFETY: the team hands each job a distinct range of weight rows, so no two threads write
    // the same column of `out`.
    team().run(w.rows, grain, &|cols| unsafe { matmul(x, m, w, dst, cols) });
}

/// Columns `cols` of `y = x · wᵀ` for `m` rows of `x` (each `w.cols()` long), into `out`
/// (m × w.rows(), row-major), with the kernel [`crate::cpu::kernels`] chose. `cols` must not
/// split a 4-row tile (see `check`).
///
/// Panics if the sizes do not fit.
///
/// # Safety
/// No other thread may touch columns `cols` of `out` while this runs (threads given disjoint
/// `cols` may run at once on the same `out`).
pub unsafe fn matmul(x: &[f32], m: usize, w: &Packed, out: OutPtr, cols: Range<usize>) {
    check(x, m, w, out, &cols);
    #[cfg(target_arch = "x86_64")]
    {
        let level = crate::cpu::level();
        if level.wide() {
            // SAFETY: the wide levels are chosen only when the CPU has AVX-512 F and FMA; the
            // sizes were checked, and the caller owns `cols` of `out`.
            return unsafe { x86::matmul_avx512(x, m, w, out, cols) };
        }
        if level.simd() {
            // SAFETY: every SIMD level is chosen only when the CPU has AVX2 and FMA; as above.
            return unsafe { x86::matmul_avx2(x, m, w, out, cols) };
        }
    }
    // SAFETY: the caller owns `cols` of `out`.
    unsafe { matmul_portable(x, m, w, out, cols) }
}

/// The kernels walk whole 4-row tiles up to the last full one, so a range must start at a tile
/// and may end mid-tile only among the last `rows % 4` (untiled) rows.
fn check(x: &[f32], m: usize, w: &Packed, out: OutPtr, cols: &Range<usize>) {
    let full = w.rows / TILE * TILE;
    let tiles_whole = cols.start.is_multiple_of(TILE) && (cols.end.is_multiple_of(TILE) || cols.end >= full);
    // Checked products: a wrapped `m * cols` would pass for a huge `m` and let the kernels run
    // past both buffers.
    let fits = |len: usize, n: usize| m.checked_mul(n).is_some_and(|need| len >= need);
    assert!(
        fits(x.len(), w.cols) && fits(out.len(), w.rows) && cols.start <= cols.end && cols.end <= w.rows && tiles_whole,
        "matmul sizes"
    );
}

/// The reference kernel, also the fallback (the kernel of CPUs without AVX2, aarch64 among
/// them): it reads the packed tiles in order and keeps 16 partial sums per weight row, plain
/// loops that the compiler turns into SSE2 or NEON code without reordering any sum by itself.
///
/// # Safety
/// As [`matmul`].
pub unsafe fn matmul_portable(x: &[f32], m: usize, w: &Packed, out: OutPtr, cols: Range<usize>) {
    check(x, m, w, out, &cols);
    let (k, n, full) = (w.cols, w.rows, w.rows / TILE * TILE);
    let mut j = cols.start;
    while j < cols.end {
        let rows = if j < full { TILE } else { 1 };
        let tile = &w.data[j * w.stride..(j + rows) * w.stride];
        for (r, xr) in x.chunks_exact(k).take(m).enumerate() {
            let mut lanes = [[0f32; LANES]; TILE];
            for (c, xs) in xr.chunks(LANES).enumerate() {
                let slices = tile[c * rows * LANES..(c + 1) * rows * LANES].chunks_exact(LANES);
                for (acc, ws) in lanes.iter_mut().zip(slices) {
                    for ((a, &wv), &xv) in acc.iter_mut().zip(ws).zip(xs) {
                        *a += wv * xv;
                    }
                }
            }
            for (i, acc) in lanes.iter().take(rows).enumerate() {
                // SAFETY: `write` checks the bounds; the caller owns columns `cols` of `out`.
                unsafe { out.write(r * n + j + i, acc.iter().sum()) };
            }
        }
        j += rows;
    }
}

// The kernels index register arrays by (row, column) to mirror the tile's math.
#[allow(clippy::needless_range_loop)]
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{OutPtr, Packed, LANES, ROWS, TILE};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Walks the column range tile by tile (then single rows) and the activation rows in
    /// groups of up to `group_rows`, calling `f(x, group, weights, tile rows, out)`.
    ///
    /// # Safety
    /// The sizes were checked by `check`, and the caller owns columns `cols` of `out`; `f`
    /// reads `group` rows of `x` and the tile and writes `group` × `tile rows` outputs.
    #[inline(always)]
    unsafe fn drive(
        x: &[f32],
        m: usize,
        w: &Packed,
        out: OutPtr,
        cols: Range<usize>,
        group_rows: usize,
        f: impl Fn(*const f32, usize, *const f32, usize, *mut f32),
    ) {
        // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
        // target features it is compiled for); the operations below rely on nothing else.
        unsafe {
            let (k, n, full) = (w.cols, w.rows, w.rows / TILE * TILE);
            let mut j = cols.start;
            while j < cols.end {
                let rows = if j < full { TILE } else { 1 };
                let mut r = 0;
                while r < m {
                    let group = (m - r).min(group_rows);
                    f(
                        x.as_ptr().add(r * k),
                        group,
                        w.data.as_ptr().add(j * w.stride),
                        rows,
                        out.as_ptr().add(r * n + j),
                    );
                    r += group;
                }
                j += rows;
            }
        }
    }

    /// # Safety
    /// The CPU has AVX-512 F and FMA; otherwise as [`super::matmul`].
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn matmul_avx512(x: &[f32], m: usize, w: &Packed, out: OutPtr, cols: Range<usize>) {
        // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
        // target features it is compiled for); the operations below rely on nothing else.
        unsafe {
            let (k, n) = (w.cols, w.rows);
            drive(x, m, w, out, cols, ROWS, |xp, group, wp, rows, op| match (group, rows) {
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
    }

    /// `out[r·n + i] = x[r] · w_i` for r < M and the R rows of a packed tile at `w`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and FMA; `x` holds M rows of `k` values, `w` a packed tile of R
    /// rows, `out` M rows of stride `n` with R writable values each, owned by the caller.
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    unsafe fn tile512<const M: usize, const R: usize>(x: *const f32, w: *const f32, k: usize, out: *mut f32, n: usize) {
        // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
        // target features it is compiled for); the operations below rely on nothing else.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); R]; M];
            let chunks = k.div_ceil(LANES);
            for c in 0..chunks {
                let base = w.add(c * R * LANES);
                let mut wv = [_mm512_setzero_ps(); R];
                for (i, v) in wv.iter_mut().enumerate() {
                    // Fetch the same lines two tiles ahead into L2, so that memory streams them
                    // while this tile is computed: the hardware prefetcher alone leaves several
                    // rows slow, and one tile ahead into L1 slows the single row (the L1 miss
                    // slots fill; docs/perf/kernels.md).
                    _mm_prefetch::<_MM_HINT_T1>(base.wrapping_add(2 * chunks * R * LANES + i * LANES) as *const i8);
                    *v = _mm512_loadu_ps(base.add(i * LANES));
                }
                let left = k - c * LANES;
                let mask: __mmask16 = if left >= LANES { 0xFFFF } else { ((1u32 << left) - 1) as u16 };
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = _mm512_maskz_loadu_ps(mask, x.add(r * k + c * LANES));
                    for i in 0..R {
                        a[i] = _mm512_fmadd_ps(xv, wv[i], a[i]);
                    }
                }
            }
            for r in 0..M {
                for i in 0..R {
                    *out.add(r * n + i) = _mm512_reduce_add_ps(acc[r][i]);
                }
            }
        }
    }

    /// Activation rows per group of the AVX2 kernel: 3 × 4 accumulators and the 4 weight
    /// vectors of a slice fill its 16 registers.
    const ROWS_256: usize = 3;

    /// # Safety
    /// The CPU has AVX2 and FMA; otherwise as [`super::matmul`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn matmul_avx2(x: &[f32], m: usize, w: &Packed, out: OutPtr, cols: Range<usize>) {
        // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
        // target features it is compiled for); the operations below rely on nothing else.
        unsafe {
            let (k, n) = (w.cols, w.rows);
            drive(x, m, w, out, cols, ROWS_256, |xp, group, wp, rows, op| match (group, rows) {
                (1, TILE) => tile256::<1, TILE>(xp, wp, k, op, n),
                (2, TILE) => tile256::<2, TILE>(xp, wp, k, op, n),
                (_, TILE) => tile256::<3, TILE>(xp, wp, k, op, n),
                (1, _) => tile256::<1, 1>(xp, wp, k, op, n),
                (2, _) => tile256::<2, 1>(xp, wp, k, op, n),
                _ => tile256::<3, 1>(xp, wp, k, op, n),
            });
        }
    }

    /// As `tile512`, eight lanes at a time over the 16-value slices, scalar tail.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; otherwise as `tile512`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tile256<const M: usize, const R: usize>(x: *const f32, w: *const f32, k: usize, out: *mut f32, n: usize) {
        // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
        // target features it is compiled for); the operations below rely on nothing else.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); R]; M];
            let full = k / LANES;
            for c in 0..full {
                let base = w.add(c * R * LANES);
                for i in 0..R {
                    // Two tiles ahead into L2, as in `tile512` (this kernel reads the rows at the
                    // same speed, so the same distance serves).
                    _mm_prefetch::<_MM_HINT_T1>(
                        base.wrapping_add(2 * k.div_ceil(LANES) * R * LANES + i * LANES) as *const i8
                    );
                }
                for half in 0..2 {
                    for i in 0..R {
                        let wv = _mm256_loadu_ps(base.add(i * LANES + half * 8));
                        for (r, a) in acc.iter_mut().enumerate() {
                            a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(r * k + c * LANES + half * 8)), wv, a[i]);
                        }
                    }
                }
            }
            for r in 0..M {
                for i in 0..R {
                    let mut lanes = [0f32; 8];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][i]);
                    let mut s: f32 = lanes.iter().sum();
                    for t in full * LANES..k {
                        s += *x.add(r * k + t) * *w.add(full * R * LANES + i * LANES + (t - full * LANES));
                    }
                    *out.add(r * n + i) = s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], m: usize, w: &[f32], k: usize, n: usize) -> Vec<f32> {
        (0..m)
            .flat_map(|r| {
                (0..n).map(move |j| (0..k).map(|i| x[r * k + i] as f64 * w[j * k + i] as f64).sum::<f64>() as f32)
            })
            .collect()
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    type Kernel = fn(&[f32], usize, &Packed, OutPtr<'_>, Range<usize>);

    fn kernels() -> Vec<(&'static str, Kernel)> {
        // SAFETY (all of these): the CPU has the features, and the tests call each kernel on
        // one thread at a time with fitting sizes.
        let mut ks: Vec<(&'static str, Kernel)> = vec![
            // SAFETY: one thread at a time, with fitting sizes.
            ("portable", |x, m, w, o, c| unsafe { matmul_portable(x, m, w, o, c) }),
            // SAFETY: one thread at a time, with fitting sizes.
            ("dispatch", |x, m, w, o, c| unsafe { matmul(x, m, w, o, c) }),
        ];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has the features (checked just above).
                ks.push(("avx512", |x, m, w, o, c| unsafe { x86::matmul_avx512(x, m, w, o, c) }));
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has the features (checked just above).
                ks.push(("avx2", |x, m, w, o, c| unsafe { x86::matmul_avx2(x, m, w, o, c) }));
            }
        }
        ks
    }

    #[test]
    fn packing_keeps_every_row() {
        for &(n, k) in &[(1, 1), (5, 17), (8, 32), (11, 100)] {
            let w = data(n * k, 4);
            let p = Packed::pack(&w, n, k).expect("pack");
            for r in 0..n {
                let mut row = Vec::new();
                p.row_into(r, &mut row);
                assert_eq!(row, &w[r * k..(r + 1) * k]);
            }
        }
    }

    #[test]
    fn packing_overflowing_or_mismatched_sizes_is_an_error() {
        // 2^62 rows of 16 values: the packed length overflows, though the rows alone do not.
        assert!(matches!(Packed::pack(&[], 1 << 62, 16), Err(Error::TooLarge { .. })));
        // Columns that overflow when rounded up to the 16-value slices.
        assert!(matches!(Packed::pack(&[], 0, usize::MAX - 1), Err(Error::TooLarge { .. })));
        assert!(matches!(Packed::pack(&[], usize::MAX, usize::MAX), Err(Error::TooLarge { .. })));
        // Fewer values than rows × cols: refused before packing reads past them.
        assert!(matches!(Packed::pack(&[1.0; 5], 2, 3), Err(Error::InvalidSetting { .. })));
    }

    #[test]
    fn every_kernel_matches_the_naive_product_on_odd_shapes() {
        for (name, kernel) in kernels() {
            for &(m, k, n) in &[
                (1, 1, 1),
                (1, 17, 5),
                (2, 31, 9),
                (3, 64, 7),
                (5, 100, 13),
                (8, 15, 4),
                (9, 576, 11),
                (4, 33, 3),
                (6, 48, 21),
            ] {
                let (x, w) = (data(m * k, 1), data(n * k, 2));
                let packed = Packed::pack(&w, n, k).expect("pack");
                let want = naive(&x, m, &w, k, n);
                let mut got = vec![f32::NAN; m * n];
                // Two column ranges, as two threads would split them (at a tile boundary).
                let out = OutPtr::new(&mut got);
                let split = (n / 2) / 4 * 4;
                kernel(&x, m, &packed, out, 0..split);
                kernel(&x, m, &packed, out, split..n);
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{name} m{m} k{k} n{n}: {a} vs {b}");
                }
            }
        }
    }
}
