//! 256-bit kernels for the quantized products: AVX2 (`vpmaddubsw` + `vpmaddwd`, the integer dot
//! every AVX2 CPU has) and AVX-VNNI (the VEX `vpdpbusd`), one body for both.
//!
//! Lanes: a 64-value chunk is two 32-byte halves, lanes 0..8 and 8..16 of the parent module's
//! lane groups. Each half's integer sums over a group add up in one register, scaled once per
//! group (see the parent module).
//!
//! `vpmaddubsw` adds two u8 × i8 products into an i16 with saturation. 4- and 5-bit codes
//! (≤ 31) can never saturate it, even with a group's four chunks added in i16
//! (≤ 4 × 2 × 31 × 127 = 31,496); 6-bit codes (≤ 63) are added two chunks at a time
//! (≤ 2 × 2 × 63 × 127 = 32,004). 8-bit codes (0..=255) could saturate a single pair, so AVX2
//! turns them into signed codes `s = q − 128` (one `xor`) and multiplies `|x|` by `s` with the
//! sign of `x` moved onto `s`: each pair is then at most 2 × 127 × 128 < 2^15. The `−128` is
//! paid back in the offset term: `Σ d·dx·Σq·xq = Σ d·dx·Σs·xq + Σ 128·d·sx`.
//!
//! Registers: AVX2 has 16. A pass over one weight row keeps one accumulator per activation row,
//! up to 6, and the row's half-group of codes (4 registers) live, with room for the scales and
//! temporaries.

// The kernel indexes register arrays by chunk to mirror the math.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{pass_at, pass_blocks, Acts, Bits, QActs, QMatrix, Scales, Weights, CHUNK, GROUP, PASS_ROWS};
use crate::models::native::out_ptr::OutPtr;

/// Activation rows up to which a pass prefetches a row's scales and high bits as well as its
/// codes (see [`Weights::prefetch`]).
const PREFETCH_ALL: usize = 2;
/// Weight rows ahead whose bytes are prefetched into L2: for several activation rows (the same
/// bytes ahead as the AVX-512 kernel's two 4-row tiles), and for one, which a shorter distance
/// served better (measurements in docs/perf/kernels.md).
const AHEAD: usize = 8;
const AHEAD_ONE: usize = 4;

/// The AVX2 kernel.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and the sizes were checked as in [`super::qmatmul`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qmatmul_avx2(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        match w.bits {
            Bits::Four => drive::<false, 4>(a, w, out, cols),
            Bits::Five => drive::<false, 5>(a, w, out, cols),
            Bits::Six => drive::<false, 6>(a, w, out, cols),
            Bits::Eight => drive::<false, 8>(a, w, out, cols),
        }
    }
}

/// The AVX-VNNI kernel.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-VNNI, and the sizes were checked as in
/// [`super::qmatmul`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn qmatmul_avxvnni(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        match w.bits {
            Bits::Four => drive::<true, 4>(a, w, out, cols),
            Bits::Five => drive::<true, 5>(a, w, out, cols),
            Bits::Six => drive::<true, 6>(a, w, out, cols),
            Bits::Eight => drive::<true, 8>(a, w, out, cols),
        }
    }
}

/// Walks `cols` one weight row at a time, each in the [`passes`] over the activation rows.
///
/// # Safety
/// As the entry points: the features (AVX-VNNI too when `VNNI`), checked sizes, `w.bits` of
/// `BITS` bits, and `cols` of `out` owned by the caller.
#[inline(always)]
unsafe fn drive<const VNNI: bool, const BITS: u8>(a: &QActs, w: &QMatrix, out: OutPtr, cols: Range<usize>) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        // One weight row at a time, so that its codes are unpacked once for as many activation
        // rows as the registers hold (tiles of two weight rows were slower for one and two
        // activation rows; docs/perf/kernels.md).
        // The activation rows in blocks that stay in L2 (see `pass_blocks`).
        for block in pass_blocks(a.rows, w.padded) {
            for c in cols.clone() {
                for (r, g) in block.clone().map(|p| pass_at(a.rows, p)) {
                    match g {
                        1 => row_256::<1, VNNI, BITS>(a, w, r, c, &out),
                        2 => row_256::<2, VNNI, BITS>(a, w, r, c, &out),
                        3 => row_256::<3, VNNI, BITS>(a, w, r, c, &out),
                        4 => row_256::<4, VNNI, BITS>(a, w, r, c, &out),
                        5 => row_256::<5, VNNI, BITS>(a, w, r, c, &out),
                        _ => row_256::<PASS_ROWS, VNNI, BITS>(a, w, r, c, &out),
                    }
                }
            }
        }
    }
}

/// `out[r][c] = x_r · w_c` for M activation rows from `r0` and weight row `c`.
///
/// # Safety
/// As `drive`, with `r0 + M <= a.rows` and `c` one of the caller's columns.
#[inline(always)]
unsafe fn row_256<const M: usize, const VNNI: bool, const BITS: u8>(
    a: &QActs,
    w: &QMatrix,
    r0: usize,
    c: usize,
    out: &OutPtr,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let chunks = w.padded / CHUNK;
        let (wts, x) = (Weights::new(w, c), Acts::new(a, r0, M));
        let mut acc = [_mm256_setzero_ps(); M];
        let full = chunks / GROUP;
        for g in 0..full {
            group::<M, VNNI, BITS, GROUP>(&mut acc, wts, x, g * GROUP, g);
        }
        let at = full * GROUP;
        match chunks - at {
            0 => {}
            1 => group::<M, VNNI, BITS, 1>(&mut acc, wts, x, at, full),
            2 => group::<M, VNNI, BITS, 2>(&mut acc, wts, x, at, full),
            _ => {
                group::<M, VNNI, BITS, 2>(&mut acc, wts, x, at, full);
                group::<M, VNNI, BITS, 1>(&mut acc, wts, x, at + 2, full + 1);
            }
        }
        for (r, v) in acc.iter().enumerate() {
            out.write((r0 + r) * w.rows + c, hsum(*v));
        }
    }
}

/// Adds the group of `C` chunks from `start` (group number `g`) of the weight row times M
/// activation rows into `acc`, half a chunk (8 lanes) at a time: the row's half-group of codes
/// is unpacked once for the M rows, and each product's sums are scaled once.
///
/// # Safety
/// AVX2, FMA and F16C (AVX-VNNI too when `VNNI`), inlined into a caller that has them; the
/// group lies within the row.
#[inline(always)]
unsafe fn group<const M: usize, const VNNI: bool, const BITS: u8, const C: usize>(
    acc: &mut [__m256; M],
    w: Weights,
    x: Acts,
    start: usize,
    g: usize,
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        // Codes, scales and high bits for one or two activation rows, which gain from it; codes
        // alone for more, which the extra prefetches slowed (docs/perf/kernels.md).
        let ahead = if M == 1 { AHEAD_ONE } else { AHEAD };
        let all = M <= PREFETCH_ALL;
        w.prefetch(0, ahead, start, g, C, BITS, (all, all));
        let both = scales::<C>(w, start);
        let (xg, (dxg, sxg)) = (x.codes(start), x.lanes(g));
        for (h, &(scale, offset)) in both.iter().enumerate() {
            let q = codes::<VNNI, BITS, C>(w, start, h);
            // Signed codes `q − 128` (8 bits without VNNI): the 128 comes back here.
            let offset =
                if BITS == 8 && !VNNI { _mm256_fmadd_ps(scale, _mm256_set1_ps(128.0), offset) } else { offset };
            for (r, a) in acc.iter_mut().enumerate() {
                let dot = dot::<VNNI, BITS, C>(&q, xg.add(r * C * CHUNK + 32 * h));
                let lane = 16 * r + 8 * h;
                let (dx, sx) = (_mm256_loadu_ps(dxg.add(lane)), _mm256_loadu_ps(sxg.add(lane)));
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, dx), *a);
                *a = _mm256_fmadd_ps(offset, sx, *a);
            }
        }
    }
}

/// Half `h` of each of the `C` chunks from `start` of the weight row: its codes in lane
/// order (signed, `q − 128`, for 8 bits without VNNI; see the module docs).
///
/// # Safety
/// AVX2; the chunks lie within the row; `C` is 4, 2 or 1 (1 only for an unpaired last chunk
/// of nibbles).
#[inline(always)]
unsafe fn codes<const VNNI: bool, const BITS: u8, const C: usize>(w: Weights, start: usize, h: usize) -> [__m256i; C] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let mut out = [_mm256_setzero_si256(); C];
        if BITS == 8 {
            for (c, o) in out.iter_mut().enumerate() {
                *o = _mm256_loadu_si256(w.qs.add((start + c) * CHUNK + 32 * h) as *const __m256i);
                if !VNNI {
                    *o = _mm256_xor_si256(*o, _mm256_set1_epi8(-128));
                }
            }
            return out;
        }
        let at = w.qs.add(start * 32);
        if C == 1 {
            // An unpaired last chunk: low nibbles hold positions 0..32, high ones 32..64.
            let v = _mm256_loadu_si256(at as *const __m256i);
            out[0] = _mm256_and_si256(if h == 0 { v } else { _mm256_srli_epi16(v, 4) }, low);
        } else {
            // Byte j of a chunk pair holds position j of its first chunk (low nibble) and of its
            // second (high); half h is bytes 32h.. of the pair.
            for pair in 0..C / 2 {
                let v = _mm256_loadu_si256(at.add(pair * CHUNK + 32 * h) as *const __m256i);
                out[2 * pair] = _mm256_and_si256(v, low);
                out[2 * pair + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            }
        }
        if BITS != 4 {
            let hb = if BITS == 5 { 1 } else { 2 };
            for (c, o) in out.iter_mut().enumerate() {
                *o = _mm256_or_si256(*o, high_bits(w.plane.add((start + c) * 8 * hb), hb, h));
            }
        }
        out
    }
}

/// Σ codes · activations over a half-group, per i32 lane (see the module docs for the i16
/// bounds that allow the sums without VNNI).
///
/// # Safety
/// AVX2 (and AVX-VNNI when `VNNI`); `xq` points at the half's first chunk of one activation
/// row.
#[inline(always)]
unsafe fn dot<const VNNI: bool, const BITS: u8, const C: usize>(q: &[__m256i; C], xq: *const i8) -> __m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let x = |c: usize| _mm256_loadu_si256(xq.add(c * CHUNK) as *const __m256i);
        let ones = _mm256_set1_epi16(1);
        if VNNI {
            let mut dot = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q[0], x(0));
            for c in 1..C {
                dot = _mm256_dpbusd_avx_epi32(dot, q[c], x(c));
            }
            return dot;
        }
        if BITS == 8 {
            let mut dot = _mm256_setzero_si256();
            for c in 0..C {
                let xc = x(c);
                let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(xc), _mm256_sign_epi8(q[c], xc));
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
            }
            return dot;
        }
        // Chunks whose i16 sums cannot saturate: all of them for ≤ 5 bits, two for 6.
        let run = if BITS == 6 { 2 } else { 4 };
        let mut dot = _mm256_setzero_si256();
        let mut c = 0;
        while c < C {
            let mut sum = _mm256_maddubs_epi16(q[c], x(c));
            for j in c + 1..(c + run).min(C) {
                sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(q[j], x(j)));
            }
            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(sum, ones));
            c += run;
        }
        dot
    }
}

/// The scales and offsets of the weight row on lanes `0..8` and `8..16` of the group of `C`
/// chunks from `start` (the two halves), computed once per group: the K-quants' sub-block
/// bytes are loaded and unpacked, and `d`/`dmin` splatted, once for both halves. (Spreading
/// one 8-lane vector of scales onto the halves with `vpermps` instead was slower.)
///
/// # Safety
/// AVX2 and F16C; the group lies within the row; `C` is 4 for the K-quants (whose rows are
/// whole groups).
#[inline(always)]
unsafe fn scales<const C: usize>(w: Weights, start: usize) -> [(__m256, __m256); 2] {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        match w.scales {
            Scales::Block { implied } => {
                let (d, m) = (w.d.add(start * 2), w.m.wrapping_add(start * 2));
                let (d0, d1) = (per_block::<C>(d, 0), per_block::<C>(d, 1));
                match implied {
                    Some(k) => [(d0, _mm256_mul_ps(d0, _mm256_set1_ps(k))), (d1, _mm256_mul_ps(d1, _mm256_set1_ps(k)))],
                    None => [(d0, per_block::<C>(m, 0)), (d1, per_block::<C>(m, 1))],
                }
            }
            Scales::Super => {
                // Lanes 2j, 2j + 1 hold block j: each byte of `sc` and `mn` twice; half h's
                // lanes are bytes 8h.. of those.
                let g = start / GROUP;
                let bytes = _mm_loadu_si128(w.sub.add(16 * g) as *const __m128i);
                let (sc, mn) = (_mm_unpacklo_epi8(bytes, bytes), _mm_unpackhi_epi8(bytes, bytes));
                let (d, dmin) = (splat(*w.d.add(g)), splat(*w.m.add(g)));
                let dmin = _mm256_sub_ps(_mm256_setzero_ps(), dmin);
                let lanes = |b: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
                let (sc1, mn1) = (_mm_srli_si128::<8>(sc), _mm_srli_si128::<8>(mn));
                [
                    (_mm256_mul_ps(d, lanes(sc)), _mm256_mul_ps(dmin, lanes(mn))),
                    (_mm256_mul_ps(d, lanes(sc1)), _mm256_mul_ps(dmin, lanes(mn1))),
                ]
            }
            Scales::Six => {
                // One i8 scale a lane.
                let g = start / GROUP;
                let d = splat(*w.d.add(g));
                let bytes = _mm_loadu_si128(w.sub.add(16 * g) as *const __m128i);
                let d0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
                let d1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(bytes))));
                let k = _mm256_set1_ps(-32.0);
                [(d0, _mm256_mul_ps(d0, k)), (d1, _mm256_mul_ps(d1, k))]
            }
        }
    }
}

/// f16 bits as an f32 in every lane.
///
/// # Safety
/// F16C.
#[inline(always)]
unsafe fn splat(bits: u16) -> __m256 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe { _mm256_cvtph_ps(_mm_set1_epi16(bits as i16)) }
}

/// Per-32 f16 values from `p` on lanes `8h..8h + 8` of a group of `C` chunks: lane l of the
/// group is in block (4C·l) / 32 of it.
///
/// # Safety
/// AVX2 and F16C; `p` points at 2·C readable values.
#[inline(always)]
unsafe fn per_block<const C: usize>(p: *const u16, h: usize) -> __m256 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        match C {
            4 => {
                let four = _mm256_cvtph_ps(_mm_loadl_epi64(p.add(4 * h) as *const __m128i));
                _mm256_permutevar8x32_ps(four, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3))
            }
            2 => {
                let two = _mm256_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p.add(2 * h) as *const i32)));
                _mm256_permutevar8x32_ps(two, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1))
            }
            _ => splat(*p.add(h)),
        }
    }
}

/// The high bits of half `h` of a chunk's 5- or 6-bit codes at `p` (see [`Bits`]), shifted
/// into bits 4..6 of each byte.
///
/// # Safety
/// AVX2; `p` points at `8·hb` readable bytes; `hb` is 1 or 2.
#[inline(always)]
unsafe fn high_bits(p: *const u8, hb: usize, h: usize) -> __m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        // Byte b of qword k (Five) or of 128-bit lane k (Six) holds its bits at hb·k.
        let k = 4 * h as i64;
        let (copies, shifts, mask) = if hb == 1 {
            let v = _mm256_set1_epi64x(std::ptr::read_unaligned(p as *const i64));
            (v, _mm256_setr_epi64x(k, k + 1, k + 2, k + 3), 1)
        } else {
            let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
            (v, _mm256_setr_epi64x(k, k, k + 2, k + 2), 3)
        };
        _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi64(copies, shifts), _mm256_set1_epi8(mask)), 4)
    }
}

/// The sum of the 8 lanes.
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
    // target features it is compiled for); the operations below rely on nothing else.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    }
}
