//! Causal self-attention of a few new positions over the KV cache, and the small element-wise
//! steps around it (RMSNorm, RoPE, SiLU·gate). The loops are written plainly and compiled with
//! AVX-512 or AVX2 enabled where the CPU has it, so the compiler vectorizes them.

/// Cache layout: position-major, `[pos][kv_head][head_dim]`, for keys and values alike.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Attention for query head `h` of new row `i` (at absolute position `pos + i`): softmax of
/// `q · k_t / sqrt(hd)` over `t <= pos + i`, times the values. `scores` is scratch space.
#[allow(clippy::too_many_arguments)]
pub fn head(s: Shape, q: &[f32], keys: &[f32], values: &[f32], visible: usize, h: usize, scores: &mut Vec<f32>, out: &mut [f32]) {
    dispatch(|| head_body(s, q, keys, values, visible, h, scores, out));
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn head_body(s: Shape, q: &[f32], keys: &[f32], values: &[f32], visible: usize, h: usize, scores: &mut Vec<f32>, out: &mut [f32]) {
    let hd = s.head_dim;
    let kvh = h / (s.heads / s.kv_heads);
    let stride = s.kv_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for t in 0..visible {
        let k = &keys[t * stride + kvh * hd..][..hd];
        let d = dot(q, k) * scale;
        max = max.max(d);
        scores.push(d);
    }
    let mut total = 0.0;
    for sc in scores.iter_mut() {
        *sc = (*sc - max).exp();
        total += *sc;
    }
    out.iter_mut().for_each(|o| *o = 0.0);
    let inv = 1.0 / total;
    for (t, &p) in scores.iter().enumerate() {
        let v = &values[t * stride + kvh * hd..][..hd];
        let w = p * inv;
        for (o, &x) in out.iter_mut().zip(v) {
            *o = w.mul_add(x, *o);
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..16 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `out = x / rms(x) * weight`, row by row.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    dispatch(|| {
        let n = weight.len();
        for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            let ss: f32 = xr.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / n as f32 + eps).sqrt();
            for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
                *o = v * inv * w;
            }
        }
    });
}

/// Rotates each head of `x` (rows of `heads × hd`) by the angles of its position, pairs
/// (2i, 2i+1) interleaved; `cos`/`sin` hold `hd / 2` values per position starting at row 0.
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

/// `out[r][j] = silu(gu[r][j]) * gu[r][ff + j]` for rows of `2·ff` (gate then up).
pub fn silu_gate(gu: &[f32], ff: usize, out: &mut [f32]) {
    dispatch(|| {
        for (row, o) in gu.chunks_exact(2 * ff).zip(out.chunks_exact_mut(ff)) {
            let (g, u) = row.split_at(ff);
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        }
    });
}

/// Runs `f` compiled for AVX-512 or AVX2 when the CPU has it (the body is inlined into a
/// function with those features enabled, so its loops vectorize for them).
#[inline(always)]
fn dispatch<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,fma")]
        unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the features.
            return unsafe { avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { avx2(f) };
        }
    }
    f()
}
