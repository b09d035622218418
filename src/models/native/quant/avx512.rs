//! The AVX-512 VNNI kernel for the quantized products: one `vpdpbusd` per 64 values (see the
//! parent module for the layout and the math).

// The kernel indexes register arrays by (row, column) to mirror the tile's math.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Bits, QActs, QMatrix, CHUNK};
use crate::models::native::out_ptr::OutPtr;

/// Weight rows per tile and activation rows per group.
const TILE: usize = 4;
const GROUP: usize = 4;

/// The AVX-512 VNNI kernel.
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL and VNNI, and the sizes were checked as in
/// [`super::qmatmul`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn qmatmul_vnni(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    // One compiled kernel per code width, so that no test on it is left inside the loops.
    match w.bits {
        Bits::Four => tiles::<4>(a, w, out, cols),
        Bits::Five => tiles::<5>(a, w, out, cols),
        Bits::Six => tiles::<6>(a, w, out, cols),
        Bits::Eight => tiles::<8>(a, w, out, cols),
    }
}

/// [`qmatmul_vnni`] for codes of `BITS` bits.
///
/// # Safety
/// As [`qmatmul_vnni`], with `w.bits` of `BITS` bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tiles<const BITS: u8>(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    let mut c = cols.start;
    while c < cols.end {
        let tile = if cols.end - c >= TILE { TILE } else { 1 };
        let mut r = 0;
        while r < a.rows {
            let g = (a.rows - r).min(GROUP);
            match (g, tile) {
                (1, TILE) => tile_vnni::<1, TILE, BITS>(a, w, r, c, out),
                (2, TILE) => tile_vnni::<2, TILE, BITS>(a, w, r, c, out),
                (3, TILE) => tile_vnni::<3, TILE, BITS>(a, w, r, c, out),
                (4, TILE) => tile_vnni::<4, TILE, BITS>(a, w, r, c, out),
                (1, _) => tile_vnni::<1, 1, BITS>(a, w, r, c, out),
                (2, _) => tile_vnni::<2, 1, BITS>(a, w, r, c, out),
                (3, _) => tile_vnni::<3, 1, BITS>(a, w, r, c, out),
                _ => tile_vnni::<4, 1, BITS>(a, w, r, c, out),
            }
            r += g;
        }
        c += tile;
    }
}

/// Two f32 scales `[s0, s1]` at `p` broadcast as `[s0, s1, s0, s1, …]`, the lane order of a
/// `vpdpbusd` over an interleaved chunk.
///
/// # Safety
/// AVX-512 F; `p` points at two readable `f32`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn pair(p: *const f32) -> __m512 {
    _mm512_castsi512_ps(_mm512_set1_epi64(std::ptr::read_unaligned(p as *const i64)))
}

/// The same for two f16 scales.
///
/// # Safety
/// AVX-512 F; `p` points at two readable `u16`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn pair_f16(p: *const u16) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32)))
}

/// Four f16 scales `[s0, s1, s2, s3]` at `p` (a `Six` chunk's per-16 scales) as lanes
/// `[s0, s1] × 4, [s2, s3] × 4`: the first 8 lanes of a `vpdpbusd` hold values 0..16 of the
/// chunk's two blocks, the last 8 values 16..32.
///
/// # Safety
/// AVX-512 F; `p` points at four readable `u16`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn quad_f16(p: *const u16) -> __m512 {
    let four = _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i));
    let lanes = _mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3);
    _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(four))
}

/// The high bits of a chunk's 5- or 6-bit codes at `p` (see [`Bits`]), shifted into bits 4..6
/// of each byte in the chunk's interleaved order.
///
/// # Safety
/// AVX-512 F and BW; `p` points at `8·hb` readable bytes; `hb` is 1 or 2.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn high_bits(p: *const u8, hb: usize) -> __m512i {
    // Byte b of qword k (Five) or of 128-bit lane k (Six) holds its bits at hb·k: shift each
    // copy down by that much and keep the low hb bits of every byte.
    let (copies, shifts, mask) = if hb == 1 {
        (_mm512_set1_epi64(std::ptr::read_unaligned(p as *const i64)), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), 1)
    } else {
        let v = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
        (v, _mm512_setr_epi64(0, 0, 2, 2, 4, 4, 6, 6), 3)
    };
    let bits = _mm512_and_si512(_mm512_srlv_epi64(copies, shifts), _mm512_set1_epi8(mask));
    _mm512_slli_epi16(bits, 4)
}

/// Activation rows from a group's first, as raw pointers.
#[derive(Clone, Copy)]
struct Acts {
    xq: *const i8,
    dx: *const f32,
    padded: usize,
    nb: usize,
}

/// Adds chunk `p` of R weight rows (codes `wq`, lane scales `scale`) times M activation rows
/// into `acc`. A function rather than a closure, so that `acc` stays in registers.
///
/// # Safety
/// AVX-512 F and VNNI (inlined into a caller that has them); `x` holds M rows with chunk `p`.
#[inline(always)]
unsafe fn step<const M: usize, const R: usize>(
    acc: &mut [[__m512; R]; M],
    wq: &[__m512i; R],
    scale: [__m512; R],
    x: Acts,
    p: usize,
) {
    for (r, acc_r) in acc.iter_mut().enumerate() {
        let xv = _mm512_loadu_si512(x.xq.add(r * x.padded + p * CHUNK) as *const _);
        let sx = pair(x.dx.add(r * x.nb + 2 * p));
        for i in 0..R {
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[i], xv);
            acc_r[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale[i], sx), acc_r[i]);
        }
    }
}

/// `out[r][c] = x_r · w_c` for M activation rows from `r0` and R weight rows from `c0`.
///
/// # Safety
/// As `qmatmul_vnni`, with `r0 + M <= a.rows` and `c0 + R` within the caller's columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile_vnni<const M: usize, const R: usize, const BITS: u8>(
    a: &QActs,
    w: &QMatrix,
    r0: usize,
    c0: usize,
    out: OutPtr,
) {
    let nb = w.padded / 32;
    let chunks = w.padded / CHUNK;
    let nibbles = BITS != 8;
    let (six, hb) = (BITS == 6, (BITS as usize).saturating_sub(4).min(2));
    let row_bytes = w.bits.row_bytes(w.padded);
    let hi_row = w.hi_row_bytes();
    // Scales per weight row: per 32 values, or per 16 for Six.
    let scales = if six { 2 * nb } else { nb };
    let qs = w.qs.as_ptr().add(c0 * row_bytes);
    let plane = w.hi.as_ptr().add(c0 * hi_row);
    let wd = w.d.as_ptr().add(c0 * scales);
    let xq = a.xq.as_ptr().add(r0 * a.padded);
    let dx = a.dx.as_ptr().add(r0 * nb);
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); R]; M];
    let x = Acts { xq, dx, padded: a.padded, nb };
    // Scales of chunk p of weight row i.
    let scale = |i: usize, p: usize| {
        if six {
            quad_f16(wd.add(i * scales + 4 * p))
        } else {
            pair_f16(wd.add(i * nb + 2 * p))
        }
    };
    // The codes of chunk p of weight row i: the nibbles `v` with the high plane or'd in.
    let with_high = |v: __m512i, i: usize, p: usize| {
        if hb == 0 {
            v
        } else {
            _mm512_or_si512(v, high_bits(plane.add(i * hi_row + p * 8 * hb), hb))
        }
    };
    if nibbles {
        let mut p = 0;
        while p + 1 < chunks {
            // The rows are short streams the prefetcher misses: fetch the same bytes two tiles
            // ahead into L2 (measured best: one tile ahead into L1 fills the miss slots and is
            // 20-40 % slower for one activation row).
            for i in 0..R {
                _mm_prefetch::<_MM_HINT_T1>(qs.wrapping_add((2 * R + i) * row_bytes + p * 32) as *const i8);
            }
            let bytes = |i: usize| _mm512_loadu_si512(qs.add(i * row_bytes + p * 32) as *const _);
            // The two chunks one after the other, the bytes loaded twice (the second time from
            // L1): holding both chunks' codes for a 4 × 4 tile would spill registers.
            let lo = std::array::from_fn(|i| with_high(_mm512_and_si512(bytes(i), low), i, p));
            step(&mut acc, &lo, std::array::from_fn(|i| scale(i, p)), x, p);
            let hi =
                std::array::from_fn(|i| with_high(_mm512_and_si512(_mm512_srli_epi16(bytes(i), 4), low), i, p + 1));
            step(&mut acc, &hi, std::array::from_fn(|i| scale(i, p + 1)), x, p + 1);
            p += 2;
        }
        if p < chunks {
            let mut last = [_mm512_setzero_si512(); R];
            for (i, l) in last.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(qs.add(i * row_bytes + p * 32) as *const __m256i);
                let lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
                let high = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
                *l = with_high(_mm512_inserti64x4(_mm512_castsi256_si512(lo), high, 1), i, p);
            }
            step(&mut acc, &last, std::array::from_fn(|i| scale(i, p)), x, p);
        }
    } else {
        for p in 0..chunks {
            let mut codes = [_mm512_setzero_si512(); R];
            for (i, c) in codes.iter_mut().enumerate() {
                _mm_prefetch::<_MM_HINT_T1>(qs.wrapping_add((2 * R + i) * row_bytes + p * CHUNK) as *const i8);
                *c = _mm512_loadu_si512(qs.add(i * row_bytes + p * CHUNK) as *const _);
            }
            step(&mut acc, &codes, std::array::from_fn(|i| scale(i, p)), x, p);
        }
    }
    for r in 0..M {
        for i in 0..R {
            let offset = if six {
                -32.0 * dot_f32(wd.add(i * scales), a.sx16.as_ptr().add((r0 + r) * scales), scales)
            } else {
                dot_f32(w.m.as_ptr().add((c0 + i) * nb), a.sx.as_ptr().add((r0 + r) * nb), nb)
            };
            out.write((r0 + r) * w.rows + c0 + i, _mm512_reduce_add_ps(acc[r][i]) + offset);
        }
    }
}

/// Σ a[i]·b[i] for i < n (a in f16), 16 lanes at a time.
///
/// # Safety
/// AVX-512 F, BW and VL; `a` and `b` point at `n` readable values (masked loads read no
/// further).
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
