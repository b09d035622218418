//! Causal self-attention of a few new positions over the KV cache, and the small element-wise
//! steps around it (RMSNorm, RoPE, SiLU·gate). The loops are written plainly and compiled a
//! second and third time with AVX-512 or AVX2+FMA enabled (see `multiversion!`), so they
//! vectorize for the CPU at hand.

/// Cache layout: position-major, `[pos][kv_head][head_dim]`, for keys and values alike.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Positions per key block.
pub const BLOCK: usize = 16;

/// Writes the key of position `pos` into `blocks`, the keys of one head stored in blocks of
/// 16 positions, transposed: block b holds, for each component d, the keys of positions
/// 16b..16b+16 side by side. Sixteen scores are then 16-lane multiply-adds over d, with no
/// horizontal sums.
pub fn store_key(blocks: &mut Vec<f32>, hd: usize, pos: usize, key: &[f32]) {
    let (block, lane) = (pos / BLOCK, pos % BLOCK);
    let end = (block + 1) * hd * BLOCK;
    if blocks.len() < end {
        blocks.resize(end, 0.0);
    }
    for (d, &x) in key.iter().enumerate() {
        blocks[block * hd * BLOCK + d * BLOCK + lane] = x;
    }
}

/// The key of position `pos` from `blocks` (see [`store_key`]).
pub fn load_key(blocks: &[f32], hd: usize, pos: usize) -> Vec<f32> {
    let (block, lane) = (pos / BLOCK, pos % BLOCK);
    (0..hd).map(|d| blocks[block * hd * BLOCK + d * BLOCK + lane]).collect()
}

multiversion! {
    /// Attention for query head `h` of a new row that sees positions `first..visible`:
    /// softmax of `q · k_t / sqrt(hd)`, times the values. `keys` are the blocks of this head's
    /// key/value head (see [`store_key`]); `scores` is scratch space. A non-empty `sees` masks
    /// the last `sees.len()` of those positions (a tree's tokens: only ancestors are seen);
    /// `first` > 0 is a sliding window's start.
    pub fn head(s: Shape, q: &[f32], keys: &[f32], values: &[f32], first: usize, visible: usize, sees: &[bool], h: usize, scores: &mut Vec<f32>, out: &mut [f32]) {
        let hd = s.head_dim;
        let kvh = h / (s.heads / s.kv_heads);
        let stride = s.kv_heads * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let blocks = visible.div_ceil(BLOCK);
        scores.clear();
        for b in 0..blocks {
            let block = &keys[b * hd * BLOCK..(b + 1) * hd * BLOCK];
            let mut acc = [0f32; BLOCK];
            for (d, &qd) in q.iter().enumerate() {
                let k = &block[d * BLOCK..(d + 1) * BLOCK];
                for l in 0..BLOCK {
                    acc[l] = qd.mul_add(k[l], acc[l]);
                }
            }
            scores.extend(acc.iter().map(|a| a * scale));
        }
        scores.truncate(visible);
        let hidden = visible - sees.len();
        for (sc, _) in scores[hidden..].iter_mut().zip(sees).filter(|(_, &seen)| !seen) {
            *sc = f32::NEG_INFINITY;
        }
        scores[..first].iter_mut().for_each(|sc| *sc = f32::NEG_INFINITY);
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut total = 0.0;
        for sc in scores.iter_mut() {
            *sc = crate::math::exp(*sc - max);
            total += *sc;
        }
        // `exp` saturates at e^-87 rather than 0: masked positions get exactly 0.
        for (sc, _) in scores[hidden..].iter_mut().zip(sees).filter(|(_, &seen)| !seen) {
            total -= *sc;
            *sc = 0.0;
        }
        for sc in &mut scores[..first] {
            total -= *sc;
            *sc = 0.0;
        }
        let (inv, offset) = (1.0 / total, kvh * hd);
        match hd {
            64 => weighted_sum::<64>(scores, inv, values, stride, offset, out),
            128 => weighted_sum::<128>(scores, inv, values, stride, offset, out),
            256 => weighted_sum::<256>(scores, inv, values, stride, offset, out),
            _ => {
                out.iter_mut().for_each(|o| *o = 0.0);
                for (t, &p) in scores.iter().enumerate() {
                    for (o, &x) in out.iter_mut().zip(&values[t * stride + offset..][..hd]) {
                        *o = (p * inv).mul_add(x, *o);
                    }
                }
            }
        }
    }
}

/// `out = inv · Σ_t p[t] · v_t` for a head width known at compile time, so the sums stay in
/// registers (through memory, each position's update would wait for the previous store).
#[inline(always)]
fn weighted_sum<const D: usize>(p: &[f32], inv: f32, values: &[f32], stride: usize, offset: usize, out: &mut [f32]) {
    let mut acc = [0f32; D];
    for (t, &w) in p.iter().enumerate() {
        let v = &values[t * stride + offset..][..D];
        for d in 0..D {
            acc[d] = w.mul_add(v[d], acc[d]);
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a * inv;
    }
}

multiversion! {
    /// `out = x / rms(x) * weight`, row by row.
    pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let n = weight.len();
        for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            let ss: f32 = xr.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / n as f32 + eps).sqrt();
            for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
                *o = v * inv * w;
            }
        }
    }
}

multiversion! {
    /// Rotates each head of `x` (rows of `heads × hd`) by the angles of its position, pairs
    /// (2i, 2i+1) interleaved; `cos`/`sin` hold `hd / 2` values per position from row 0 on.
    pub fn rope(x: &mut [f32], heads: usize, hd: usize, cos: &[f32], sin: &[f32]) {
        let half = hd / 2;
        for (i, row) in x.chunks_exact_mut(heads * hd).enumerate() {
            let (c, s) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
            for head in row.chunks_exact_mut(hd) {
                for (p, pair) in head.chunks_exact_mut(2).enumerate() {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * c[p] - b * s[p];
                    pair[1] = a * s[p] + b * c[p];
                }
            }
        }
    }
}

multiversion! {
    /// `out[j] = gelu_tanh(g[j]) · u[j]`: GELU in its tanh form,
    /// `x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))`, as Gemma uses.
    pub fn gelu_tanh_gate(g: &[f32], u: &[f32], out: &mut [f32]) {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
            let inner = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
            // tanh(y) = 1 − 2 / (e^(2y) + 1), which saturates cleanly at both ends.
            let tanh = 1.0 - 2.0 / (crate::math::exp(2.0 * inner) + 1.0);
            *o = 0.5 * g * (1.0 + tanh) * u;
        }
    }
}

multiversion! {
    /// `out[j] = silu(g[j]) · u[j]`.
    pub fn silu_gate(g: &[f32], u: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + crate::math::exp(-g)) * u;
        }
    }
}
