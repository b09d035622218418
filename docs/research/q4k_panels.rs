// A research artifact, not compiled (the package excludes docs/): the Q4_K panel layout of
// docs/research/q4k_interleaved_proto.c, brought into the crate on 2026-12-04 as a child module
// of `src/models/native/quant` and measured there, then left out because it did not pay on the
// CPU of the README (issue 22). Kept so that the next attempt starts from tested code.
//
// What it is: weights in panels of 16 rows; per panel one record per 256-value group (codes of
// 8 blocks, 256 bytes each: line j, byte 4n + t holds value 32b + 4j + t of row n in the low
// nibble and value 32b + 16 + 4j + t in the high one; then the 6-bit scales and mins, a byte
// per row and block; then each row's f16 d and dmin). The AVX-512 VNNI kernel broadcasts 4
// activation bytes (from `QActs`'s natural-order codes) against a line of codes, so each lane
// is a weight row: per 32 values and activation row, 8 `vpdpbusd` and one float step for 16
// rows, no horizontal sum. Batch invariant (integer block sums, one float order), and it agreed
// with the portable reference to 1e-4 on odd shapes, with panels cut at any column (the two
// tests at the end passed).
//
// To wire it in: `mod panel;` in quant/mod.rs; a `panels: bool` field on `QMatrix` (false in
// `from_ggml`); `code`/`scale` call `panel_code`/`panel_scale` when it is set; `append_rows`
// calls `append_panel_rows` for two panelled matrices; `stack` refuses a panelled part that
// does not hold whole panels (`stack_panels`); `qmatmul` sends a panelled matrix to
// `qmatmul_panels` on AVX-512 VNNI and to the portable kernel elsewhere; `QActs`'s check also
// covers `natural` and `sx`; and the loader builds Q4_K matrices with `q4k_panels` where the
// CPU has AVX-512 VNNI.
//
// Measured (Intel Xeon family 6 model 167, 2 cores under KVM, quiet), microseconds, medians
// of 400 products of Qwen2.5-1.5B's 8960 x 1536 `up` matrix in Q4_K for 1 / 2 / 5 / 9 / 16
// activation rows, the lane-group layout of the crate ("rows") beside the panels, in one
// process, alternating:
//   2 threads, 60 copies taking turns (weights from memory), four runs:
//     rows    333-354 / 343-366 / 411-457 / 591-644 / 865-1050
//     panels  320-353 / 344-372 / 429-469 / 574-608 / 984-1034
//   2 threads, 1792 rows, one copy (in L2: the arithmetic alone):
//     rows     27-28  /  35-37  /  53     / 105-110 / 183-193
//     panels   28-30  /  36     /  52-55  /  81-82  / 137
//   1 thread, from memory (a compile on the other core): rows 536 / 562 / 707 / 956 / 1543,
//     panels 620-641 / 669-689 / 795-810 / 947-953 / 1339-1346; streaming the bytes alone 525.
// A first version with the codes, scales and d/dmin in four arrays (four streams a thread)
// measured 394-398 / 423-430 / 489-508 / 610-630 / 882-896 with 2 threads: slower; one
// record stream per panel brought it level with the lane groups. Prefetch distance (1 to 16
// records), hint (T0, T1, NTA) and spreading the prefetches over the blocks moved nothing
// beyond the noise.
//
// Why it does not pay here: the panels cut the arithmetic only where the lane-group kernel
// needs two passes (more than 6 rows: 9 rows 25 % less, 16 rows 30 % less in L2); for 1-6
// rows the lane-group kernel already unpacks each weight once and its arithmetic per row is
// the same. From memory, both take about the stream plus part of the arithmetic (5 rows: 268
// streaming, about 265 arithmetic, 420-450 together), so v(5) stays about 1.3 with either
// layout; what issue 22 needs is more overlap of the arithmetic with the stream, which no
// layout or prefetch tried here gave (this VM exposes no hardware counters to say why).

use std::ops::Range;

use candle_core::quantized::GgmlDType;
use half::f16;

use super::decode::{decode_row, RowScales};
use super::{Bits, QMatrix, Scales};
use crate::error::{Error, Result};

/// Weight rows per panel: one per lane of a 512-bit register of i32 sums.
pub(super) const PANEL: usize = 16;
/// Bytes of codes per panel per 32-value block.
const BLOCK_BYTES: usize = PANEL * 16;
/// Bytes of scales and mins per panel per 256-value group.
const SUB_BYTES: usize = 2 * 8 * PANEL;
/// Where a record's parts begin, and its length.
const SUB_AT: usize = 8 * BLOCK_BYTES;
const D_AT: usize = SUB_AT + SUB_BYTES;
const DMIN_AT: usize = D_AT + 2 * PANEL;
const RECORD: usize = DMIN_AT + 2 * PANEL;

impl QMatrix {
    /// Repacks Q4_K GGUF rows (`rows × cols` values, `cols` a multiple of 256) into panels.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] if the sizes do not fit the bytes.
    pub(super) fn q4k_panels(bytes: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let dtype = GgmlDType::Q4K;
        let row_bytes = cols / 256 * dtype.type_size();
        let fits = cols.is_multiple_of(256) && cols > 0 && rows.checked_mul(row_bytes) == Some(bytes.len());
        if !fits {
            return Err(Error::setting(
                "quantized tensor",
                format!("Q4K {rows}x{cols}, {} bytes", bytes.len()),
                "whole Q4_K blocks per row",
            ));
        }
        let (groups, panels) = (cols / 256, rows.div_ceil(PANEL));
        let mut out = Self {
            rows,
            cols,
            padded: cols,
            bits: Bits::Four,
            scales: Scales::Super,
            panels: true,
            qs: vec![0; panels * groups * RECORD],
            hi: Vec::new(),
            d: Vec::new(),
            m: Vec::new(),
            sub: Vec::new(),
        };
        let mut codes = vec![0u8; cols];
        let mut s = RowScales { d: vec![0.0; groups], m: vec![0.0; groups], sub: vec![0; 16 * groups] };
        for (r, row) in bytes.chunks_exact(row_bytes).enumerate() {
            decode_row(dtype, row, &mut codes, &mut s);
            let (p, n) = (r / PANEL, r % PANEL);
            for g in 0..groups {
                let rec = &mut out.qs[(p * groups + g) * RECORD..][..RECORD];
                for b in 0..8 {
                    let values = &codes[g * 256 + b * 32..][..32];
                    let block = &mut rec[b * BLOCK_BYTES..][..BLOCK_BYTES];
                    for j in 0..4 {
                        for t in 0..4 {
                            block[j * 64 + 4 * n + t] = values[4 * j + t] | (values[16 + 4 * j + t] << 4);
                        }
                    }
                    rec[SUB_AT + 16 * b + n] = s.sub[16 * g + b];
                    rec[SUB_AT + 128 + 16 * b + n] = s.sub[16 * g + 8 + b];
                }
                rec[D_AT + 2 * n..][..2].copy_from_slice(&f16::from_f32(s.d[g]).to_le_bytes());
                rec[DMIN_AT + 2 * n..][..2].copy_from_slice(&f16::from_f32(s.m[g]).to_le_bytes());
            }
        }
        Ok(out)
    }

    /// 256-value groups per row.
    fn groups(&self) -> usize {
        self.padded / 256
    }

    /// The record of row `r`'s panel for group `g`.
    fn record(&self, r: usize, g: usize) -> &[u8] {
        &self.qs[((r / PANEL) * self.groups() + g) * RECORD..][..RECORD]
    }

    /// The code of value `i` of row `r` of a panelled matrix.
    pub(super) fn panel_code(&self, r: usize, i: usize) -> u8 {
        let (b, v) = (i % 256 / 32, i % 32);
        let byte = self.record(r, i / 256)[b * BLOCK_BYTES + (v % 16 / 4) * 64 + 4 * (r % PANEL) + v % 4];
        if v < 16 {
            byte & 0xF
        } else {
            byte >> 4
        }
    }

    /// The scale and offset of value `i` of row `r` of a panelled matrix.
    pub(super) fn panel_scale(&self, r: usize, i: usize) -> (f32, f32) {
        let (rec, n, b) = (self.record(r, i / 256), r % PANEL, i % 256 / 32);
        let half = |at: usize| f16::from_le_bytes([rec[at], rec[at + 1]]).to_f32();
        let (d, dmin) = (half(D_AT + 2 * n), half(DMIN_AT + 2 * n));
        (d * f32::from(rec[SUB_AT + 16 * b + n]), -dmin * f32::from(rec[SUB_AT + 128 + 16 * b + n]))
    }

    /// Copies row `r` of `from` (panelled, the same width) into row `i` of this panelled
    /// matrix, whose panels must already hold row `i`: the bytes of row `n` of a record are
    /// 4 of every 64 of its codes, one of every 16 of its scales and 2 of every 32 of the rest.
    fn copy_panel_row(&mut self, i: usize, from: &QMatrix, r: usize) {
        let groups = self.groups();
        let (n, m) = (i % PANEL, r % PANEL);
        for g in 0..groups {
            let (to, at) = (((i / PANEL) * groups + g) * RECORD, ((r / PANEL) * groups + g) * RECORD);
            for line in 0..SUB_AT / 64 {
                self.qs[to + 64 * line + 4 * n..][..4].copy_from_slice(&from.qs[at + 64 * line + 4 * m..][..4]);
            }
            for k in 0..SUB_BYTES / PANEL {
                self.qs[to + SUB_AT + PANEL * k + n] = from.qs[at + SUB_AT + PANEL * k + m];
            }
            for part in [D_AT, DMIN_AT] {
                self.qs[to + part + 2 * n..][..2].copy_from_slice(&from.qs[at + part + 2 * m..][..2]);
            }
        }
    }

    /// Appends the rows `ids` of `from` to this panelled matrix (both panelled, checked by the
    /// caller).
    pub(super) fn append_panel_rows(&mut self, from: &QMatrix, ids: &[usize]) {
        let groups = self.groups();
        let panels = (self.rows + ids.len()).div_ceil(PANEL);
        self.qs.resize(panels * groups * RECORD, 0);
        for &r in ids {
            self.rows += 1;
            self.copy_panel_row(self.rows - 1, from, r);
        }
    }

    /// Stacks panelled matrices: all but the last must hold whole panels.
    pub(super) fn stack_panels(parts: &[QMatrix]) -> bool {
        let last = parts.len().saturating_sub(1);
        parts.iter().all(|p| p.panels) && parts[..last].iter().all(|p| p.rows.is_multiple_of(PANEL))
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use simd::qmatmul_panels;

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::*;
    use crate::models::native::out_ptr::OutPtr;
    use crate::models::native::quant::QActs;

    /// The most activation rows one pass over a panel takes: their 16 sums, the block's 8
    /// code vectors and its scales fill the 32 registers.
    const PASS: usize = 16;
    /// Records ahead whose bytes are prefetched into L2 (9 KB ahead in the thread's stream).
    const AHEAD: usize = 4;

    /// `out = x · wᵀ` over columns `cols` for a panelled `w`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI; the sizes were checked as in
    /// [`super::super::qmatmul`]; `w` is panelled; no other thread touches columns `cols` of
    /// `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(in crate::models::native::quant) unsafe fn qmatmul_panels(
        a: &QActs,
        w: &QMatrix,
        out: OutPtr,
        cols: Range<usize>,
    ) {
        for p in cols.start / PANEL..cols.end.div_ceil(PANEL) {
            let lanes = cols.start.max(p * PANEL) - p * PANEL..cols.end.min(p * PANEL + PANEL) - p * PANEL;
            let mut r0 = 0;
            while r0 < a.rows {
                let m = (a.rows - r0).min(PASS);
                // SAFETY: the caller's contract; the pass's rows lie within `a`.
                unsafe {
                    match m {
                        1 => panel::<1>(a, w, p, r0, out, &lanes),
                        2 => panel::<2>(a, w, p, r0, out, &lanes),
                        3 => panel::<3>(a, w, p, r0, out, &lanes),
                        4 => panel::<4>(a, w, p, r0, out, &lanes),
                        5 => panel::<5>(a, w, p, r0, out, &lanes),
                        6 => panel::<6>(a, w, p, r0, out, &lanes),
                        7 => panel::<7>(a, w, p, r0, out, &lanes),
                        8 => panel::<8>(a, w, p, r0, out, &lanes),
                        9 => panel::<9>(a, w, p, r0, out, &lanes),
                        10 => panel::<10>(a, w, p, r0, out, &lanes),
                        11 => panel::<11>(a, w, p, r0, out, &lanes),
                        12 => panel::<12>(a, w, p, r0, out, &lanes),
                        13 => panel::<13>(a, w, p, r0, out, &lanes),
                        14 => panel::<14>(a, w, p, r0, out, &lanes),
                        15 => panel::<15>(a, w, p, r0, out, &lanes),
                        _ => panel::<PASS>(a, w, p, r0, out, &lanes),
                    }
                }
                r0 += m;
            }
        }
    }

    /// The 16 lanes of `f16` bits at `p` as f32.
    ///
    /// # Safety
    /// AVX-512 F; 16 readable values at `p`.
    #[inline(always)]
    unsafe fn halves(p: *const u16) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }

    /// 16 bytes at `p` as f32 lanes.
    ///
    /// # Safety
    /// AVX-512 F; 16 readable bytes at `p`.
    #[inline(always)]
    unsafe fn bytes(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))) }
    }

    /// Activation rows `r0 .. r0 + M` times panel `p`, written to the lanes `lanes` of the
    /// panel's columns.
    ///
    /// # Safety
    /// As [`qmatmul_panels`], with `r0 + M <= a.rows` and `p` a panel of `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn panel<const M: usize>(a: &QActs, w: &QMatrix, p: usize, r0: usize, out: OutPtr, lanes: &Range<usize>) {
        let groups = w.padded / 256;
        let nb = w.padded / 32;
        let low = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); M];
        // SAFETY: every offset below stays within the panel's records and the pass's rows (the
        // sizes were checked by the caller); prefetches use `wrapping_add` and never read.
        unsafe {
            let records = w.qs.as_ptr().add(p * groups * RECORD);
            let x = a.natural.as_ptr().add(r0 * a.padded);
            let (dx, sx) = (a.dx.as_ptr().add(r0 * nb), a.sx.as_ptr().add(r0 * nb));
            for g in 0..groups {
                let rec = records.add(g * RECORD);
                let ahead = rec.wrapping_add(AHEAD * RECORD);
                for line in 0..RECORD.div_ceil(64) {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * line) as *const i8);
                }
                let dg = halves(rec.add(D_AT) as *const u16);
                let mg = halves(rec.add(DMIN_AT) as *const u16);
                for b in 0..8 {
                    let block = rec.add(b * BLOCK_BYTES);
                    let mut q = [_mm512_setzero_si512(); 8];
                    for j in 0..4 {
                        let v = _mm512_loadu_si512(block.add(64 * j) as *const _);
                        q[j] = _mm512_and_si512(v, low);
                        q[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                    }
                    let scale = _mm512_mul_ps(dg, bytes(rec.add(SUB_AT + 16 * b)));
                    let min = _mm512_mul_ps(mg, bytes(rec.add(SUB_AT + 128 + 16 * b)));
                    let blk = g * 8 + b;
                    for r in 0..M {
                        let xr = x.add(r * a.padded + blk * 32) as *const i32;
                        // Two chains of four (values 0..16 and 16..32), so that one row does
                        // not wait on the dot's latency; integer sums, exact in any order.
                        let mut lo = _mm512_setzero_si512();
                        let mut hi = _mm512_setzero_si512();
                        for j in 0..4 {
                            lo = _mm512_dpbusd_epi32(lo, q[j], _mm512_set1_epi32(std::ptr::read_unaligned(xr.add(j))));
                            hi = _mm512_dpbusd_epi32(hi, q[4 + j], _mm512_set1_epi32(std::ptr::read_unaligned(xr.add(4 + j))));
                        }
                        let t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), scale);
                        acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(*dx.add(r * nb + blk)), acc[r]);
                        acc[r] = _mm512_fnmadd_ps(min, _mm512_set1_ps(*sx.add(r * nb + blk)), acc[r]);
                    }
                }
            }
            let mut sums = [0f32; PANEL];
            for r in 0..M {
                let row = (r0 + r) * w.rows + p * PANEL;
                if lanes.len() == PANEL {
                    _mm512_storeu_ps(out.slice(row, PANEL).as_mut_ptr(), acc[r]);
                } else {
                    _mm512_storeu_ps(sums.as_mut_ptr(), acc[r]);
                    for n in lanes.clone() {
                        out.write(row + n, sums[n]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::native::out_ptr::OutPtr;
    use crate::models::native::quant::tests::data;
    use crate::models::native::quant::{qmatmul, qmatmul_portable, QActs};
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    type Kernel = fn(&QActs, &QMatrix, OutPtr<'_>, Range<usize>);

    /// The Q4_K matrix of `repack` in both layouts.
    fn both(rows: usize, cols: usize) -> (QMatrix, QMatrix) {
        let w = Tensor::from_vec(data(rows * cols, 7), (rows, cols), &Device::Cpu).expect("tensor");
        let q = QTensor::quantize(&w, GgmlDType::Q4K).expect("quantize");
        let bytes = q.data().expect("bytes");
        let lanes = QMatrix::from_ggml(GgmlDType::Q4K, &bytes, rows, cols).expect("repack");
        (lanes, QMatrix::q4k_panels(&bytes, rows, cols).expect("panels"))
    }

    fn kernels() -> Vec<(&'static str, Kernel)> {
        // SAFETY (all): one thread at a time, with fitting sizes.
        let mut ks: Vec<(&'static str, Kernel)> = vec![
            ("portable", |a, w, o, c| unsafe { qmatmul_portable(a, w, o, c) }),
            ("dispatch", |a, w, o, c| unsafe { qmatmul(a, w, o, c) }),
        ];
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::Level::Avx512Vnni.available() {
            // SAFETY: the CPU has the features (checked just above).
            ks.push(("avx512vnni panels", |a, w, o, c| unsafe { qmatmul_panels(a, w, o, c) }));
        }
        ks
    }

    /// All columns in three ranges that cut panels anywhere, as threads would.
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

    #[test]
    fn panels_hold_the_file_values_and_select_rows_as_they_are() {
        let (rows, cols) = (37, 512);
        let (lanes, panels) = both(rows, cols);
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..rows {
            lanes.dequantize_row(r, &mut a);
            panels.dequantize_row(r, &mut b);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "row {r}");
        }
        let ids = [36, 0, 17, 17, 5];
        let mut part = panels.select_rows(&ids).expect("rows in range");
        assert!(part.append_rows(&panels, &[2, 35]) && !part.append_rows(&lanes, &[1]));
        for (i, r) in ids.iter().chain(&[2, 35]).enumerate() {
            part.dequantize_row(i, &mut a);
            panels.dequantize_row(*r, &mut b);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "selected row {r}");
        }
        let (_, top) = both(32, cols);
        assert!(QMatrix::stack(vec![top.clone(), panels.clone()]).is_some_and(|s| s.rows() == 69 && s.panels));
        assert!(QMatrix::stack(vec![panels.clone(), top]).is_none(), "a part of 37 rows would leave a gap");
    }

    /// Every kernel on panels against the portable product of the lane-group layout (the same
    /// integers, so only f32 rounding differs), and each row bit for bit the same alone or
    /// among M rows, for every M from 1 to 16, with panels cut at any column.
    #[test]
    fn panel_kernels_agree_and_each_row_is_the_same_alone_or_among_m_rows() {
        for &(n, k) in &[(7usize, 256usize), (37, 512), (16, 18 * 256)] {
            let (lanes, panels) = both(n, k);
            let x = data(16 * k, 5);
            for (name, kernel) in kernels() {
                let alone: Vec<Vec<f32>> = (0..16)
                    .map(|r| {
                        let mut acts = QActs::default();
                        acts.quantize(&x[r * k..(r + 1) * k], 1, k);
                        run(kernel, &acts, &panels)
                    })
                    .collect();
                for m in 1..=16 {
                    let mut acts = QActs::default();
                    acts.quantize(&x[..m * k], m, k);
                    let want = run(kernels()[0].1, &acts, &lanes);
                    let got = run(kernel, &acts, &panels);
                    for (p, q) in want.iter().zip(&got) {
                        assert!((p - q).abs() <= 1e-4 * (1.0 + p.abs()), "{name} n{n} k{k} m{m}: {p} vs {q}");
                    }
                    for (r, row) in got.chunks_exact(n).enumerate() {
                        let same = row.iter().zip(&alone[r]).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{name} n{n} k{k}: row {r} of {m} differs from the row alone");
                    }
                }
            }
        }
    }
}
