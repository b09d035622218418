//! The AVX-512 VNNI kernel for the quantized products: one `vpdpbusd` per 64 values, the
//! integer sums of a lane group (256 values) added in one register and scaled once (see the
//! parent module for the layout and the math).

// The kernel indexes register arrays by (row, column) to mirror the tile's math.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{
    group_count, groups, pass_at, pass_blocks, Acts, Bits, QActs, QMatrix, Scales, Weights, CHUNK, GROUP, PASS_ROWS,
};
use crate::models::native::out_ptr::OutPtr;

/// Weight rows per tile (at most 4: the tile's sums are reduced four at a time): 2 × 4 codes,
/// 2 × 6 sums (a pass's `PASS_ROWS` activation rows) and their scales fill the 32 registers.
const TILE: usize = 2;
/// Weight rows ahead whose bytes are prefetched into L2.
const AHEAD: usize = 8;

/// The AVX-512 VNNI kernel.
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL and VNNI, and the sizes were checked as in
/// [`super::qmatmul`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn qmatmul_vnni(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        // One compiled kernel per code width, so that no test on it is left inside the loops.
        match w.bits {
            Bits::Four => tiles::<4>(a, w, out, cols),
            Bits::Five => tiles::<5>(a, w, out, cols),
            Bits::Six => tiles::<6>(a, w, out, cols),
            Bits::Eight => tiles::<8>(a, w, out, cols),
        }
    }
}

/// [`qmatmul_vnni`] for codes of `BITS` bits.
///
/// # Safety
/// As [`qmatmul_vnni`], with `w.bits` of `BITS` bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tiles<const BITS: u8>(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let mut panel = Panel::default();
        for block in pass_blocks(a.rows, w.padded) {
            let mut c = cols.start;
            while c < cols.end {
                let tile = if cols.end - c >= TILE { TILE } else { 1 };
                for p in block.clone() {
                    let (r, g) = pass_at(a.rows, p);
                    let at = ((r, c), (p - block.start, block.len()));
                    match (g, tile) {
                        (1, TILE) => pass::<1, TILE, BITS>(a, w, at, out, &mut panel),
                        (2, TILE) => pass::<2, TILE, BITS>(a, w, at, out, &mut panel),
                        (3, TILE) => pass::<3, TILE, BITS>(a, w, at, out, &mut panel),
                        (4, TILE) => pass::<4, TILE, BITS>(a, w, at, out, &mut panel),
                        (5, TILE) => pass::<5, TILE, BITS>(a, w, at, out, &mut panel),
                        (_, TILE) => pass::<PASS_ROWS, TILE, BITS>(a, w, at, out, &mut panel),
                        (1, _) => pass::<1, 1, BITS>(a, w, at, out, &mut panel),
                        (2, _) => pass::<2, 1, BITS>(a, w, at, out, &mut panel),
                        (3, _) => pass::<3, 1, BITS>(a, w, at, out, &mut panel),
                        (4, _) => pass::<4, 1, BITS>(a, w, at, out, &mut panel),
                        (5, _) => pass::<5, 1, BITS>(a, w, at, out, &mut panel),
                        _ => pass::<PASS_ROWS, 1, BITS>(a, w, at, out, &mut panel),
                    }
                }
                c += tile;
            }
        }
    }
}

/// Pass `p` of the `count` of a block, M activation rows from `r0` over the R weight rows from
/// `c0`: the first unpacks the weight rows (keeping them in `panel` when more passes follow),
/// the others read them from `panel`.
///
/// # Safety
/// As [`tiles`], with `r0 + M <= a.rows` and `c0 + R` within its columns.
#[inline(always)]
unsafe fn pass<const M: usize, const R: usize, const BITS: u8>(
    a: &QActs,
    w: &QMatrix,
    ((r0, c0), (p, count)): ((usize, usize), (usize, usize)),
    out: OutPtr,
    panel: &mut Panel,
) {
    // SAFETY: as this function's contract.
    unsafe {
        if p == 0 {
            tile_vnni::<M, R, BITS>(a, w, (r0, c0), out, (count > 1).then_some(panel));
        } else {
            tile_panel::<M, R>(a, w, panel, (r0, c0), out);
        }
    }
}

/// The high bits of a chunk's 5- or 6-bit codes at `p` (see [`Bits`]), shifted into bits 4..6
/// of each byte in the chunk's lane order.
///
/// # Safety
/// AVX-512 F and BW; `p` points at `8·hb` readable bytes; `hb` is 1 or 2.
#[inline(always)]
unsafe fn high_bits(p: *const u8, hb: usize) -> __m512i {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        // Byte b of qword k (Five) or of 128-bit lane k (Six) holds its bits at hb·k: rotate each
        // copy's qwords so that those land at bit 4 of every byte (left by 4 − hb·k, modulo 64:
        // no byte's bits wrap into another's) and keep them.
        let (copies, turns, mask) = if hb == 1 {
            let v = _mm512_set1_epi64(std::ptr::read_unaligned(p as *const i64));
            (v, _mm512_setr_epi64(4, 3, 2, 1, 0, 63, 62, 61), 0x10)
        } else {
            let v = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
            (v, _mm512_setr_epi64(4, 4, 2, 2, 0, 0, 62, 62), 0x30)
        };
        _mm512_and_si512(_mm512_rolv_epi64(copies, turns), _mm512_set1_epi8(mask))
    }
}

/// The codes of the `C` chunks from `start` of weight row `i`, in lane order.
///
/// # Safety
/// AVX-512 F and BW; the chunks lie within row `i`; `C` is 4, 2 or 1 (1 only for an unpaired
/// last chunk of nibbles).
#[inline(always)]
unsafe fn codes<const BITS: u8, const C: usize>(w: Weights, i: usize, start: usize) -> [__m512i; C] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let mut out = [_mm512_setzero_si512(); C];
        if BITS == 8 {
            for (c, o) in out.iter_mut().enumerate() {
                *o = _mm512_loadu_si512(w.qs.add(i * w.row_bytes + (start + c) * CHUNK) as *const _);
            }
            return out;
        }
        let at = w.qs.add(i * w.row_bytes + start * 32);
        if C == 1 {
            // An unpaired last chunk: low nibbles hold positions 0..32, high ones 32..64.
            let v = _mm256_loadu_si256(at as *const __m256i);
            let lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
            out[0] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        } else {
            // Byte j of a chunk pair holds position j of its first chunk (low nibble) and of its
            // second (high).
            for pair in 0..C / 2 {
                let v = _mm512_loadu_si512(at.add(pair * CHUNK) as *const _);
                out[2 * pair] = _mm512_and_si512(v, low);
                out[2 * pair + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
        }
        if BITS != 4 {
            let hb = if BITS == 5 { 1 } else { 2 };
            for (c, o) in out.iter_mut().enumerate() {
                *o = _mm512_or_si512(*o, high_bits(w.plane.add(i * w.hi_row + (start + c) * 8 * hb), hb));
            }
        }
        out
    }
}

/// The scales and offsets of weight row `i` over the group of `C` chunks from `start`, one
/// per lane.
///
/// # Safety
/// AVX-512 F; the group lies within row `i`; `C` is 4 for the K-quants (whose rows are whole
/// groups).
#[inline(always)]
unsafe fn scales<const C: usize>(w: Weights, i: usize, start: usize) -> (__m512, __m512) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let (per_d, per_m, per_sub) = w.per_row;
        match w.scales {
            Scales::Block { implied } => {
                let d = per_block::<C>(w.d.add(i * per_d + start * 2));
                let m = match implied {
                    Some(k) => _mm512_mul_ps(d, _mm512_set1_ps(k)),
                    None => per_block::<C>(w.m.add(i * per_m + start * 2)),
                };
                (d, m)
            }
            Scales::Super => {
                // The 8 `sc` then the 8 `mn` as 16 floats; lanes 2j, 2j + 1 hold block j.
                let g = start / GROUP;
                let bytes = _mm_loadu_si128(w.sub.add(i * per_sub + 16 * g) as *const __m128i);
                let both = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
                let lanes = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
                let (sc, mn) = (
                    _mm512_permutexvar_ps(lanes, both),
                    _mm512_permutexvar_ps(_mm512_add_epi32(lanes, _mm512_set1_epi32(8)), both),
                );
                let (d, dmin) = (splat(*w.d.add(i * per_d + g)), splat(*w.m.add(i * per_m + g)));
                (_mm512_mul_ps(d, sc), _mm512_fnmadd_ps(dmin, mn, _mm512_setzero_ps()))
            }
            Scales::Six => {
                // One i8 scale a lane.
                let g = start / GROUP;
                let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                    w.sub.add(i * per_sub + 16 * g) as *const __m128i
                )));
                let d = _mm512_mul_ps(splat(*w.d.add(i * per_d + g)), sc);
                (d, _mm512_mul_ps(d, _mm512_set1_ps(-32.0)))
            }
        }
    }
}

/// f16 bits as an f32 in every lane.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
unsafe fn splat(bits: u16) -> __m512 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe { _mm512_cvtph_ps(_mm256_set1_epi16(bits as i16)) }
}

/// Per-32 f16 values from `p` over a group of `C` chunks, one per lane: block j of the group's
/// 2·C on lanes 8j/C .. 8(j+1)/C.
///
/// # Safety
/// AVX-512 F; `p` points at 2·C readable values.
#[inline(always)]
unsafe fn per_block<const C: usize>(p: *const u16) -> __m512 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let (halves, lane_block) = match C {
            4 => (
                _mm_loadu_si128(p as *const __m128i),
                _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
            ),
            2 => (
                _mm_loadl_epi64(p as *const __m128i),
                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
            ),
            _ => (
                _mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)),
                _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            ),
        };
        _mm512_permutexvar_ps(lane_block, _mm512_cvtph_ps(_mm256_castsi128_si256(halves)))
    }
}

/// One lane group of R weight rows, unpacked: per row its `C` chunks' codes in lane order, and
/// its scales and offsets one per lane.
type Unpacked<const R: usize, const C: usize> = ([[__m512i; C]; R], [__m512; R], [__m512; R]);

/// Unpacks the group of `C` chunks from `start` (group number `g`) of R weight rows, and
/// prefetches what the same group of the rows `AHEAD` on needs.
///
/// # Safety
/// AVX-512 F and BW (inlined into a caller that has them); the group lies within the rows.
#[inline(always)]
unsafe fn unpack<const R: usize, const BITS: u8, const C: usize>(w: Weights, start: usize, g: usize) -> Unpacked<R, C> {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        // The bytes this group needs `AHEAD` rows on, into L2; the scales' lines every fourth
        // group, which covers them (asked for every group, the prefetches' own instructions
        // cost arithmetic; docs/perf/kernels.md).
        for i in 0..R {
            w.prefetch(i, AHEAD, start, g, C, BITS, (true, g.is_multiple_of(4)));
        }
        // (Loops, not `array::from_fn`: a closure would not inherit the target features, and its
        // intrinsics would become calls.)
        let mut q = [[_mm512_setzero_si512(); C]; R];
        let (mut scale, mut offset) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
        for i in 0..R {
            q[i] = codes::<BITS, C>(w, i, start);
            (scale[i], offset[i]) = scales::<C>(w, i, start);
        }
        (q, scale, offset)
    }
}

/// Adds the group of `C` chunks from `start` (group number `g`) of R unpacked weight rows times
/// M activation rows into `acc`: each product sums its C chunks in one i32 register and is
/// scaled once.
///
/// # Safety
/// AVX-512 F and VNNI (inlined into a caller that has them); the group lies within the rows.
#[inline(always)]
unsafe fn dots<const M: usize, const R: usize, const C: usize>(
    acc: &mut [[__m512; R]; M],
    (q, scale, offset): &Unpacked<R, C>,
    x: Acts,
    start: usize,
    g: usize,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let (xg, (dxg, sxg)) = (x.codes(start), x.lanes(g));
        for r in 0..M {
            let xq = xg.add(r * C * CHUNK);
            let mut xs = [_mm512_setzero_si512(); C];
            for c in 0..C {
                xs[c] = _mm512_loadu_si512(xq.add(c * CHUNK) as *const _);
            }
            let (dx, sx) = (_mm512_loadu_ps(dxg.add(16 * r)), _mm512_loadu_ps(sxg.add(16 * r)));
            for i in 0..R {
                let mut dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[i][0], xs[0]);
                for c in 1..C {
                    dot = _mm512_dpbusd_epi32(dot, q[i][c], xs[c]);
                }
                acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale[i], dx), acc[r][i]);
                acc[r][i] = _mm512_fmadd_ps(offset[i], sx, acc[r][i]);
            }
        }
    }
}

/// Adds the group of `C` chunks from `start` (group number `g`) of R weight rows times M
/// activation rows into `acc`, the R rows' codes unpacked once for the M rows, and kept in
/// `keep` for the passes after this one.
///
/// # Safety
/// AVX-512 F, BW and VNNI (inlined into a caller that has them); the group lies within the
/// rows; `keep` was prepared for R rows of this width.
#[inline(always)]
unsafe fn group<const M: usize, const R: usize, const BITS: u8, const C: usize>(
    acc: &mut [[__m512; R]; M],
    w: Weights,
    x: Acts,
    (start, g): (usize, usize),
    keep: &mut Option<&mut Panel>,
) {
    // SAFETY: as this function's contract.
    unsafe {
        let unpacked = unpack::<R, BITS, C>(w, start, g);
        if let Some(panel) = keep {
            put(panel.slots(R, g), unpacked);
        }
        dots::<M, R, C>(acc, &unpacked, x, start, g)
    }
}

/// `out[r][c] = x_r · w_c` for M activation rows from `r0` and R weight rows from `c0`; with
/// `keep`, the weight rows' unpacked codes and scales are kept there for [`tile_panel`]. (The
/// first pass of a block unpacks while the weights stream in, as a lone pass does; the
/// passes after it read the panel.)
///
/// # Safety
/// As `qmatmul_vnni`, with `r0 + M <= a.rows` and `c0 + R` within the caller's columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile_vnni<const M: usize, const R: usize, const BITS: u8>(
    a: &QActs,
    w: &QMatrix,
    (r0, c0): (usize, usize),
    out: OutPtr,
    mut keep: Option<&mut Panel>,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let chunks = w.padded / CHUNK;
        if let Some(panel) = &mut keep {
            panel.prepare(R, chunks);
        }
        let (wts, x) = (Weights::new(w, c0), Acts::new(a, r0, M));
        let mut acc = [[_mm512_setzero_ps(); R]; M];
        for (g, (start, n)) in groups(chunks).enumerate() {
            match n {
                GROUP => group::<M, R, BITS, GROUP>(&mut acc, wts, x, (start, g), &mut keep),
                2 => group::<M, R, BITS, 2>(&mut acc, wts, x, (start, g), &mut keep),
                _ => group::<M, R, BITS, 1>(&mut acc, wts, x, (start, g), &mut keep),
            }
        }
        store(&acc, r0, c0, w.rows, out);
    }
}

/// Writes a tile's sums `acc` (M activation rows from `r0`, R weight rows from `c0`) into
/// `out`, a matrix `columns` wide.
///
/// # Safety
/// AVX-512 F (inlined into a caller that has it); the caller owns those entries of `out`.
#[inline(always)]
unsafe fn store<const M: usize, const R: usize>(
    acc: &[[__m512; R]; M],
    r0: usize,
    c0: usize,
    columns: usize,
    out: OutPtr,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        for r in 0..M {
            // Every tile width sums a product in the same order, so a column's value does not
            // depend on the tile it falls in.
            let v = |i: usize| if i < R { acc[r][i] } else { _mm512_setzero_ps() };
            let mut sums = [0f32; 4];
            _mm_storeu_ps(sums.as_mut_ptr(), reduce4(v(0), v(1), v(2), v(3)));
            for (i, &s) in sums.iter().enumerate().take(R) {
                out.write((r0 + r) * columns + c0 + i, s);
            }
        }
    }
}

/// Vectors per group and weight row in a [`Panel`]: 4 chunks of codes, the scales, the
/// offsets.
const SLOTS: usize = GROUP + 2;

/// A tile's weight rows unpacked once for all the passes of a block (a prompt's rows): per
/// lane group, per row, [`SLOTS`] vectors. The passes then read codes and scales ready to use
/// instead of unpacking them again each (the same values, so the same sums, bit for bit).
#[derive(Default)]
struct Panel(Vec<__m512i>);

impl Panel {
    /// Makes room for R weight rows of `chunks` chunks.
    fn prepare(&mut self, rows: usize, chunks: usize) {
        // SAFETY: an all-zero vector is a valid `__m512i`.
        self.0.resize(group_count(chunks) * rows * SLOTS, unsafe { std::mem::zeroed() });
    }

    /// The slots of group `g` of a panel of `rows` weight rows.
    fn slots(&mut self, rows: usize, g: usize) -> &mut [__m512i] {
        &mut self.0[g * rows * SLOTS..][..rows * SLOTS]
    }

    /// The group `g` of `C` chunks, as [`unpack`] gave it.
    ///
    /// # Safety
    /// AVX-512 F; the panel was filled with R rows and has group `g`.
    #[inline(always)]
    unsafe fn get<const R: usize, const C: usize>(&self, g: usize) -> Unpacked<R, C> {
        // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
        // target features it is compiled for); the operations below rely on nothing else.
        unsafe {
            let slots = &self.0[g * R * SLOTS..][..R * SLOTS];
            let mut q = [[_mm512_setzero_si512(); C]; R];
            let (mut scale, mut offset) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
            for i in 0..R {
                for c in 0..C {
                    q[i][c] = slots[i * SLOTS + c];
                }
                scale[i] = _mm512_castsi512_ps(slots[i * SLOTS + GROUP]);
                offset[i] = _mm512_castsi512_ps(slots[i * SLOTS + GROUP + 1]);
            }
            (q, scale, offset)
        }
    }
}

/// Stores one unpacked group into its panel slots.
#[inline(always)]
fn put<const R: usize, const C: usize>(slots: &mut [__m512i], (q, scale, offset): Unpacked<R, C>) {
    for i in 0..R {
        slots[i * SLOTS..][..C].copy_from_slice(&q[i]);
        // SAFETY: a bit cast between vectors of the same size.
        (slots[i * SLOTS + GROUP], slots[i * SLOTS + GROUP + 1]) = unsafe {
            (std::mem::transmute::<__m512, __m512i>(scale[i]), std::mem::transmute::<__m512, __m512i>(offset[i]))
        };
    }
}

/// [`tile_vnni`] with the R weight rows from `c0` read from `panel`: the same sums in the same
/// order.
///
/// # Safety
/// As `tile_vnni`, with `panel` filled from those rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile_panel<const M: usize, const R: usize>(
    a: &QActs,
    w: &QMatrix,
    panel: &Panel,
    (r0, c0): (usize, usize),
    out: OutPtr,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let x = Acts::new(a, r0, M);
        let mut acc = [[_mm512_setzero_ps(); R]; M];
        for (g, (start, n)) in groups(w.padded / CHUNK).enumerate() {
            match n {
                GROUP => dots::<M, R, GROUP>(&mut acc, &panel.get::<R, GROUP>(g), x, start, g),
                2 => dots::<M, R, 2>(&mut acc, &panel.get::<R, 2>(g), x, start, g),
                _ => dots::<M, R, 1>(&mut acc, &panel.get::<R, 1>(g), x, start, g),
            }
        }
        store(&acc, r0, c0, w.rows, out);
    }
}

/// The lane sums of four vectors, as one vector `[Σa, Σb, Σc, Σd]`: a transposing tree of
/// adds, cheaper than four reductions. (Each sum's order is fixed, whatever the tile.)
///
/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn reduce4(a: __m512, b: __m512, c: __m512, d: __m512) -> __m128 {
    // Halves: [a.lo + a.hi, b.lo + b.hi] (256 bits each).
    let ab = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b));
    let cd = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(c, d), _mm512_shuffle_f32x4::<0xEE>(c, d));
    // Quarters: 128-bit lanes [a, b, c, d], each the sum of its vector's four quarters.
    let q = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(ab, cd), _mm512_shuffle_f32x4::<0xDD>(ab, cd));
    // Within each quarter: all four lanes become its sum.
    let q = _mm512_add_ps(q, _mm512_permute_ps::<0x4E>(q));
    let q = _mm512_add_ps(q, _mm512_permute_ps::<0xB1>(q));
    _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), q))
}
