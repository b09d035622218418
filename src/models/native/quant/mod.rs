//! Quantized weights for the native engine, and their products with a few activation rows.
//!
//! Every supported GGUF block type (Q8_0, Q4_0, Q4_1, Q4_K) is repacked at load into one
//! layout: per 32 values an unsigned code `q` (4 or 8 bits), a scale `d` and an offset `m`,
//! with `w = d·q + m`. Activations are quantized per 32 values to `x ≈ dx·xq` (i8), so
//!
//!   Σ w·x ≈ Σ_blocks ( d·dx·Σ q·xq  +  m·sx ),   sx = dx·Σ xq,
//!
//! and the inner sum `Σ q·xq` is an integer dot product: one AVX-512 VNNI `vpdpbusd` covers 64
//! values (u8 × i8), and each weight block is unpacked once for all activation rows. This is
//! the scheme llama.cpp uses (quantized activations, integer dots); the single layout keeps one
//! kernel for all four formats. Rows are padded to a multiple of 64 values with zero blocks.
//!
//! Within each 64-value chunk, codes (and quantized activations) are stored in *interleaved*
//! order: 4 values of the first block, 4 of the second, and so on. `vpdpbusd` sums groups of 4
//! bytes per lane, so lanes alternate between the two blocks and their scales are one 8-byte
//! broadcast `[d0, d1, d0, d1, …]`. 4-bit codes of two neighbouring chunks share 64 bytes (low
//! nibbles for the first chunk, high for the second), so one load and three operations unpack
//! 128 codes.

use candle_core::quantized::GgmlDType;
use half::f16;

use crate::error::{Error, Result};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod kernel;

pub use kernel::{qmatmul, qmatmul_parallel, qmatmul_portable};

/// Values per chunk the kernels step over (two 32-value blocks).
const CHUNK: usize = 64;

/// Bits per code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bits {
    /// Two codes per byte: chunks in pairs, byte i holding position i of the first chunk (low
    /// nibble) and of the second (high); an odd last chunk holds positions i and i + 32.
    Four,
    /// One code per byte.
    Eight,
}

/// A quantized (rows, cols) weight matrix in the engine's layout.
#[derive(Debug, Clone)]
pub struct QMatrix {
    rows: usize,
    cols: usize,
    padded: usize,
    bits: Bits,
    qs: Vec<u8>,
    /// Scales and offsets per 32 values, as f16 bits (exact for Q8_0, Q4_0 and Q4_1, whose
    /// blocks store them in f16; within 2^-11 for Q4_K's products of two scales).
    d: Vec<u16>,
    m: Vec<u16>,
}

impl QMatrix {
    /// True for the GGUF block types this layout can hold.
    pub fn supports(dtype: GgmlDType) -> bool {
        matches!(dtype, GgmlDType::Q8_0 | GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q4K)
    }

    /// Repacks GGUF blocks of `dtype` (row-major, `rows × cols` values) into this layout.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for an unsupported type or sizes that do not fit the bytes.
    pub fn from_ggml(dtype: GgmlDType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let block = dtype.block_size();
        let expected = rows * cols / block * dtype.type_size();
        if !Self::supports(dtype) || !cols.is_multiple_of(block) || bytes.len() != expected {
            return Err(Error::setting(
                "quantized tensor",
                format!("{dtype:?} {rows}x{cols}, {} bytes", bytes.len()),
                "Q8_0, Q4_0, Q4_1 or Q4_K with whole blocks per row",
            ));
        }
        let bits = if dtype == GgmlDType::Q8_0 { Bits::Eight } else { Bits::Four };
        let padded = cols.div_ceil(CHUNK) * CHUNK;
        let mut out = Self { rows, cols, padded, bits, qs: Vec::new(), d: Vec::new(), m: Vec::new() };
        let row_bytes = cols / block * dtype.type_size();
        let (mut codes, mut d, mut m) = (vec![0u8; padded], vec![0f32; padded / 32], vec![0f32; padded / 32]);
        for row in bytes.chunks_exact(row_bytes) {
            codes.iter_mut().for_each(|c| *c = 0);
            d.iter_mut().for_each(|x| *x = 0.0);
            m.iter_mut().for_each(|x| *x = 0.0);
            decode_row(dtype, row, &mut codes, &mut d, &mut m);
            out.push_row(&codes, &d, &m);
        }
        Ok(out)
    }

    fn push_row(&mut self, codes: &[u8], d: &[f32], m: &[f32]) {
        // Reorder each chunk into interleaved positions.
        let mut ordered = vec![0u8; codes.len()];
        for (c, chunk) in codes.chunks_exact(CHUNK).enumerate() {
            for (v, &q) in chunk.iter().enumerate() {
                ordered[c * CHUNK + position(v)] = q;
            }
        }
        match self.bits {
            Bits::Eight => self.qs.extend_from_slice(&ordered),
            Bits::Four => {
                let mut pairs = ordered.chunks_exact(2 * CHUNK);
                for pair in &mut pairs {
                    self.qs.extend((0..CHUNK).map(|i| pair[i] | (pair[CHUNK + i] << 4)));
                }
                let last = pairs.remainder();
                if !last.is_empty() {
                    self.qs.extend((0..32).map(|i| last[i] | (last[i + 32] << 4)));
                }
            }
        }
        self.d.extend(d.iter().map(|&x| f16::from_f32(x).to_bits()));
        self.m.extend(m.iter().map(|&x| f16::from_f32(x).to_bits()));
    }

    /// Stacks matrices of the same width and code size by rows; `None` for an empty list or
    /// parts that differ.
    pub fn stack(parts: Vec<QMatrix>) -> Option<QMatrix> {
        let mut it = parts.into_iter();
        let mut first = it.next()?;
        for p in it {
            if p.cols != first.cols || p.bits != first.bits {
                return None;
            }
            first.rows += p.rows;
            first.qs.extend(p.qs);
            first.d.extend(p.d);
            first.m.extend(p.m);
        }
        Some(first)
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
        self.qs.len() + 2 * (self.d.len() + self.m.len())
    }

    fn row_qs(&self, r: usize) -> &[u8] {
        let len = match self.bits {
            Bits::Four => self.padded / 2,
            Bits::Eight => self.padded,
        };
        &self.qs[r * len..(r + 1) * len]
    }

    /// The code of value `i` of row `r`.
    fn code(&self, r: usize, i: usize) -> u8 {
        let qs = self.row_qs(r);
        let (chunk, pos) = (i / CHUNK, position(i % CHUNK));
        match self.bits {
            Bits::Eight => qs[chunk * CHUNK + pos],
            Bits::Four if chunk % 2 == 1 => qs[(chunk - 1) * 32 + pos] >> 4,
            Bits::Four if chunk + 1 < self.padded / CHUNK => qs[chunk * 32 + pos] & 0xF,
            Bits::Four => {
                let byte = qs[chunk * 32 + pos % 32];
                if pos < 32 {
                    byte & 0xF
                } else {
                    byte >> 4
                }
            }
        }
    }

    /// Row `r` as f32 values (`cols` of them) into `out`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.padded / 32;
        for (i, o) in out.iter_mut().enumerate().take(self.cols) {
            let b = r * nb + i / 32;
            *o = half(self.d[b]) * self.code(r, i) as f32 + half(self.m[b]);
        }
    }
}

/// Decodes one GGUF row into unsigned codes and per-32 scales and offsets (`w = d·q + m`).
fn decode_row(dtype: GgmlDType, row: &[u8], codes: &mut [u8], d: &mut [f32], m: &mut [f32]) {
    let h = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    match dtype {
        GgmlDType::Q8_0 => {
            for (b, blk) in row.chunks_exact(34).enumerate() {
                d[b] = h(blk, 0);
                m[b] = -128.0 * d[b];
                for (j, &q) in blk[2..].iter().enumerate() {
                    codes[b * 32 + j] = (q as i8 as i16 + 128) as u8;
                }
            }
        }
        GgmlDType::Q4_0 | GgmlDType::Q4_1 => {
            let size = dtype.type_size();
            for (b, blk) in row.chunks_exact(size).enumerate() {
                d[b] = h(blk, 0);
                m[b] = if dtype == GgmlDType::Q4_0 { -8.0 * d[b] } else { h(blk, 2) };
                let qs = &blk[size - 16..];
                for j in 0..16 {
                    codes[b * 32 + j] = qs[j] & 0xF;
                    codes[b * 32 + j + 16] = qs[j] >> 4;
                }
            }
        }
        GgmlDType::Q4K => {
            for (s, blk) in row.chunks_exact(144).enumerate() {
                let (dd, dmin) = (h(blk, 0), h(blk, 2));
                let (scales, qs) = (&blk[4..16], &blk[16..]);
                for j in 0..8 {
                    let (sc, mn) = scale_min_k4(j, scales);
                    d[s * 8 + j] = dd * sc as f32;
                    m[s * 8 + j] = -(dmin * mn as f32);
                }
                for c in 0..4 {
                    for j in 0..32 {
                        let byte = qs[c * 32 + j];
                        codes[s * 256 + c * 64 + j] = byte & 0xF;
                        codes[s * 256 + c * 64 + 32 + j] = byte >> 4;
                    }
                }
            }
        }
        _ => {}
    }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K super-block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn half(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// Where value `v` (0..64) of a chunk is stored: 4 values of the first block, 4 of the second,
/// alternating.
fn position(v: usize) -> usize {
    let (block, j) = (v / 32, v % 32);
    ((j / 4) * 2 + block) * 4 + j % 4
}

/// Activation rows quantized per 32 values: `xq` (i8, in interleaved chunk order), `dx`, and
/// `sx = dx·Σxq`.
#[derive(Debug, Default)]
pub struct QActs {
    rows: usize,
    padded: usize,
    xq: Vec<i8>,
    dx: Vec<f32>,
    sx: Vec<f32>,
}

impl QActs {
    /// Quantizes `m` rows of `x` (each `k` long) for products with matrices of `k` columns.
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize) {
        let padded = k.div_ceil(CHUNK) * CHUNK;
        let nb = padded / 32;
        self.rows = m;
        self.padded = padded;
        self.xq.clear();
        self.xq.resize(m * padded, 0);
        self.dx.resize(m * nb, 0.0);
        self.sx.resize(m * nb, 0.0);
        quantize_blocks(x, k, padded, &mut self.xq, &mut self.dx, &mut self.sx);
    }
}

multiversion! {
    /// Per 32 values of each row of `x` (rows of `k`, padded to `padded` with zeros):
    /// `dx = max|x| / 127`, `xq = round(x / dx)`, `sx = dx·Σxq`.
    fn quantize_blocks(x: &[f32], k: usize, padded: usize, xq: &mut [i8], dx: &mut [f32], sx: &mut [f32]) {
        let nb = padded / 32;
        for (r, row) in x.chunks_exact(k).enumerate() {
            for b in 0..nb {
                let vals = &row[(b * 32).min(k)..((b + 1) * 32).min(k)];
                let amax = vals.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                let chunk = &mut xq[r * padded + b / 2 * CHUNK..][..CHUNK];
                let mut sum = 0i32;
                for (j, &v) in vals.iter().enumerate() {
                    let q = (v * inv).round_ties_even() as i8;
                    chunk[position((b % 2) * 32 + j)] = q;
                    sum += q as i32;
                }
                dx[r * nb + b] = d;
                sx[r * nb + b] = d * sum as f32;
            }
        }
    }
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

    pub(super) const TYPES: [GgmlDType; 4] = [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q4K];

    #[test]
    fn repacked_rows_dequantize_like_candle() {
        for dtype in TYPES {
            // 576 values = 9 chunks: an odd last chunk (Q4_K blocks need multiples of 256).
            let (rows, cols) = (5, if dtype == GgmlDType::Q4K { 512 } else { 576 });
            let (m, deq) = repack(dtype, rows, cols);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                m.dequantize_row(r, &mut row);
                for (a, b) in row.iter().zip(&deq[r * cols..]) {
                    // Exact but for Q4_K, whose two-scale products are rounded to f16 (an error
                    // far below its 4-bit step, about 0.03 here).
                    let tol = if dtype == GgmlDType::Q4K { 4e-3 } else { 1e-6 };
                    assert!((a - b).abs() <= tol, "{dtype:?}: {a} vs {b}");
                }
            }
        }
    }
}
