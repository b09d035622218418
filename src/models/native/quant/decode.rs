//! GGUF blocks to the engine's parts: unsigned codes and the scales as the file holds them.

use candle_core::quantized::GgmlDType;
use half::f16;

/// One row's scales, in the form [`super::Scales`] names for its type: per 32 values `d` and
/// `m` (block types; `m` unused where it is implied); or per 256 values `d` (and `dmin` in
/// `m`, K-quants) with 16 bytes of sub-block scales in `sub`.
pub(super) struct RowScales {
    pub d: Vec<f32>,
    pub m: Vec<f32>,
    pub sub: Vec<u8>,
}

/// Decodes one GGUF row into unsigned codes (`w = d·q + m`) and its scales.
pub(super) fn decode_row(dtype: GgmlDType, row: &[u8], codes: &mut [u8], s: &mut RowScales) {
    let h = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    match dtype {
        GgmlDType::Q8_0 => {
            for (b, blk) in row.chunks_exact(34).enumerate() {
                s.d[b] = h(blk, 0);
                for (j, &q) in blk[2..].iter().enumerate() {
                    codes[b * 32 + j] = (q as i8 as i16 + 128) as u8;
                }
            }
        }
        GgmlDType::Q4_0 | GgmlDType::Q4_1 => {
            let size = dtype.type_size();
            for (b, blk) in row.chunks_exact(size).enumerate() {
                s.d[b] = h(blk, 0);
                if dtype == GgmlDType::Q4_1 {
                    s.m[b] = h(blk, 2);
                }
                let qs = &blk[size - 16..];
                for j in 0..16 {
                    codes[b * 32 + j] = qs[j] & 0xF;
                    codes[b * 32 + j + 16] = qs[j] >> 4;
                }
            }
        }
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
            let size = dtype.type_size();
            for (b, blk) in row.chunks_exact(size).enumerate() {
                s.d[b] = h(blk, 0);
                if dtype == GgmlDType::Q5_1 {
                    s.m[b] = h(blk, 2);
                }
                let at = if dtype == GgmlDType::Q5_0 { 2 } else { 4 };
                let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
                let qs = &blk[at + 4..];
                for j in 0..16 {
                    let high = |v: usize| (((qh >> v) & 1) as u8) << 4;
                    codes[b * 32 + j] = (qs[j] & 0xF) | high(j);
                    codes[b * 32 + j + 16] = (qs[j] >> 4) | high(j + 16);
                }
            }
        }
        GgmlDType::Q4K | GgmlDType::Q5K => {
            // Q5_K is Q4_K with 32 bytes of fifth bits after the scales.
            let five = dtype == GgmlDType::Q5K;
            for (g, blk) in row.chunks_exact(dtype.type_size()).enumerate() {
                (s.d[g], s.m[g]) = (h(blk, 0), h(blk, 2));
                let scales = &blk[4..16];
                for j in 0..8 {
                    (s.sub[g * 16 + j], s.sub[g * 16 + 8 + j]) = scale_min_k4(j, scales);
                }
                let (qh, qs) = if five { (&blk[16..48], &blk[48..]) } else { (&blk[..0], &blk[16..]) };
                for c in 0..4 {
                    for l in 0..32 {
                        let (byte, hb) = (qs[c * 32 + l], qh.get(l).map_or(0, |h| h >> (2 * c)));
                        codes[g * 256 + c * 64 + l] = (byte & 0xF) | ((hb & 1) << 4);
                        codes[g * 256 + c * 64 + 32 + l] = (byte >> 4) | ((hb & 2) << 3);
                    }
                }
            }
        }
        GgmlDType::Q6K => {
            for (g, blk) in row.chunks_exact(210).enumerate() {
                let (ql, qh, scales) = (&blk[..128], &blk[128..192], &blk[192..208]);
                s.d[g] = h(blk, 208);
                s.sub[g * 16..][..16].copy_from_slice(scales);
                for n in 0..2 {
                    let (ql, qh, out) = (&ql[64 * n..], &qh[32 * n..], &mut codes[g * 256 + 128 * n..]);
                    for l in 0..32 {
                        out[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                        out[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                        out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                        out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
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
