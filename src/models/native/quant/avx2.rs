//! 256-bit kernels for the quantized products: AVX2 (`vpmaddubsw` + `vpmaddwd`, the integer dot
//! every AVX2 CPU has) and AVX-VNNI (the VEX `vpdpbusd`), one body for both.
//!
//! Lanes: a 32-byte half of a 64-value chunk holds 4 values of block 0, 4 of block 1, and so
//! on, so both instructions leave i32 lanes that alternate between the chunk's two blocks, and
//! one `[s0, s1, s0, s1, …]` broadcast scales them (as in the AVX-512 kernel).
//!
//! `vpmaddubsw` adds two u8 × i8 products into an i16 with saturation. 4-bit codes (≤ 15) can
//! never saturate it, even with the two halves of a chunk added in i16 (≤ 4 × 15 × 127). 8-bit
//! codes (0..=255) could, so AVX2 turns them into signed codes `s = q − 128` (one `xor`) and
//! multiplies `|x|` by `s` with the sign of `x` moved onto `s`: each pair is then at most
//! 2 × 127 × 128 < 2^15. The `−128` is paid back in the offset term:
//! `Σ d·dx·Σq·xq = Σ d·dx·Σs·xq + Σ 128·d·sx`.
//!
//! 5- and 6-bit codes (≤ 63) cannot saturate either: a pair is at most 2 × 63 × 127, and Q6_K's
//! halves, with their own scales, are never added in i16.
//!
//! Registers: AVX2 has 16. A tile of 2 weight rows and up to 3 activation rows keeps 6
//! accumulators, the 4 code registers of one weight row's chunk pair and its 2 scales live, with
//! room for the temporaries.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{half, Bits, QActs, QMatrix, CHUNK};
use crate::models::native::out_ptr::OutPtr;

/// Weight rows per tile and activation rows per group.
const TILE: usize = 2;
const GROUP: usize = 3;
/// Weight rows ahead whose bytes are prefetched into L2 (the same bytes ahead as the AVX-512
/// kernel's two 4-row tiles).
const AHEAD: usize = 8;

/// The AVX2 kernel.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and the sizes were checked as in [`super::qmatmul`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qmatmul_avx2(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    drive::<false>(a, w, out, cols)
}

/// The AVX-VNNI kernel.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-VNNI, and the sizes were checked as in
/// [`super::qmatmul`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn qmatmul_avxvnni(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    drive::<true>(a, w, out, cols)
}

/// Walks `cols` in tiles of weight rows and the activation rows in groups.
///
/// # Safety
/// As the entry points: the features (AVX-VNNI too when `VNNI`), checked sizes, and `cols` of
/// `out` owned by the caller.
#[inline(always)]
unsafe fn drive<const VNNI: bool>(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    let mut c = cols.start;
    while c < cols.end {
        let tile = if cols.end - c >= TILE { TILE } else { 1 };
        let mut r = 0;
        while r < a.rows {
            let g = (a.rows - r).min(GROUP);
            match (g, tile) {
                (1, TILE) => tile_256::<1, TILE, VNNI>(a, w, r, c, &out),
                (2, TILE) => tile_256::<2, TILE, VNNI>(a, w, r, c, &out),
                (_, TILE) => tile_256::<3, TILE, VNNI>(a, w, r, c, &out),
                (1, _) => tile_256::<1, 1, VNNI>(a, w, r, c, &out),
                (2, _) => tile_256::<2, 1, VNNI>(a, w, r, c, &out),
                _ => tile_256::<3, 1, VNNI>(a, w, r, c, &out),
            }
            r += g;
        }
        c += tile;
    }
}

/// Activation rows `r0..r0 + M` as raw pointers.
#[derive(Clone, Copy)]
struct Rows {
    xq: *const i8,
    dx: *const f32,
    padded: usize,
    nb: usize,
}

/// Weight rows from a tile's first: the high plane and the scales as raw pointers.
#[derive(Clone, Copy)]
struct Weights {
    plane: *const u8,
    hi_row: usize,
    hb: usize,
    six: bool,
    d: *const u16,
    n_scales: usize,
}

/// `out[r][c] = x_r · w_c` for M activation rows from `r0` and R weight rows from `c0`.
///
/// # Safety
/// As `drive`, with `r0 + M <= a.rows` and `c0 + R` within the caller's columns.
#[inline(always)]
unsafe fn tile_256<const M: usize, const R: usize, const VNNI: bool>(
    a: &QActs,
    w: &QMatrix,
    r0: usize,
    c0: usize,
    out: &OutPtr,
) {
    let nb = w.padded / 32;
    let chunks = w.padded / CHUNK;
    let nibbles = w.bits != Bits::Eight;
    let (six, hb) = (w.bits == Bits::Six, w.bits.high_bits());
    let row_bytes = w.bits.row_bytes(w.padded);
    let hi_row = w.hi_row_bytes();
    // Scales per weight row: per 32 values, or per 16 for Six.
    let n_scales = if six { 2 * nb } else { nb };
    let qs = w.qs.as_ptr().add(c0 * row_bytes);
    let plane = w.hi.as_ptr().add(c0 * hi_row);
    let wd = w.d.as_ptr().add(c0 * n_scales);
    let x = Rows { xq: a.xq.as_ptr().add(r0 * a.padded), dx: a.dx.as_ptr().add(r0 * nb), padded: a.padded, nb };
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    // Chunk p of weight row i: its codes (the nibbles with the high plane or'd in) into `acc_i`.
    // (A function, not a closure: a closure here would not inherit the caller's target
    // features, and its intrinsics would become calls.)
    #[inline(always)]
    unsafe fn chunk<const M: usize, const VNNI: bool>(
        acc_i: &mut [__m256; M],
        mut codes: [__m256i; 2],
        w: Weights,
        x: Rows,
        i: usize,
        p: usize,
    ) {
        if w.hb > 0 {
            let h = high_bits(w.plane.add(i * w.hi_row + p * 8 * w.hb), w.hb);
            codes = [_mm256_or_si256(codes[0], h[0]), _mm256_or_si256(codes[1], h[1])];
        }
        if w.six {
            let s = w.d.add(i * w.n_scales + 4 * p);
            accumulate::<M, VNNI, false, true>(acc_i, codes, [scales(s), scales(s.add(2))], x, p);
        } else {
            let s = scales(w.d.add(i * w.n_scales + 2 * p));
            accumulate::<M, VNNI, false, false>(acc_i, codes, [s, s], x, p);
        }
    }
    let wts = Weights { plane, hi_row, hb, six, d: wd, n_scales };
    if nibbles {
        let mut p = 0;
        while p + 1 < chunks {
            for (i, acc_i) in acc.iter_mut().enumerate() {
                // Byte j of a chunk pair holds position j of chunk p (low nibble) and of p + 1.
                let at = qs.add(i * row_bytes + p * 32);
                prefetch(at.wrapping_add(AHEAD * row_bytes));
                let (v0, v1) =
                    (_mm256_loadu_si256(at as *const __m256i), _mm256_loadu_si256(at.add(32) as *const __m256i));
                let lo = [_mm256_and_si256(v0, low), _mm256_and_si256(v1, low)];
                let hi =
                    [_mm256_and_si256(_mm256_srli_epi16(v0, 4), low), _mm256_and_si256(_mm256_srli_epi16(v1, 4), low)];
                chunk::<M, VNNI>(acc_i, lo, wts, x, i, p);
                chunk::<M, VNNI>(acc_i, hi, wts, x, i, p + 1);
            }
            p += 2;
        }
        if p < chunks {
            // An odd last chunk: low nibbles hold positions 0..32, high ones 32..64.
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(qs.add(i * row_bytes + p * 32) as *const __m256i);
                let codes = [_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low)];
                chunk::<M, VNNI>(acc_i, codes, wts, x, i, p);
            }
        }
    } else {
        let flip = _mm256_set1_epi8(-128);
        for p in 0..chunks {
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let at = qs.add(i * row_bytes + p * CHUNK);
                prefetch(at.wrapping_add(AHEAD * row_bytes));
                let mut codes =
                    [_mm256_loadu_si256(at as *const __m256i), _mm256_loadu_si256(at.add(32) as *const __m256i)];
                let s = scales(wd.add(i * nb + 2 * p));
                if VNNI {
                    accumulate::<M, true, false, false>(acc_i, codes, [s, s], x, p);
                } else {
                    codes = [_mm256_xor_si256(codes[0], flip), _mm256_xor_si256(codes[1], flip)];
                    accumulate::<M, false, true, false>(acc_i, codes, [s, s], x, p);
                }
            }
        }
    }
    let signed = !nibbles && !VNNI;
    for (i, acc_i) in acc.iter().enumerate() {
        let c = c0 + i;
        for (r, v) in acc_i.iter().enumerate() {
            let sx = a.sx.as_ptr().add((r0 + r) * nb);
            let mut offset = if six {
                -32.0 * dot_f16(wd.add(i * n_scales), a.sx16.as_ptr().add((r0 + r) * n_scales), n_scales)
            } else {
                dot_f16(w.m.as_ptr().add(c * nb), sx, nb)
            };
            if signed {
                offset += 128.0 * dot_f16(w.d.as_ptr().add(c * nb), sx, nb);
            }
            out.write((r0 + r) * w.rows + c, hsum(*v) + offset);
        }
    }
}

/// Adds chunk `p` of one weight row (`codes`, two 32-byte halves; `scale` its two block
/// scales for each half, the same unless `SPLIT`) times each activation row into `acc`.
///
/// # Safety
/// AVX2 (and AVX-VNNI when `VNNI`); `x` points at M rows holding chunk `p`.
#[inline(always)]
unsafe fn accumulate<const M: usize, const VNNI: bool, const SIGNED: bool, const SPLIT: bool>(
    acc: &mut [__m256; M],
    codes: [__m256i; 2],
    scale: [__m256; 2],
    x: Rows,
    p: usize,
) {
    for (r, a) in acc.iter_mut().enumerate() {
        let xp = x.xq.add(r * x.padded + p * CHUNK);
        let (x0, x1) = (_mm256_loadu_si256(xp as *const __m256i), _mm256_loadu_si256(xp.add(32) as *const __m256i));
        let sx =
            _mm256_castsi256_ps(_mm256_set1_epi64x(std::ptr::read_unaligned(x.dx.add(r * x.nb + 2 * p) as *const i64)));
        if SPLIT {
            // Per-16 scales (Q6_K): each half has its own. Codes ≤ 63 cannot saturate a pair.
            let (d0, d1) = if VNNI {
                let zero = _mm256_setzero_si256();
                (_mm256_dpbusd_avx_epi32(zero, codes[0], x0), _mm256_dpbusd_avx_epi32(zero, codes[1], x1))
            } else {
                let ones = _mm256_set1_epi16(1);
                (
                    _mm256_madd_epi16(_mm256_maddubs_epi16(codes[0], x0), ones),
                    _mm256_madd_epi16(_mm256_maddubs_epi16(codes[1], x1), ones),
                )
            };
            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(scale[0], sx), *a);
            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(scale[1], sx), *a);
            continue;
        }
        let dot = if VNNI {
            _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), codes[0], x0), codes[1], x1)
        } else if SIGNED {
            let p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(x0), _mm256_sign_epi8(codes[0], x0));
            let p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(x1), _mm256_sign_epi8(codes[1], x1));
            _mm256_add_epi32(_mm256_madd_epi16(p0, _mm256_set1_epi16(1)), _mm256_madd_epi16(p1, _mm256_set1_epi16(1)))
        } else {
            let p16 = _mm256_add_epi16(_mm256_maddubs_epi16(codes[0], x0), _mm256_maddubs_epi16(codes[1], x1));
            _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
        };
        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale[0], sx), *a);
    }
}

/// The high bits of a chunk's 5- or 6-bit codes at `p` (see [`Bits`]), shifted into bits 4..6
/// of each byte, as the chunk's two 32-byte halves.
///
/// # Safety
/// AVX2; `p` points at `8·hb` readable bytes; `hb` is 1 or 2.
#[inline(always)]
unsafe fn high_bits(p: *const u8, hb: usize) -> [__m256i; 2] {
    // Byte b of qword k (Five) or of 128-bit lane k (Six) holds its bits at hb·k.
    let (copies, shifts, mask) = if hb == 1 {
        let v = _mm256_set1_epi64x(std::ptr::read_unaligned(p as *const i64));
        (v, [_mm256_setr_epi64x(0, 1, 2, 3), _mm256_setr_epi64x(4, 5, 6, 7)], 1)
    } else {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        (v, [_mm256_setr_epi64x(0, 0, 2, 2), _mm256_setr_epi64x(4, 4, 6, 6)], 3)
    };
    let mask = _mm256_set1_epi8(mask);
    let half0 = _mm256_and_si256(_mm256_srlv_epi64(copies, shifts[0]), mask);
    let half1 = _mm256_and_si256(_mm256_srlv_epi64(copies, shifts[1]), mask);
    [_mm256_slli_epi16(half0, 4), _mm256_slli_epi16(half1, 4)]
}

/// Two f16 scales at `p` as `[s0, s1, s0, s1, …]`.
///
/// # Safety
/// F16C; `p` points at two readable `u16`.
#[inline(always)]
unsafe fn scales(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi32(std::ptr::read_unaligned(p as *const i32)))
}

/// Asks for the cache line at `p` in L2. Never dereferences `p`, which may lie past the end
/// of the weights (hence computed by `wrapping_add`).
///
/// # Safety
/// SSE (every x86-64 CPU); a prefetch of any address is harmless.
#[inline(always)]
unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
}

/// The sum of the 8 lanes.
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

/// Σ a[i]·b[i] for i < n, `a` in f16.
///
/// # Safety
/// AVX2, FMA and F16C; `a` and `b` point at `n` readable values.
#[inline(always)]
unsafe fn dot_f16(a: *const u16, b: *const f32, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let a8 = _mm256_cvtph_ps(_mm_loadu_si128(a.add(i) as *const __m128i));
        acc = _mm256_fmadd_ps(a8, _mm256_loadu_ps(b.add(i)), acc);
        i += 8;
    }
    let mut s = hsum(acc);
    while i < n {
        s += half(*a.add(i)) * *b.add(i);
        i += 1;
    }
    s
}
