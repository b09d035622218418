//! Quantized weights for the native engine, and their products with a few activation rows.
//!
//! Every supported GGUF block type (Q8_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K) is
//! repacked at load into one layout: per 32 values an unsigned code `q` (4, 5, 6 or 8 bits), a
//! scale `d` and an offset `m`, with `w = d·q + m`. (Q6_K scales every 16 values: its `d` is
//! kept per 16 and its offset is always `−32·d`, see [`Bits::Six`].) Activations are quantized
//! per 32 values to `x ≈ dx·xq` (i8), so
//!
//!   Σ w·x ≈ Σ_blocks ( d·dx·Σ q·xq  +  m·sx ),   sx = dx·Σ xq,
//!
//! and the inner sum `Σ q·xq` is an integer dot product: one AVX-512 VNNI `vpdpbusd` covers 64
//! values (u8 × i8), and each weight block is unpacked once for all activation rows. This is
//! the scheme llama.cpp uses (quantized activations, integer dots); the single layout keeps one
//! kernel for all the formats. Rows are padded to a multiple of 64 values with zero blocks.
//!
//! **Lane groups.** `vpdpbusd` sums 4 bytes into each of 16 i32 lanes. Codes (and quantized
//! activations) are stored so that a lane keeps to one 16-value sub-block over a *group* of 4
//! chunks (256 values): lane `l` of chunk `c` holds values `16l + 4c .. 16l + 4c + 4` of the
//! group. The integer sums of a whole group then add up in one register, and the scales are
//! applied once per group, as one 16-lane vector (a 32-value block's scale on two lanes, or
//! Q6_K's per-16 scales one a lane), not once per chunk. A row whose chunks are not a multiple
//! of 4 ends in a group of 2 and/or 1 chunk, laid out the same way with 8 or 4 values per lane
//! (see `groups`). 4-bit codes of two neighbouring chunks share 64 bytes (low nibbles for the
//! first chunk, high for the second), so one load and three operations unpack 128 codes. 5- and
//! 6-bit codes keep their low 4 bits the same way and their high bits in a second plane (see
//! [`Bits`]), or'd in above the nibble after unpacking.

use std::ops::Range;

use candle_core::quantized::GgmlDType;
use half::f16;

use crate::error::{Error, Result};
use crate::models::native::out_ptr::OutPtr;
use crate::models::native::pool::team;
use crate::models::native::sizes::{product, round_up};
use decode::{decode_row, RowScales};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod decode;
mod kernel;

#[cfg_attr(not(feature = "bench-internals"), allow(unused_imports))]
pub use kernel::{qmatmul, qmatmul_parallel, qmatmul_portable};

/// Values per chunk the kernels step over (two 32-value blocks).
const CHUNK: usize = 64;
/// Chunks per full lane group (256 values).
const GROUP: usize = 4;

/// The lane groups of a row of `chunks` chunks, as (first chunk, chunks in it): groups of 4,
/// then the rest as a group of 2 and/or 1 (16 lanes cannot share 3 chunks' 6 blocks evenly).
fn groups(chunks: usize) -> impl Iterator<Item = (usize, usize)> {
    let full = chunks / GROUP * GROUP;
    let tail: &[(usize, usize)] = match chunks - full {
        0 => &[],
        1 => &[(0, 1)],
        2 => &[(0, 2)],
        _ => &[(0, 2), (2, 1)],
    };
    (0..full).step_by(GROUP).map(|c| (c, GROUP)).chain(tail.iter().map(move |&(at, n)| (full + at, n)))
}

/// The number of lane groups of a row of `chunks` chunks.
fn group_count(chunks: usize) -> usize {
    chunks / GROUP + [0, 1, 1, 2][chunks % GROUP]
}

/// Rows per chunk of [`QMatrix::from_ggml`]'s repacking job.
const REPACK_ROWS: usize = 64;

/// Blocks of activations per item of [`QActs::quantize`]'s job (a one-token pass quantizes
/// rows of 1,536 values, 48 blocks, on the calling thread alone).
const QUANTIZE_GRAIN: usize = 64;

/// The most activation rows one pass of a SIMD kernel covers (what both kernels' registers
/// hold beside a weight row's codes).
const PASS_ROWS: usize = 6;

/// The passes a SIMD kernel makes over `rows` activation rows for each weight row, as (first
/// row, rows): as few as [`PASS_ROWS`] allows, of even sizes (9 rows as 5 + 4: a small last
/// pass pays the unpacking for little work). [`QActs`] stores its rows by these passes.
fn passes(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows.div_ceil(PASS_ROWS)).map(move |p| pass_at(rows, p))
}

/// Pass `p` of [`passes`]`(rows)`: of `count` passes, the first `rows % count` hold one row
/// more than the others.
fn pass_at(rows: usize, p: usize) -> (usize, usize) {
    let count = rows.div_ceil(PASS_ROWS);
    let (each, more) = (rows / count, rows % count);
    (p * each + p.min(more), each + usize::from(p < more))
}

/// Bytes of quantized activations (codes, and their per-lane scales and sums) that one block of
/// passes may hold: the kernels take every weight row of their columns over one block of
/// activation rows before the next, so that a block stays in L2 while the weights stream by,
/// instead of streaming all the rows (megabytes for a prompt) again for each weight row.
const BLOCK_BYTES: usize = 512 * 1024;

/// The [`passes`] over `rows` activation rows of `padded` values in blocks of at most
/// [`BLOCK_BYTES`], as ranges of pass numbers (see [`pass_at`]). A row's sum does not depend on
/// the block it falls in.
fn pass_blocks(rows: usize, padded: usize) -> impl Iterator<Item = Range<usize>> {
    // Per row: a byte of code and 8 bytes of lane scale and sum per 16 values.
    let per = (BLOCK_BYTES / (PASS_ROWS * (padded + padded / 2))).max(1);
    let count = rows.div_ceil(PASS_ROWS);
    (0..count).step_by(per).map(move |b| b..count.min(b + per))
}

/// The pass (first row, rows) of [`passes`]`(rows)` that holds row `r`.
fn pass_of(rows: usize, r: usize) -> (usize, usize) {
    passes(rows).find(|&(r0, n)| r < r0 + n).unwrap_or((r, 1))
}

/// Where row `r`'s codes of the lane group of `n` chunks from chunk `start` begin in
/// [`QActs`]'s `xq`, for rows of `padded` values and `r` in `pass` (first row, rows).
fn codes_at(padded: usize, pass: (usize, usize), r: usize, start: usize, n: usize) -> usize {
    let (r0, p) = pass;
    r0 * padded + start * CHUNK * p + (r - r0) * n * CHUNK
}

/// The group (first chunk, chunks) that holds chunk `c` of a row of `chunks` chunks.
fn group_of(chunks: usize, c: usize) -> (usize, usize) {
    let full = chunks / GROUP * GROUP;
    match (c < full, chunks - full) {
        (true, _) => (c / GROUP * GROUP, GROUP),
        (false, 3) if c == full + 2 => (full + 2, 1),
        (false, rest) => (full, rest.min(2)),
    }
}

/// Where value `i` of a row of `chunks` chunks is stored (chunk · 64 + byte): lane `l` of a
/// group of `n` chunks holds values `4n·l .. 4n·(l + 1)` of the group, 4 in each chunk.
fn locate(chunks: usize, i: usize) -> usize {
    let (start, n) = group_of(chunks, i / CHUNK);
    let v = i - start * CHUNK;
    let (lane, o) = (v / (4 * n), v % (4 * n));
    (start + o / 4) * CHUNK + lane * 4 + o % 4
}

/// Moves a group's values from natural order (`from`, `64·n` of them) into lane order (`to`).
fn scatter<T: Copy>(from: &[T], to: &mut [T], n: usize) {
    for (lane, values) in from.chunks_exact(4 * n).enumerate() {
        for (c, four) in values.chunks_exact(4).enumerate() {
            to[c * CHUNK + lane * 4..][..4].copy_from_slice(four);
        }
    }
}

/// Bits per code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bits {
    /// Two codes per byte: chunks in pairs, byte i holding position i of the first chunk (low
    /// nibble) and of the second (high); an odd last chunk holds positions i and i + 32.
    Four,
    /// Q5_0, Q5_1, Q5_K: the low 4 bits as in `Four`, and per chunk 8 bytes of high bits: bit k
    /// of byte b is the fifth bit of position 8k + b.
    Five,
    /// Q6_K: the low 4 bits as in `Four`, and per chunk 16 bytes of high bits: bits 2k..2k+2 of
    /// byte b are the top two bits of position 16k + b.
    Six,
    /// One code per byte.
    Eight,
}

impl Bits {
    /// Bits of the high plane per value.
    fn high_bits(self) -> usize {
        match self {
            Self::Five => 1,
            Self::Six => 2,
            Self::Four | Self::Eight => 0,
        }
    }

    /// Bytes of codes per row of `padded` values (the nibble or byte plane).
    fn row_bytes(self, padded: usize) -> usize {
        if self == Self::Eight {
            padded
        } else {
            padded / 2
        }
    }
}

/// How a matrix holds its scales `d` and offsets `m` (`w = d·q + m`): as the file does, so that
/// the bytes streamed per product are (about) the file's.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scales {
    /// Per 32 values an f16 `d` and an f16 `m` (Q4_1, Q5_1) or, where `implied` is set,
    /// `m = implied·d` (Q8_0: −128, its codes being stored plus 128; Q4_0: −8; Q5_0: −16).
    Block { implied: Option<f32> },
    /// Q4_K, Q5_K: per 256 values an f16 `d` and `dmin`; per 32 values a 6-bit scale `sc` and
    /// min `mn`, a byte each (per 256 values 16 bytes of `sub`: the 8 `sc`, then the 8 `mn`):
    /// `d·sc` and `−dmin·mn`.
    Super,
    /// Q6_K: per 256 values an f16 `d`; per 16 values an i8 scale `sc` (16 bytes of `sub`):
    /// `d·sc`, and the offset `−32·d·sc`.
    Six,
}

/// Where a run of repacked rows goes: each slice holds whole rows of its part (empty for a
/// part the format lacks).
struct RowsOut<'a> {
    qs: &'a mut [u8],
    hi: &'a mut [u8],
    d: &'a mut [u16],
    m: &'a mut [u16],
    sub: &'a mut [u8],
}

/// Repacks the GGUF rows in `src` (`row_bytes` each) of a matrix with codes of `bits` and rows
/// padded to `padded` values into `out`: codes in lane order (see the module docs), the high
/// bits in their plane, the scales as f16 bits.
fn repack_rows(dtype: GgmlDType, (bits, padded, row_bytes): (Bits, usize, usize), src: &[u8], out: RowsOut) {
    let rows = src.len() / row_bytes;
    let per = |part: usize| part / rows.max(1);
    let (qs_row, hi_row, d_row, m_row, sub_row) =
        (per(out.qs.len()), per(out.hi.len()), per(out.d.len()), per(out.m.len()), per(out.sub.len()));
    let (mut codes, mut ordered) = (vec![0u8; padded], vec![0u8; padded]);
    let mut s = RowScales { d: vec![0.0; d_row], m: vec![0.0; d_row], sub: vec![0; sub_row] };
    let hb = bits.high_bits();
    for (r, row) in src.chunks_exact(row_bytes).enumerate() {
        codes.fill(0);
        s.d.fill(0.0);
        s.m.fill(0.0);
        decode_row(dtype, row, &mut codes, &mut s);
        // Each group into lane order.
        for (start, n) in groups(padded / CHUNK) {
            let at = start * CHUNK..(start + n) * CHUNK;
            scatter(&codes[at.clone()], &mut ordered[at], n);
        }
        let qs = &mut out.qs[r * qs_row..][..qs_row];
        if bits == Bits::Eight {
            qs.copy_from_slice(&ordered);
        } else {
            // Chunk pairs share bytes (low nibble: the first chunk); an unpaired last chunk
            // holds positions i and i + 32.
            for (pair, q) in ordered.chunks(2 * CHUNK).zip(qs.chunks_mut(CHUNK)) {
                let half = pair.len() / 2;
                for (i, b) in q.iter_mut().enumerate() {
                    *b = (pair[i] & 0xF) | (pair[half + i] << 4);
                }
            }
        }
        if hb > 0 {
            // Per chunk 8·hb bytes; position v's high bits in byte v % (8·hb), at hb·(v / (8·hb)).
            let group = 8 * hb;
            let hi = &mut out.hi[r * hi_row..][..hi_row];
            for (chunk, bytes) in ordered.chunks_exact(CHUNK).zip(hi.chunks_exact_mut(group)) {
                for (v, &q) in chunk.iter().enumerate() {
                    bytes[v % group] |= (q >> 4) << (hb * (v / group));
                }
            }
        }
        // The scales come from f16 values of the file: exact.
        for (o, &x) in out.d[r * d_row..][..d_row].iter_mut().zip(&s.d) {
            *o = f16::from_f32(x).to_bits();
        }
        for (o, &x) in out.m[r * m_row..][..m_row].iter_mut().zip(&s.m) {
            *o = f16::from_f32(x).to_bits();
        }
        out.sub[r * sub_row..][..sub_row].copy_from_slice(&s.sub);
    }
}

/// A quantized (rows, cols) weight matrix in the engine's layout.
#[derive(Debug, Clone)]
pub struct QMatrix {
    rows: usize,
    cols: usize,
    padded: usize,
    bits: Bits,
    scales: Scales,
    qs: Vec<u8>,
    /// The high bits of 5- and 6-bit codes (`padded / 8 · high_bits` bytes per row).
    hi: Vec<u8>,
    /// f16 bits: `d` and `m` per 32 values (`Block`), or `d` and `dmin` per 256 (`Super`,
    /// `Six`), see [`Scales`].
    d: Vec<u16>,
    m: Vec<u16>,
    /// Sub-block scales of `Super` and `Six`, 16 bytes per 256 values.
    sub: Vec<u8>,
}

impl QMatrix {
    /// True for the GGUF block types this layout can hold.
    pub fn supports(dtype: GgmlDType) -> bool {
        Self::bits_of(dtype).is_some()
    }

    fn bits_of(dtype: GgmlDType) -> Option<Bits> {
        use GgmlDType::*;
        match dtype {
            Q8_0 => Some(Bits::Eight),
            Q4_0 | Q4_1 | Q4K => Some(Bits::Four),
            Q5_0 | Q5_1 | Q5K => Some(Bits::Five),
            Q6K => Some(Bits::Six),
            _ => None,
        }
    }

    /// Repacks GGUF blocks of `dtype` (row-major, `rows × cols` values) into this layout.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for an unsupported type or sizes that do not fit the bytes.
    pub fn from_ggml(dtype: GgmlDType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let block = dtype.block_size();
        let expected = rows.checked_mul(cols).map(|n| n / block).and_then(|n| n.checked_mul(dtype.type_size()));
        let bits = Self::bits_of(dtype);
        let (Some(bits), true, true) = (bits, cols.is_multiple_of(block) && cols > 0, Some(bytes.len()) == expected)
        else {
            return Err(Error::setting(
                "quantized tensor",
                format!("{dtype:?} {rows}x{cols}, {} bytes", bytes.len()),
                "Q8_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K or Q6_K with whole blocks per row",
            ));
        };
        let scales = match dtype {
            GgmlDType::Q4K | GgmlDType::Q5K => Scales::Super,
            GgmlDType::Q6K => Scales::Six,
            GgmlDType::Q8_0 => Scales::Block { implied: Some(-128.0) },
            GgmlDType::Q4_0 => Scales::Block { implied: Some(-8.0) },
            GgmlDType::Q5_0 => Scales::Block { implied: Some(-16.0) },
            _ => Scales::Block { implied: None },
        };
        const WHAT: &str = "quantized matrix";
        let padded = round_up(WHAT, cols, CHUNK)?;
        let mut out = Self {
            rows,
            cols,
            padded,
            bits,
            scales,
            qs: Vec::new(),
            hi: Vec::new(),
            d: Vec::new(),
            m: Vec::new(),
            sub: Vec::new(),
        };
        let row_bytes = product(WHAT, &[cols / block, dtype.type_size()])?;
        // Per row, each part is at most `padded` long: only the totals can overflow.
        let (d, m, sub) = out.per_row();
        let (qs, hi) = (bits.row_bytes(padded), out.hi_row_bytes());
        out.qs = vec![0; product(WHAT, &[rows, qs])?];
        out.hi = vec![0; product(WHAT, &[rows, hi])?];
        out.d = vec![0; product(WHAT, &[rows, d])?];
        out.m = vec![0; product(WHAT, &[rows, m])?];
        out.sub = vec![0; product(WHAT, &[rows, sub])?];
        // Rows are independent: runs of rows over the thread team, each into its own slices.
        let parts = (
            OutPtr::new(&mut out.qs),
            OutPtr::new(&mut out.hi),
            OutPtr::new(&mut out.d),
            OutPtr::new(&mut out.m),
            OutPtr::new(&mut out.sub),
        );
        let layout = (bits, padded, row_bytes);
        team().run(rows, REPACK_ROWS, &|r| {
            let (start, n) = (r.start, r.len());
            // SAFETY: each run of rows owns its own rows of the five parts.
            let out = unsafe {
                RowsOut {
                    qs: parts.0.slice(start * qs, n * qs),
                    hi: parts.1.slice(start * hi, n * hi),
                    d: parts.2.slice(start * d, n * d),
                    m: parts.3.slice(start * m, n * m),
                    sub: parts.4.slice(start * sub, n * sub),
                }
            };
            repack_rows(dtype, layout, &bytes[start * row_bytes..r.end * row_bytes], out);
        });
        Ok(out)
    }

    /// Per row: the `d` values, the `m` values, and the bytes of `sub`.
    fn per_row(&self) -> (usize, usize, usize) {
        let (blocks, supers) = (self.padded / 32, self.padded / 256);
        match self.scales {
            Scales::Block { implied } => (blocks, if implied.is_some() { 0 } else { blocks }, 0),
            Scales::Super => (supers, supers, 16 * supers),
            Scales::Six => (supers, 0, 16 * supers),
        }
    }

    /// Stacks matrices of the same width and code size by rows; `None` for an empty list or
    /// parts that differ.
    pub fn stack(parts: Vec<QMatrix>) -> Option<QMatrix> {
        let mut it = parts.into_iter();
        let mut first = it.next()?;
        for p in it {
            if p.cols != first.cols || p.bits != first.bits || p.scales != first.scales {
                return None;
            }
            first.rows += p.rows;
            first.qs.extend(p.qs);
            first.hi.extend(p.hi);
            first.d.extend(p.d);
            first.m.extend(p.m);
            first.sub.extend(p.sub);
        }
        Some(first)
    }

    /// A matrix of the rows `ids` of this one, in that order, with their blocks as they are
    /// (nothing is re-quantized); `None` if an id is out of range.
    pub fn select_rows(&self, ids: &[usize]) -> Option<QMatrix> {
        let (qs, hi, d, m, sub) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut out = QMatrix { rows: 0, qs, hi, d, m, sub, ..*self };
        out.append_rows(self, ids).then_some(out)
    }

    /// Appends the rows `ids` of `from`, a matrix of the same type and width, with their blocks
    /// as they are. False, with nothing appended, if the types or widths differ or an id is out
    /// of range.
    pub fn append_rows(&mut self, from: &QMatrix, ids: &[usize]) -> bool {
        let same = (self.cols, self.padded, self.bits, self.scales) == (from.cols, from.padded, from.bits, from.scales);
        if !same || ids.iter().any(|&r| r >= from.rows) {
            return false;
        }
        let (per_d, per_m, per_sub) = from.per_row();
        let (qs, hi) = (from.bits.row_bytes(from.padded), from.hi_row_bytes());
        // Row by row as slices (a byte iterator is slow on a large head; docs/perf/kernels.md).
        fn gather<T: Copy>(to: &mut Vec<T>, from: &[T], per_row: usize, ids: &[usize]) {
            to.reserve(ids.len() * per_row);
            ids.iter().for_each(|&r| to.extend_from_slice(&from[r * per_row..(r + 1) * per_row]));
        }
        gather(&mut self.qs, &from.qs, qs, ids);
        gather(&mut self.hi, &from.hi, hi, ids);
        gather(&mut self.d, &from.d, per_d, ids);
        gather(&mut self.m, &from.m, per_m, ids);
        gather(&mut self.sub, &from.sub, per_sub, ids);
        self.rows += ids.len();
        true
    }

    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.qs.len() + self.hi.len() + 2 * (self.d.len() + self.m.len()) + self.sub.len()
    }

    fn row_qs(&self, r: usize) -> &[u8] {
        let len = self.bits.row_bytes(self.padded);
        &self.qs[r * len..(r + 1) * len]
    }

    /// Bytes of the high plane per row.
    fn hi_row_bytes(&self) -> usize {
        self.padded / 8 * self.bits.high_bits()
    }

    /// The code of value `i` of row `r`.
    fn code(&self, r: usize, i: usize) -> u8 {
        let qs = self.row_qs(r);
        let at = locate(self.padded / CHUNK, i);
        let (chunk, pos) = (at / CHUNK, at % CHUNK);
        let low = match self.bits {
            Bits::Eight => return qs[chunk * CHUNK + pos],
            _ if chunk % 2 == 1 => qs[(chunk - 1) * 32 + pos] >> 4,
            _ if chunk + 1 < self.padded / CHUNK => qs[chunk * 32 + pos] & 0xF,
            _ => {
                let byte = qs[chunk * 32 + pos % 32];
                if pos < 32 {
                    byte & 0xF
                } else {
                    byte >> 4
                }
            }
        };
        let hb = self.bits.high_bits();
        if hb == 0 {
            return low;
        }
        let group = 8 * hb;
        let byte = self.hi[r * self.hi_row_bytes() + chunk * group + pos % group];
        low | (((byte >> (hb * (pos / group))) & ((1 << hb) - 1)) << 4)
    }

    /// The scale and offset of value `i` of row `r`.
    fn scale(&self, r: usize, i: usize) -> (f32, f32) {
        let (per_d, per_m, per_sub) = self.per_row();
        match self.scales {
            Scales::Block { implied } => {
                let (b, d) = (i / 32, half(self.d[r * per_d + i / 32]));
                (d, implied.map_or_else(|| half(self.m[r * per_m + b]), |k| k * d))
            }
            Scales::Super => {
                let (g, b) = (i / 256, i % 256 / 32);
                let sub = &self.sub[r * per_sub + 16 * g..][..16];
                let (d, dmin) = (half(self.d[r * per_d + g]), half(self.m[r * per_m + g]));
                (d * f32::from(sub[b]), -dmin * f32::from(sub[8 + b]))
            }
            Scales::Six => {
                let sc = self.sub[r * per_sub + i / 16] as i8;
                let d = half(self.d[r * per_d + i / 256]) * f32::from(sc);
                (d, -32.0 * d)
            }
        }
    }

    /// Row `r` as f32 values (`cols` of them) into `out`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate().take(self.cols) {
            let (d, m) = self.scale(r, i);
            *o = d * self.code(r, i) as f32 + m;
        }
    }
}

fn half(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// A SIMD kernel's view of a tile's weight rows, from its first, as raw pointers.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Weights {
    qs: *const u8,
    row_bytes: usize,
    plane: *const u8,
    hi_row: usize,
    scales: Scales,
    /// The `d`, `m` and `sub` parts of the scales (see [`Scales`]), and their lengths per row.
    d: *const u16,
    m: *const u16,
    sub: *const u8,
    per_row: (usize, usize, usize),
}

#[cfg(target_arch = "x86_64")]
impl Weights {
    /// Rows `c0..` of `w`.
    ///
    /// # Safety
    /// `c0 < w.rows` (the offsets stay inside the allocations; the empty `m` and `sub` of some
    /// types are offset with `wrapping_add` and never read).
    unsafe fn new(w: &QMatrix, c0: usize) -> Self {
        // SAFETY: the caller upholds this function's contract (its `# Safety` section, or the
        // target features it is compiled for); the operations below rely on nothing else.
        unsafe {
            let (row_bytes, hi_row, per_row) = (w.bits.row_bytes(w.padded), w.hi_row_bytes(), w.per_row());
            Self {
                qs: w.qs.as_ptr().add(c0 * row_bytes),
                row_bytes,
                plane: w.hi.as_ptr().wrapping_add(c0 * hi_row),
                hi_row,
                scales: w.scales,
                d: w.d.as_ptr().add(c0 * per_row.0),
                m: w.m.as_ptr().wrapping_add(c0 * per_row.1),
                sub: w.sub.as_ptr().wrapping_add(c0 * per_row.2),
                per_row,
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Weights {
    /// Fetches into L2 the bytes that the group of `c` chunks from `start` (group `g`) of row
    /// `i + ahead` needs: its codes, with `high` its high bits, and with `scales` the cache
    /// lines where its scales begin (a line holds the scales of four groups or more, so a
    /// kernel may ask for them every fourth group: see the AVX-512 kernel). Rows are short
    /// streams the hardware prefetchers pick up late, and the scale parts (a few bytes a
    /// group) are the shortest: fetched on demand they stall the AVX-512 kernel. The 256-bit
    /// kernels, bound by their arithmetic, lose to the extra prefetches at several rows and
    /// fetch codes only for three or more rows; for one or two they fetch everything. (Into L1
    /// measured no better; the measurements are in docs/perf/kernels.md.) The addresses may
    /// run past the matrix near its end: they are computed with
    /// `wrapping_add` and only prefetched, never read.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn prefetch(
        &self,
        i: usize,
        ahead: usize,
        start: usize,
        g: usize,
        c: usize,
        bits: u8,
        (high, scales): (bool, bool),
    ) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let row = i + ahead;
        let code_bytes = if bits == 8 { c * CHUNK } else { c * CHUNK / 2 };
        let codes = self.qs.wrapping_add(row * self.row_bytes + start * (code_bytes / c));
        let (per_d, per_m, per_sub) = self.per_row;
        let (d, m) = match self.scales {
            Scales::Block { .. } => (start * 2, start * 2),
            Scales::Super | Scales::Six => (g, g),
        };
        let hb = match bits {
            5 => 1,
            6 => 2,
            _ => 0,
        };
        // SAFETY: prefetching is a hint with no effect on memory, whatever the address.
        unsafe {
            for line in 0..code_bytes.div_ceil(CHUNK) {
                _mm_prefetch::<_MM_HINT_T1>(codes.wrapping_add(line * CHUNK) as *const i8);
            }
            if high && hb > 0 {
                _mm_prefetch::<_MM_HINT_T1>(self.plane.wrapping_add(row * self.hi_row + start * 8 * hb) as *const i8);
            }
            if !scales {
                return;
            }
            // The parts this type has (an empty part's pointer leads nowhere worth a page walk).
            if per_sub > 0 {
                _mm_prefetch::<_MM_HINT_T1>(self.sub.wrapping_add(row * per_sub + 16 * g) as *const i8);
            }
            _mm_prefetch::<_MM_HINT_T1>(self.d.wrapping_add(row * per_d + d) as *const i8);
            if per_m > 0 {
                _mm_prefetch::<_MM_HINT_T1>(self.m.wrapping_add(row * per_m + m) as *const i8);
            }
        }
    }
}

/// A SIMD kernel's view of a pass's activation rows (one of [`passes`]), as raw pointers
/// into the pass's block of [`QActs`].
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Acts {
    xq: *const i8,
    dx: *const f32,
    sx: *const f32,
    rows: usize,
}

#[cfg(target_arch = "x86_64")]
impl Acts {
    /// The pass of `rows` rows from `r0` (one of [`passes`]) of `a`.
    ///
    /// # Safety
    /// `(r0, rows)` is one of `passes(a.rows)`.
    unsafe fn new(a: &QActs, r0: usize, rows: usize) -> Self {
        let groups = group_count(a.padded / CHUNK);
        // SAFETY: the pass's block lies within the arrays (see `QActs::quantize`).
        unsafe {
            Self {
                xq: a.xq.as_ptr().add(r0 * a.padded),
                dx: a.lane_dx.as_ptr().add(r0 * groups * 16),
                sx: a.lane_sx.as_ptr().add(r0 * groups * 16),
                rows,
            }
        }
    }

    /// The pass's first row's codes in the group from chunk `start`; row `r` of the pass
    /// follows at `r·n·64` bytes for a group of `n` chunks, a constant offset from one pointer.
    ///
    /// # Safety
    /// The group lies within the rows.
    #[inline(always)]
    unsafe fn codes(&self, start: usize) -> *const i8 {
        // SAFETY: within the pass's block by the caller's contract.
        unsafe { self.xq.add(start * CHUNK * self.rows) }
    }

    /// The pass's first row's 16 lanes of `dx` and of `sx` in lane group `g`; row `r` follows
    /// at `16·r` values.
    ///
    /// # Safety
    /// `g` is a lane group of the rows.
    #[inline(always)]
    unsafe fn lanes(&self, g: usize) -> (*const f32, *const f32) {
        // SAFETY: within the pass's block by the caller's contract.
        unsafe { (self.dx.add(g * self.rows * 16), self.sx.add(g * self.rows * 16)) }
    }
}

/// Activation rows quantized per 32 values: `xq` (i8, in lane order), `dx` and `sx = dx·Σxq`
/// per 32 values, `sx16` the same sums per 16 values (for Q6_K's offsets); and per lane group
/// of each row, 16 lanes of `dx` (each lane's block's) and of `dx·Σxq` over each lane's values.
///
/// `xq` and the lanes are stored by the kernels' `passes`, and group-major within a pass:
/// the pass of `p` rows from row `r0` starts at byte `r0·padded` of `xq`; in it, the lane group
/// of `n` chunks from chunk `start` holds the pass's rows' `n·64` codes in turn from byte
/// `start·64·p` (row `r0 + r` at `r·n·64` past it); the pass's lanes start at `r0·groups·16`,
/// group `g`'s at `g·p·16` past that, 16 a row. A pass thus finds all its rows at constant
/// offsets from one pointer a group (with one pointer per row per array, 4–6 rows spilled
/// the AVX2 kernel's registers), and its block is contiguous (rows of other passes in between
/// doubled the traffic from L2 where a large activation set needs two passes).
#[derive(Debug, Default)]
pub struct QActs {
    rows: usize,
    padded: usize,
    xq: Vec<i8>,
    dx: Vec<f32>,
    sx: Vec<f32>,
    sx16: Vec<f32>,
    lane_dx: Vec<f32>,
    lane_sx: Vec<f32>,
    /// Scratch: every row's `xq` in natural order.
    natural: Vec<i8>,
}

impl QActs {
    /// Quantizes `m` rows of `x` (each `k` long) for products with matrices of `k` columns.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when the rows' size overflows `usize`; [`Error::InvalidSetting`]
    /// when `x` holds fewer than `m·k` values.
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize) -> Result<()> {
        const WHAT: &str = "activations";
        let padded = round_up(WHAT, k, CHUNK)?;
        // Every buffer below holds at most `m·padded` values.
        product(WHAT, &[m, padded])?;
        if x.len() < m * k {
            return Err(Error::setting(WHAT, format!("{} values for {m}x{k}", x.len()), "at least rows × cols values"));
        }
        let (nb, chunks) = (padded / 32, padded / CHUNK);
        let groups_per_row = group_count(chunks);
        self.rows = m;
        self.padded = padded;
        self.xq.clear();
        self.xq.resize(m * padded, 0);
        self.dx.resize(m * nb, 0.0);
        self.sx.resize(m * nb, 0.0);
        self.sx16.resize(m * 2 * nb, 0.0);
        self.lane_dx.resize(m * 16 * groups_per_row, 0.0);
        self.lane_sx.resize(m * 16 * groups_per_row, 0.0);
        self.natural.resize(m * padded, 0);
        // The blocks of all rows, in runs shared out over the thread team (the calling thread
        // alone spent a twentieth of a five-row forward pass here, the other waiting).
        let (natural, dx, sx, sx16) = (
            OutPtr::new(&mut self.natural),
            OutPtr::new(&mut self.dx),
            OutPtr::new(&mut self.sx),
            OutPtr::new(&mut self.sx16),
        );
        team().run(m * nb, QUANTIZE_GRAIN, &|blocks| {
            let mut b = blocks.start;
            while b < blocks.end {
                // The run's blocks in row r, from its block `first`.
                let (r, first) = (b / nb, b % nb);
                let count = (blocks.end - b).min(nb - first);
                // SAFETY: each run of blocks owns its own parts of the four arrays.
                unsafe {
                    quantize_blocks(
                        &x[r * k..(r + 1) * k],
                        first,
                        natural.slice(b * 32, count * 32),
                        dx.slice(b, count),
                        sx.slice(b, count),
                        sx16.slice(2 * b, 2 * count),
                    );
                }
                b += count;
            }
        });
        for r in 0..m {
            let (natural, dx) = (&self.natural[r * padded..][..padded], &self.dx[r * nb..][..nb]);
            let (r0, p) = pass_of(m, r);
            for (g, (start, n)) in groups(chunks).enumerate() {
                let at = start * CHUNK..(start + n) * CHUNK;
                let lane = (r0 * groups_per_row + g * p + r - r0) * 16;
                let (lane_dx, lane_sx) = (&mut self.lane_dx[lane..][..16], &mut self.lane_sx[lane..][..16]);
                // Lane l of the group covers values 4n·l.. of it, in block (start·64 + 4n·l) / 32.
                for (l, values) in natural[at.clone()].chunks_exact(4 * n).enumerate() {
                    lane_dx[l] = dx[(start * CHUNK + 4 * n * l) / 32];
                    lane_sx[l] = lane_dx[l] * values.iter().map(|&q| i32::from(q)).sum::<i32>() as f32;
                }
                let to = &mut self.xq[codes_at(padded, (r0, p), r, start, n)..][..n * CHUNK];
                scatter(&natural[at], to, n);
            }
        }
        Ok(())
    }

    /// Where value `i` of row `r` is stored in `xq` (see the layout above).
    fn at(&self, r: usize, i: usize) -> usize {
        let chunks = self.padded / CHUNK;
        let (start, n) = group_of(chunks, i / CHUNK);
        codes_at(self.padded, pass_of(self.rows, r), r, start, n) + locate(chunks, i) - start * CHUNK
    }
}

multiversion! {
    /// Per 32 values of the row `x` from block `first` on (`xq.len() / 32` blocks, the row
    /// padded with zeros): `dx = max|x| / 127`, `xq = round(x / dx)`, `sx = dx·Σxq`, and `sx16`
    /// per 16 values; all in natural order.
    fn quantize_blocks(x: &[f32], first: usize, xq: &mut [i8], dx: &mut [f32], sx: &mut [f32], sx16: &mut [f32]) {
        let k = x.len();
        for (b, block) in xq.chunks_exact_mut(32).enumerate() {
            // A whole block as a fixed-size array (all but a row's padded end), so that the
            // loops vectorize.
            let mut vals = [0f32; 32];
            let at = (first + b) * 32;
            let part = &x[at.min(k)..(at + 32).min(k)];
            vals[..part.len()].copy_from_slice(part);
            // max |v| over the bits (for floats that are not NaN, the order of the bits without
            // the sign is the order of the magnitudes): an integer maximum vectorizes, while
            // `f32::max`'s NaN rule kept the fold scalar. A NaN counts as 0, as `f32::max`
            // skipped it. (Plain loops: array `map`s were left as calls.)
            let mut mags = [0u32; 32];
            for (m, v) in mags.iter_mut().zip(&vals) {
                let bits = v.to_bits() & 0x7FFF_FFFF;
                *m = if bits > 0x7F80_0000 { 0 } else { bits };
            }
            let d = f32::from_bits(tree(mags, u32::max)) / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut q = [0i32; 32];
            for (q, v) in q.iter_mut().zip(&vals) {
                // Rounded to the nearest integer, ties to even, by adding 1.5·2^23 (where floats
                // are one apart) and reading the integer off the bits: this vectorizes, where
                // `round_ties_even` and a saturating cast stayed scalar. |v·inv| <= 127; a NaN
                // gives 0, as the cast did.
                let y = v * inv;
                let y = if y.is_nan() { 0.0 } else { y };
                *q = (y + 12_582_912.0).to_bits() as i32 - 0x4B40_0000;
            }
            for (o, &q) in block.iter_mut().zip(&q) {
                *o = q as i8;
            }
            let (mut low, mut high) = ([0i32; 16], [0i32; 16]);
            low.copy_from_slice(&q[..16]);
            high.copy_from_slice(&q[16..]);
            let sums = [tree(low, |a, b| a + b), tree(high, |a, b| a + b)];
            dx[b] = d;
            sx[b] = d * (sums[0] + sums[1]) as f32;
            sx16[2 * b] = d * sums[0] as f32;
            sx16[2 * b + 1] = d * sums[1] as f32;
        }
    }
}

/// `op` over `v` (N a power of two: 16 or 32 values here) as a tree of halves: the compiler
/// makes it a few vector steps, where a running fold over the values became a scalar chain of
/// lane extractions (most of `quantize_blocks`'s time). For an associative and commutative
/// `op` on integers the result is the fold's.
#[inline(always)]
fn tree<T: Copy, const N: usize>(v: [T; N], op: impl Fn(T, T) -> T) -> T {
    const { assert!(N.is_power_of_two()) };
    let mut v = v;
    let mut n = N;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            v[i] = op(v[i], v[i + n]);
        }
    }
    v[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    pub(super) fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2000) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// Quantizes with candle, repacks, and compares the dequantized rows with candle's.
    pub(super) fn repack(dtype: GgmlDType, rows: usize, cols: usize) -> (QMatrix, Vec<f32>) {
        let w = Tensor::from_vec(data(rows * cols, 7), (rows, cols), &Device::Cpu).expect("tensor");
        let q = QTensor::quantize(&w, dtype).expect("quantize");
        let deq =
            q.dequantize(&Device::Cpu).expect("dequantize").flatten_all().expect("flat").to_vec1::<f32>().expect("vec");
        let m = QMatrix::from_ggml(dtype, &q.data().expect("bytes"), rows, cols).expect("repack");
        (m, deq)
    }

    pub(super) const TYPES: [GgmlDType; 8] = [
        GgmlDType::Q8_0,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q4K,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ];

    /// K-quants need rows of whole 256-value super-blocks.
    pub(super) fn k_quant(dtype: GgmlDType) -> bool {
        matches!(dtype, GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K)
    }

    #[test]
    fn passes_cover_the_rows_evenly_and_blocks_cover_the_passes() {
        for rows in 1..=400 {
            let all: Vec<(usize, usize)> = passes(rows).collect();
            assert_eq!(all.len(), rows.div_ceil(PASS_ROWS), "{rows} rows");
            let mut next = 0;
            for &(r0, n) in &all {
                assert!(r0 == next && (1..=PASS_ROWS).contains(&n), "{rows} rows: {all:?}");
                assert!(all[0].1 - n <= 1, "{rows} rows: uneven {all:?}");
                next += n;
            }
            assert_eq!(next, rows);
            for padded in [64, 1536, 8960] {
                let blocks: Vec<Range<usize>> = pass_blocks(rows, padded).collect();
                let covered: Vec<usize> = blocks.iter().flat_map(|b| b.clone()).collect();
                assert_eq!(covered, (0..all.len()).collect::<Vec<_>>(), "{rows} rows of {padded}: {blocks:?}");
            }
        }
    }

    #[test]
    fn repacked_rows_dequantize_like_candle() {
        for dtype in TYPES {
            // 576 values = 9 chunks: an odd last chunk (Q4_K blocks need multiples of 256).
            let (rows, cols) = (5, if k_quant(dtype) { 512 } else { 576 });
            let (m, deq) = repack(dtype, rows, cols);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                m.dequantize_row(r, &mut row);
                for (a, b) in row.iter().zip(&deq[r * cols..]) {
                    // The scales are the file's, so the values are too (up to f32 rounding).
                    assert!((a - b).abs() <= 1e-6, "{dtype:?}: {a} vs {b}");
                }
            }
        }
    }

    /// The quantized activations are `round_ties_even(x / dx)` with `dx = max|x| / 127` per
    /// 32 values, a NaN giving 0 (and counting as 0 in the maximum), in rows split across the
    /// thread team's runs at any block.
    #[test]
    fn activations_round_half_to_even() {
        let (m, k) = (3, 50 * 32 + 7);
        // Halves of the step (ties) and values between, with max |x| = 127 in every block.
        let mut x: Vec<f32> = (0..m * k).map(|i| (i % 61) as f32 * 0.5 - 15.0).collect();
        for (i, v) in x.iter_mut().enumerate() {
            if i % k % 32 == 5 {
                *v = if i % 2 == 0 { 127.0 } else { -127.0 };
            }
        }
        x[k + 40] = f32::NAN;
        let mut a = QActs::default();
        a.quantize(&x, m, k).expect("quantize");
        for r in 0..m {
            for i in 0..k {
                let v = x[r * k + i];
                let want = if v.is_nan() { 0 } else { v.round_ties_even() as i8 };
                assert_eq!(a.xq[a.at(r, i)], want, "row {r} value {i}: {v}");
            }
        }
    }

    /// Repacked in runs of rows over the thread team (more rows than a run, the last run cut
    /// short), a matrix holds the bytes of its rows repacked one at a time.
    #[test]
    fn runs_of_rows_repack_like_single_rows() {
        for dtype in TYPES {
            let (rows, cols) = (2 * REPACK_ROWS + 37, if k_quant(dtype) { 512 } else { 576 });
            let w = Tensor::from_vec(data(rows * cols, 3), (rows, cols), &Device::Cpu).expect("tensor");
            let bytes = QTensor::quantize(&w, dtype).expect("quantize").data().expect("bytes").to_vec();
            let whole = QMatrix::from_ggml(dtype, &bytes, rows, cols).expect("repack");
            let row_bytes = bytes.len() / rows;
            let single: Vec<QMatrix> = bytes
                .chunks_exact(row_bytes)
                .map(|row| QMatrix::from_ggml(dtype, row, 1, cols).expect("one row"))
                .collect();
            let Some(single) = QMatrix::stack(single) else { panic!("{dtype:?}: rows do not stack") };
            let parts = |m: &QMatrix| (m.qs.clone(), m.hi.clone(), m.d.clone(), m.m.clone(), m.sub.clone());
            assert!(parts(&whole) == parts(&single), "{dtype:?}: the runs' bytes differ");
        }
    }

    /// Sizes that overflow `usize` are an error where the buffers would be made.
    #[test]
    fn overflowing_sizes_are_an_error() {
        let mut a = QActs::default();
        assert!(matches!(a.quantize(&[], 1 << 63, 32), Err(Error::TooLarge { .. })));
        assert!(matches!(a.quantize(&[], 1, usize::MAX - 1), Err(Error::TooLarge { .. })));
        assert!(matches!(a.quantize(&[0.5; 63], 2, 32), Err(Error::InvalidSetting { .. })));
        // Still usable after a refusal.
        a.quantize(&[0.5; 64], 2, 32).expect("quantize");
        assert_eq!(a.xq[a.at(1, 31)], 127);
        // No rows (so no bytes) and a row's padded size past `usize`.
        let cols = usize::MAX / 32 * 32;
        assert!(matches!(QMatrix::from_ggml(GgmlDType::Q8_0, &[], 0, cols), Err(Error::TooLarge { .. })));
        assert!(QMatrix::from_ggml(GgmlDType::Q8_0, &[0; 34], 1 << 62, 32).is_err());
    }

    #[test]
    fn selected_rows_are_the_same_blocks() {
        for dtype in TYPES {
            let (rows, cols) = (5, if k_quant(dtype) { 512 } else { 576 });
            let (m, _) = repack(dtype, rows, cols);
            let ids = [4, 0, 4, 2];
            let Some(part) = m.select_rows(&ids) else { panic!("{dtype:?}: rows in range refused") };
            assert_eq!((part.rows(), part.cols()), (4, cols));
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for (i, &r) in ids.iter().enumerate() {
                part.dequantize_row(i, &mut a);
                m.dequantize_row(r, &mut b);
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{dtype:?}: row {r}");
            }
            assert!(m.select_rows(&[5]).is_none(), "{dtype:?}: a row past the end");
            // Appended rows are the same blocks too; a row past the end appends nothing.
            let mut grown = part.clone();
            assert!(grown.append_rows(&m, &[1, 3]) && !grown.append_rows(&m, &[5]), "{dtype:?}");
            assert_eq!(grown.rows(), 6);
            for (i, r) in [(0, 4), (4, 1), (5, 3)] {
                grown.dequantize_row(i, &mut a);
                m.dequantize_row(r, &mut b);
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{dtype:?}: appended row {r}");
            }
        }
        // Rows of another type do not append.
        let (q8, _) = repack(GgmlDType::Q8_0, 2, 512);
        let (mut q4, _) = repack(GgmlDType::Q4_0, 2, 512);
        assert!(!q4.append_rows(&q8, &[0]) && q4.rows() == 2);
    }
}
