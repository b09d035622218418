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

/// The most query heads one call of [`heads`] takes (the weighted sums' running totals of
/// that many heads stay on the stack).
pub const MAX_HEADS: usize = 8;

/// Positions of values per span of [`weighted_sums`]: 32 positions of one key/value head
/// (16 KiB at a head width of 128) stay in L1 while each head of the call adds them up.
const SPAN: usize = 32;

multiversion! {
    /// Attention for the query heads `h0..h0 + n` of a new row, which share one key/value head
    /// (`n = q.len() / head_dim` ≤ [`MAX_HEADS`]; their queries side by side in `q`, their
    /// outputs in `out`), seeing positions `first..visible`: per head, softmax of
    /// `q · k_t / sqrt(hd)`, times the values. `keys` are the blocks of the key/value head (see
    /// [`store_key`]); `scores` is scratch space. A non-empty `sees` masks the last
    /// `sees.len()` of those positions (a tree's tokens: only ancestors are seen); `first` > 0
    /// is a sliding window's start.
    ///
    /// The heads share the reading of the keys and values (each block of keys and span of
    /// values is read from memory once and from L1 by the other heads: at a context of a few
    /// thousand positions, reading them once per head was most of a decoding step), and each
    /// head's arithmetic is the same, in the same order, whatever `n`: a head's output does
    /// not depend on the heads it was computed with.
    pub fn heads(s: Shape, q: &[f32], keys: &[f32], values: &[f32], first: usize, visible: usize, sees: &[bool], h0: usize, scores: &mut Vec<f32>, out: &mut [f32]) {
        let hd = s.head_dim;
        let n = q.len() / hd;
        assert!(n <= MAX_HEADS && out.len() >= n * hd, "attention heads: {n} of {hd}");
        let kvh = h0 / (s.heads / s.kv_heads);
        let stride = s.kv_heads * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let blocks = visible.div_ceil(BLOCK);
        // Each head's scores, `width` apart.
        let width = blocks * BLOCK;
        scores.clear();
        scores.resize(n * width, 0.0);
        let whole = hd / CHAINS * CHAINS;
        for b in 0..blocks {
            let block = &keys[b * hd * BLOCK..(b + 1) * hd * BLOCK];
            for (g, q) in q.chunks_exact(hd).enumerate() {
                // `CHAINS` sums over the components (d mod 4) that do not wait on each other's
                // multiply-adds (one chain of hd of them was a third of a 5-row pass of
                // SmolLM2's attention, each waiting on the last), added up at the end.
                let mut acc = [[0f32; BLOCK]; CHAINS];
                for (c, qc) in q[..whole].chunks_exact(CHAINS).enumerate() {
                    for (j, (a, &qd)) in acc.iter_mut().zip(qc).enumerate() {
                        let k = &block[(c * CHAINS + j) * BLOCK..][..BLOCK];
                        for l in 0..BLOCK {
                            a[l] = qd.mul_add(k[l], a[l]);
                        }
                    }
                }
                for (d, &qd) in q.iter().enumerate().skip(whole) {
                    let k = &block[d * BLOCK..(d + 1) * BLOCK];
                    for l in 0..BLOCK {
                        acc[0][l] = qd.mul_add(k[l], acc[0][l]);
                    }
                }
                for (l, sc) in scores[g * width + b * BLOCK..][..BLOCK].iter_mut().enumerate() {
                    *sc = ((acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l])) * scale;
                }
            }
        }
        // A tree row sees the context and its ancestors: their scores are moved down to follow
        // the context, as a chain's would, and the values are read through the same map, so
        // that every sum below runs over the same terms in the same order as for plain
        // decoding's row at that position: a tree's row is plain decoding's, bit for bit.
        let hidden = visible - sees.len();
        let seen: Vec<usize> = (hidden..visible).filter(|&t| sees[t - hidden]).collect();
        let visible = if sees.is_empty() { visible } else { hidden + seen.len() };
        let mut inv = [0f32; MAX_HEADS];
        for (g, inv) in inv.iter_mut().enumerate().take(n) {
            let row = &mut scores[g * width..(g + 1) * width];
            for (j, &t) in seen.iter().enumerate() {
                row[hidden + j] = row[t];
            }
            let scores = &mut row[..visible];
            scores[..first].iter_mut().for_each(|sc| *sc = f32::NEG_INFINITY);
            let max = lane_max(scores);
            for sc in scores.iter_mut() {
                *sc = crate::math::exp(*sc - max);
            }
            let mut total = lane_sum(scores);
            // `exp` saturates at e^-87 rather than 0: positions before the window get exactly 0.
            for sc in &mut scores[..first] {
                total -= *sc;
                *sc = 0.0;
            }
            *inv = 1.0 / total;
        }
        let at = Positions { hidden, seen: &seen };
        let (p, inv, offset) = ((&scores[..], width, visible), &inv[..n], kvh * hd);
        match hd {
            64 => weighted_sums::<64>(p, inv, (values, at), stride, offset, out),
            128 => weighted_sums::<128>(p, inv, (values, at), stride, offset, out),
            256 => weighted_sums::<256>(p, inv, (values, at), stride, offset, out),
            _ => {
                for (g, (out, &inv)) in out.chunks_exact_mut(hd).zip(inv).enumerate() {
                    out.iter_mut().for_each(|o| *o = 0.0);
                    for (t, &p) in scores[g * width..g * width + visible].iter().enumerate() {
                        for (o, &x) in out.iter_mut().zip(&values[at.slot(t) * stride + offset..][..hd]) {
                            *o = (p * inv).mul_add(x, *o);
                        }
                    }
                }
            }
        }
    }
}

/// Where the `t`-th position a row sees lies in the cache: the context's positions in place,
/// then a tree row's ancestors (and itself) at their slots.
#[derive(Clone, Copy)]
struct Positions<'a> {
    hidden: usize,
    seen: &'a [usize],
}

impl Positions<'_> {
    #[inline(always)]
    fn slot(&self, t: usize) -> usize {
        if t < self.hidden {
            t
        } else {
            self.seen[t - self.hidden]
        }
    }
}

/// Independent sums per score over the key components (`head` adds up exactly four).
const CHAINS: usize = 4;

/// The largest of `x` (−∞ for none), by 16 running maxima: a fold with `f32::max`, whose NaN
/// rule the compiler keeps, stayed scalar. (Scores are never NaN.)
#[inline(always)]
fn lane_max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; BLOCK];
    for chunk in x.chunks(BLOCK) {
        for (m, &v) in m.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    m.into_iter().fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a })
}

/// The sum of `x` by 16 running sums, added up in a fixed order: one running sum stayed
/// scalar (the compiler may not reorder a float sum by itself).
#[inline(always)]
fn lane_sum(x: &[f32]) -> f32 {
    let mut s = [0f32; BLOCK];
    for chunk in x.chunks(BLOCK) {
        for (s, &v) in s.iter_mut().zip(chunk) {
            *s += v;
        }
    }
    s.into_iter().sum()
}

/// Per head g, `out_g = inv[g] · Σ_t p_g[t] · v_t` for a head width known at compile time, so
/// the sums stay in registers (through memory, each position's update would wait for the
/// previous store). Even and odd positions sum apart, so that a 64-wide head's four registers
/// do not each wait on their last multiply-add. `(scores, width, visible)`: head g's
/// probabilities are `scores[g·width..][..visible]`. The heads take the positions in spans of
/// [`SPAN`], each head's sums kept between spans (the same sums, in the same order, as in one
/// sweep), so that each span of values is read from memory once for all of them. `at` says
/// where the `t`-th position's values lie.
#[inline(always)]
fn weighted_sums<const D: usize>(
    (scores, width, visible): (&[f32], usize, usize),
    inv: &[f32],
    (values, at): (&[f32], Positions),
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    let mut sums = [[[0f32; D]; 2]; MAX_HEADS];
    let pairs = visible / 2;
    for span in (0..pairs).step_by(SPAN / 2) {
        for (g, sum) in sums.iter_mut().enumerate().take(inv.len()) {
            // Into locals for the span (kept in registers), back after.
            let [mut even, mut odd] = *sum;
            let p = &scores[g * width..];
            for t in span..pairs.min(span + SPAN / 2) {
                let (w0, w1) = (p[2 * t], p[2 * t + 1]);
                let v0 = &values[at.slot(2 * t) * stride + offset..][..D];
                let v1 = &values[at.slot(2 * t + 1) * stride + offset..][..D];
                for d in 0..D {
                    even[d] = w0.mul_add(v0[d], even[d]);
                    odd[d] = w1.mul_add(v1[d], odd[d]);
                }
            }
            *sum = [even, odd];
        }
    }
    for (g, ([even, odd], (out, &inv))) in sums.iter_mut().zip(out.chunks_exact_mut(D).zip(inv)).enumerate() {
        if visible % 2 == 1 {
            let (t, p) = (visible - 1, scores[g * width + visible - 1]);
            let v = &values[at.slot(t) * stride + offset..][..D];
            for d in 0..D {
                even[d] = p.mul_add(v[d], even[d]);
            }
        }
        for ((o, a), b) in out.iter_mut().zip(even.iter()).zip(odd.iter()) {
            *o = (a + b) * inv;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention of query head `h` by its definition, in f64: softmax over the seen positions
    /// `first..visible` (a tree's last `sees.len()` only where seen), times the values.
    fn reference(
        s: Shape,
        q: &[f32],
        keys: &[Vec<f32>],
        values: &[f32],
        first: usize,
        sees: &[bool],
        h: usize,
    ) -> Vec<f32> {
        let (hd, visible) = (s.head_dim, keys.len());
        let offset = h / (s.heads / s.kv_heads) * hd;
        let seen = |t: usize| t >= first && (t < visible - sees.len() || sees[t + sees.len() - visible]);
        let score = |t: usize| {
            q.iter().zip(&keys[t]).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() / (hd as f64).sqrt()
        };
        let max = (0..visible).filter(|&t| seen(t)).map(score).fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = (0..visible).map(|t| if seen(t) { (score(t) - max).exp() } else { 0.0 }).collect();
        let total: f64 = p.iter().sum();
        (0..hd)
            .map(|d| {
                let v = (0..visible).map(|t| p[t] * f64::from(values[t * s.kv_heads * hd + offset + d])).sum::<f64>();
                (v / total) as f32
            })
            .collect()
    }

    /// Head widths with and without a compiled weighted sum and not a multiple of the score
    /// chains (6), odd and even lengths, a window's start and a tree's mask.
    #[test]
    fn heads_match_the_definition() {
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for hd in [6usize, 8, 64, 128] {
            let s = Shape { heads: 4, kv_heads: 2, head_dim: hd };
            for (visible, first, sees) in [
                (1, 0, vec![]),
                (17, 0, vec![]),
                (40, 5, vec![]),
                (33, 0, vec![true, false, true]),
                (101, 3, vec![false, true]),
            ] {
                let keys: Vec<Vec<f32>> = (0..visible).map(|_| (0..hd).map(|_| next()).collect()).collect();
                let values: Vec<f32> = (0..visible * s.kv_heads * hd).map(|_| next()).collect();
                let q: Vec<f32> = (0..hd).map(|_| 2.0 * next()).collect();
                for h in [0, 3] {
                    let mut blocks = Vec::new();
                    for (pos, k) in keys.iter().enumerate() {
                        store_key(&mut blocks, hd, pos, k);
                    }
                    let (mut scores, mut out) = (Vec::new(), vec![0f32; hd]);
                    heads(s, &q, &blocks, &values, first, visible, &sees, h, &mut scores, &mut out);
                    let want = reference(s, &q, &keys, &values, first, &sees, h);
                    for (a, b) in out.iter().zip(&want) {
                        assert!((a - b).abs() <= 1e-5, "hd {hd}, visible {visible}, head {h}: {a} vs {b}");
                    }
                }
            }
        }
    }

    /// A head's output is bit for bit the same computed alone or beside the other heads of its
    /// key/value head, whatever their number, over several spans of values.
    #[test]
    fn a_head_is_the_same_alone_or_among_its_group() {
        let mut seed = 11u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for hd in [6usize, 64, 128] {
            let s = Shape { heads: 2 * MAX_HEADS, kv_heads: 2, head_dim: hd };
            for (visible, first, sees) in [(1, 0, vec![]), (77, 2, vec![true, false]), (130, 0, vec![])] {
                let mut blocks = Vec::new();
                for pos in 0..visible {
                    store_key(&mut blocks, hd, pos, &(0..hd).map(|_| next()).collect::<Vec<_>>());
                }
                let values: Vec<f32> = (0..visible * s.kv_heads * hd).map(|_| next()).collect();
                let q: Vec<f32> = (0..MAX_HEADS * hd).map(|_| 2.0 * next()).collect();
                let h0 = MAX_HEADS; // the second key/value head's
                let mut scores = Vec::new();
                let alone: Vec<f32> = (0..MAX_HEADS)
                    .flat_map(|g| {
                        let mut out = vec![0f32; hd];
                        let qg = &q[g * hd..(g + 1) * hd];
                        heads(s, qg, &blocks, &values, first, visible, &sees, h0 + g, &mut scores, &mut out);
                        out
                    })
                    .collect();
                for n in [2, 3, MAX_HEADS] {
                    let mut out = vec![0f32; n * hd];
                    heads(s, &q[..n * hd], &blocks, &values, first, visible, &sees, h0, &mut scores, &mut out);
                    let same = out.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "hd {hd}, visible {visible}: {n} heads together differ from each alone");
                }
            }
        }
    }
}
