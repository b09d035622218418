//! Shared helpers for the statistical tests: a chi-square goodness-of-fit test with a fixed
//! significance, and exact window distributions of the toy models.
#![allow(dead_code)]

use specdec::toy::MarkovModel;
use specdec::{DraftModel, Result, SamplingConfig, SpeculativeDecoder, Stats, TargetModel};
use statrs::distribution::{ChiSquared, ContinuousCDF};

/// Every goodness-of-fit test here rejects below this p-value: with fixed seeds it never
/// flakes, and even with fresh seeds a false alarm would come once in a million runs.
pub const SIGNIFICANCE: f64 = 1e-6;

/// The result of a Pearson chi-square test.
#[derive(Debug)]
pub struct Fit {
    pub statistic: f64,
    pub df: usize,
    pub p_value: f64,
}

/// Pearson's chi-square of `counts` against `probs`. Cells expected to hold fewer than 5 counts
/// are pooled into one cell so the chi-square approximation holds. A count in a cell of
/// probability zero makes the statistic infinite (p-value 0).
pub fn chi_square(counts: &[u64], probs: &[f64]) -> Fit {
    assert_eq!(counts.len(), probs.len());
    let n: u64 = counts.iter().sum();
    let (mut stat, mut cells) = (0.0, 0);
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let expected = p * n as f64;
        if expected < 5.0 {
            pooled_obs += c as f64;
            pooled_exp += expected;
            if p == 0.0 && c > 0 {
                return Fit { statistic: f64::INFINITY, df: 1, p_value: 0.0 };
            }
        } else {
            stat += (c as f64 - expected).powi(2) / expected;
            cells += 1;
        }
    }
    if pooled_exp > 0.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp;
        cells += 1;
    }
    let df = cells.max(2) - 1;
    let p_value = ChiSquared::new(df as f64).map(|d| d.sf(stat)).unwrap_or(0.0);
    Fit { statistic: stat, df, p_value }
}

/// Panics with the test's figures when `counts` do not fit `probs` at [`SIGNIFICANCE`].
pub fn assert_fits(what: &str, counts: &[u64], probs: &[f64]) {
    let fit = chi_square(counts, probs);
    eprintln!("{what}: chi-square {:.1} on {} df, p = {:.3}", fit.statistic, fit.df, fit.p_value);
    assert!(
        fit.p_value >= SIGNIFICANCE,
        "{what}: chi-square {:.1} on {} df, p = {:.3e} < {SIGNIFICANCE:e}",
        fit.statistic,
        fit.df,
        fit.p_value
    );
}

/// Panics unless the statistic rejects `counts` (the power check on a biased sampler).
pub fn assert_rejects(what: &str, counts: &[u64], probs: &[f64]) {
    let fit = chi_square(counts, probs);
    eprintln!("{what} (biased): chi-square {:.1} on {} df, p = {:.3e}", fit.statistic, fit.df, fit.p_value);
    assert!(
        fit.p_value < SIGNIFICANCE,
        "{what}: a biased sampler passed: chi-square {:.1} on {} df, p = {:.3e}",
        fit.statistic,
        fit.df,
        fit.p_value
    );
}

/// The row `target` samples from after `context` with `cfg`, from [`reference_law`] (so that
/// the batteries' expected laws do not rest on the crate's own `SamplingConfig::probs`).
pub fn processed_row(target: &MarkovModel, cfg: &SamplingConfig, context: &[u32]) -> Vec<f64> {
    let logits: Vec<f32> = target.next_probs(context).iter().map(|p| p.ln()).collect();
    reference_law(&logits, cfg)
}

/// Temperature, top-k and top-p as their definitions say, written apart from the crate's
/// `SamplingConfig::probs` and in f64: rank the tokens by logit (ties: the lower id first);
/// keep the first k; weights `exp((x − max) / T)`; keep the shortest ranked prefix whose share
/// of the kept mass reaches p; normalize. Temperature 0 is the one-hot row of the first ranked.
pub fn reference_law(logits: &[f32], cfg: &SamplingConfig) -> Vec<f64> {
    let mut ranked: Vec<usize> = (0..logits.len()).filter(|&i| logits[i] > f32::NEG_INFINITY).collect();
    ranked.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut law = vec![0.0; logits.len()];
    if cfg.is_greedy() {
        law[ranked[0]] = 1.0;
        return law;
    }
    ranked.truncate(cfg.top_k().unwrap_or(usize::MAX));
    let max = logits[ranked[0]] as f64;
    let t = cfg.temperature() as f64;
    let weight = |i: usize| ((logits[i] as f64 - max) / t).exp();
    let total: f64 = ranked.iter().map(|&i| weight(i)).sum();
    let (mut kept, mut mass) = (0.0, 0.0);
    for &i in &ranked {
        law[i] = weight(i);
        kept += law[i];
        mass += law[i] / total;
        if mass >= cfg.top_p().map_or(f64::INFINITY, f64::from) {
            break;
        }
    }
    law.iter().map(|w| w / kept).collect()
}

/// The exact distribution of generated tokens `start..start + len` when `target` (order at most 2)
/// samples with `cfg` after `prompt` (at least 2 tokens). Cell index: the tokens as base-V digits.
pub fn exact_window(target: &MarkovModel, cfg: &SamplingConfig, prompt: &[u32], start: usize, len: usize) -> Vec<f64> {
    let v = target.vocab();
    // Distribution over the last two tokens of the context.
    let mut state = vec![0.0; v * v];
    state[prompt[prompt.len() - 2] as usize * v + prompt[prompt.len() - 1] as usize] = 1.0;
    for _ in 0..start {
        let mut next = vec![0.0; v * v];
        for (s, &w) in state.iter().enumerate().filter(|(_, &w)| w > 0.0) {
            let row = processed_row(target, cfg, &[(s / v) as u32, (s % v) as u32]);
            for (t, &p) in row.iter().enumerate() {
                next[(s % v) * v + t] += w * p;
            }
        }
        state = next;
    }
    let mut out = vec![0.0; v.pow(len as u32)];
    for (s, &w) in state.iter().enumerate().filter(|(_, &w)| w > 0.0) {
        window(target, cfg, [(s / v) as u32, (s % v) as u32], len, 0, w, &mut out);
    }
    out
}

fn window(
    target: &MarkovModel,
    cfg: &SamplingConfig,
    last: [u32; 2],
    left: usize,
    cell: usize,
    w: f64,
    out: &mut [f64],
) {
    if left == 0 {
        out[cell] += w;
        return;
    }
    let v = target.vocab();
    for (t, &p) in processed_row(target, cfg, &last).iter().enumerate().filter(|(_, &p)| p > 0.0) {
        window(target, cfg, [last[1], t as u32], left - 1, cell * v + t, w * p, out);
    }
}

/// The cell of `tokens[start..start + len]` in an [`exact_window`] table.
pub fn cell(tokens: &[u32], start: usize, len: usize, vocab: usize) -> usize {
    tokens[start..start + len].iter().fold(0, |c, &t| c * vocab + t as usize)
}

/// Runs `samples` generations of `decoder` from `prompt` (the decoder must produce at least
/// `second + 3` tokens) and checks the joint distribution of generated tokens 0..3 and
/// `second..second + 3` against `target` sampling alone with `cfg`. Returns the counters summed
/// over all generations, so that a test can check that drafting actually happened.
pub fn check_windows<D: DraftModel, T: TargetModel>(
    name: &str,
    decoder: &mut SpeculativeDecoder<T, D>,
    target: &MarkovModel,
    cfg: &SamplingConfig,
    prompt: &[u32],
    second: usize,
    samples: usize,
) -> Result<Stats> {
    let (counts, total) = window_counts(decoder, target.vocab(), prompt, second, samples)?;
    for (c, s) in counts.iter().zip([0, second]) {
        assert_fits(&format!("{name}, tokens {s}..{}", s + 3), c, &exact_window(target, cfg, prompt, s, 3));
    }
    Ok(total)
}

/// The counts [`check_windows`] tests (windows 0..3 and `second..second + 3`), and the summed
/// counters.
pub fn window_counts<D: DraftModel, T: TargetModel>(
    decoder: &mut SpeculativeDecoder<T, D>,
    vocab: usize,
    prompt: &[u32],
    second: usize,
    samples: usize,
) -> Result<([Vec<u64>; 2], Stats)> {
    let mut counts = [vec![0u64; vocab.pow(3)], vec![0u64; vocab.pow(3)]];
    let mut total = Stats::default();
    for _ in 0..samples {
        let out = decoder.generate(prompt)?;
        for (c, s) in counts.iter_mut().zip([0, second]) {
            c[cell(&out.tokens, s, 3, vocab)] += 1;
        }
        total += &out.stats;
    }
    Ok((counts, total))
}

/// Pearson's noncentrality when `n` draws from `shifted` are tested against `exact` (cells
/// pooled as [`chi_square`] pools them), and the test's degrees of freedom.
pub fn noncentrality(exact: &[f64], shifted: &[f64], n: usize) -> (f64, usize) {
    let n = n as f64;
    let (mut lambda, mut cells, mut pooled) = (0.0, 0, (0.0, 0.0));
    for (&p, &e) in exact.iter().zip(shifted) {
        if p * n < 5.0 {
            pooled = (pooled.0 + p, pooled.1 + e);
        } else {
            lambda += n * (e - p).powi(2) / p;
            cells += 1;
        }
    }
    if pooled.0 > 0.0 {
        lambda += n * (pooled.1 - pooled.0).powi(2) / pooled.0;
        cells += 1;
    }
    (lambda, cells.max(2) - 1)
}

/// The detection limit of Pearson's test on `df` degrees of freedom at [`SIGNIFICANCE`]: the
/// noncentrality λ it rejects half the time. The noncentral chi-square is taken as c·χ²(h),
/// c = (df + 2λ)/(df + λ), h = (df + λ)²/(df + 2λ) (Patnaik's approximation, within a few
/// percent here); λ is found by bisection. At 5 degrees of freedom it is 31.9.
pub fn detection_limit(df: usize) -> f64 {
    let (mut lo, mut hi) = (0.0, 100.0 * df as f64 + 1000.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if power(df, mid) < 0.5 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The chance that Pearson's test on `df` degrees of freedom rejects at [`SIGNIFICANCE`] a law
/// at noncentrality `lambda` (Patnaik's approximation, as in [`detection_limit`]).
pub fn power(df: usize, lambda: f64) -> f64 {
    let k = df as f64;
    let critical = ChiSquared::new(k).map(|d| d.inverse_cdf(1.0 - SIGNIFICANCE)).unwrap_or(f64::INFINITY);
    let (c, h) = ((k + 2.0 * lambda) / (k + lambda), (k + lambda).powi(2) / (k + 2.0 * lambda));
    ChiSquared::new(h).map(|d| d.sf(critical / c)).unwrap_or(0.0)
}

/// For a power check near a battery's detection limit: a copy of `target` whose rows are
/// nudged toward random rows (`noisy_copy` with ε from 10⁻⁴ up by 5 % steps), the first whose law of
/// tokens `start..start + 3` (sampled with `cfg` after `prompt`) sits at twice the detection
/// limit of `n` draws tested against `target`'s, where the test rejects it with a power of
/// 99.9 % or more. Returns the copy, ε and λ / limit (which the caller should check is below
/// about 3: near the limit, not far past it).
pub fn nudged_past_the_limit(
    target: &MarkovModel,
    cfg: &SamplingConfig,
    prompt: &[u32],
    start: usize,
    n: usize,
) -> (MarkovModel, f32, f64) {
    let exact = exact_window(target, cfg, prompt, start, 3);
    for step in 0..200 {
        let eps = 1e-4 * 1.05f32.powi(step);
        let nudged = target.noisy_copy(eps, 777);
        let shifted = exact_window(&nudged, cfg, prompt, start, 3);
        let (lambda, df) = noncentrality(&exact, &shifted, n);
        let ratio = lambda / detection_limit(df);
        if ratio >= 2.0 {
            let tv: f64 = 0.5 * exact.iter().zip(&shifted).map(|(a, b)| (a - b).abs()).sum::<f64>();
            eprintln!(
                "nudged by ε = {eps:.4}: λ = {lambda:.1} on {df} df, {ratio:.2} times the detection limit \
                 (power {:.4}), total variation {tv:.4}",
                power(df, lambda)
            );
            return (nudged, eps, ratio);
        }
    }
    panic!("no nudge up to ε = 1 reaches the detection limit");
}

/// The power check near a battery's detection limit: `counts` of the first three tokens, drawn
/// by a decoder whose target was `nudged` (see [`nudged_past_the_limit`]), fit the nudged law
/// and are rejected against `target`'s.
pub fn assert_nudge_rejected(
    what: &str,
    counts: &[u64],
    (target, nudged): (&MarkovModel, &MarkovModel),
    cfg: &SamplingConfig,
    prompt: &[u32],
) {
    assert_fits(&format!("{what}, against the nudged law"), counts, &exact_window(nudged, cfg, prompt, 0, 3));
    assert_rejects(&format!("{what}, nudged target"), counts, &exact_window(target, cfg, prompt, 0, 3));
}

pub mod faulty;
#[cfg(feature = "train")]
pub mod heads;
pub mod models;

/// The sampling settings every statistical test covers.
pub fn settings() -> specdec::Result<Vec<(&'static str, SamplingConfig)>> {
    Ok(vec![
        ("temperature 1", SamplingConfig::new(1.0)?),
        ("temperature 0.7", SamplingConfig::new(0.7)?),
        ("top-k 3", SamplingConfig::new(1.0)?.with_top_k(3)?),
        ("top-p 0.8", SamplingConfig::new(1.0)?.with_top_p(0.8)?),
    ])
}
