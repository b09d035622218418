//! Sampling settings shared by the draft and the target, and the one function that turns a
//! logits row into the probability row those settings define.
//!
//! Exactness needs the draft's `q` and the target's `p` to go through the *same* processing
//! (temperature, then top-k, then top-p): the seed's pitfall is a mismatch that silently biases
//! the output. [`SamplingConfig::probs`] is that processing, used for both.

use std::sync::Arc;

use rand::{Rng, RngExt};
use serde::Serialize;

use crate::error::{Error, Result};

mod coupled;
mod logprobs;
mod process;

pub use coupled::Noise;
pub use logprobs::{LogprobMode, Logprobs, MAX_TOP_LOGPROBS};
pub(crate) use process::{BuiltIns, Processors};
pub use process::{Counts, History, LogitsProcessor, ProcessorFactory};

/// Temperature, top-k, top-p and seed, validated when built.
///
/// Temperature 0 means greedy decoding (argmax); top-k and top-p then change nothing.
///
/// # The order of the steps
/// A logits row becomes the law a token is drawn from in this order, for the draft's rows and
/// the target's alike (the same steps on both is what keeps speculation exact):
/// 1. the repetition penalty ([`with_repetition_penalty`](Self::with_repetition_penalty)),
///    over every token of the prompt **and** the output (as HF and llama.cpp's
///    `repeat_penalty` define it; llama.cpp counts only the last 64 tokens of the context by
///    default, here the whole context counts);
/// 2. the presence and frequency penalties ([`with_presence_penalty`](Self::with_presence_penalty),
///    [`with_frequency_penalty`](Self::with_frequency_penalty)), over the **output** only, as
///    OpenAI and vLLM count them;
/// 3. the logit bias ([`with_logit_bias`](Self::with_logit_bias));
/// 4. the banned tokens ([`with_banned`](Self::with_banned)), to `-inf`;
/// 5. the custom processors ([`with_processor`](Self::with_processor), a grammar among them),
///    in the order added;
/// 6. then [`probs`](Self::probs): temperature, top-k, softmax, min-p, top-p, normalization.
///
/// "The output" is the tokens generated so far plus, inside a speculative round, those drafted
/// before the position being scored: a plain decoder at that position sees the same.
///
/// # Example
/// ```
/// use specdec::SamplingConfig;
/// let cfg = SamplingConfig::new(0.8)?.with_top_k(40)?.with_top_p(0.95)?.with_seed(7);
/// assert!(!cfg.is_greedy());
/// assert!(SamplingConfig::new(-1.0).is_err());
/// # Ok::<(), specdec::Error>(())
/// ```
#[derive(Clone, Serialize)]
pub struct SamplingConfig {
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    seed: u64,
    coupled: bool,
    /// Penalties, logit bias and banned tokens (see [`process`](self::LogitsProcessor)).
    #[serde(flatten)]
    builtins: BuiltIns,
    /// Custom processors, made anew for each sequence.
    #[serde(skip)]
    processors: Vec<ProcessorFactory>,
    /// What each emitted token reports (nothing unless asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Logprobs>,
}

impl std::fmt::Debug for SamplingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SamplingConfig")
            .field("temperature", &self.temperature)
            .field("top_k", &self.top_k)
            .field("top_p", &self.top_p)
            .field("min_p", &self.min_p)
            .field("seed", &self.seed)
            .field("coupled", &self.coupled)
            .field("builtins", &self.builtins)
            .field("processors", &self.processors.len())
            .field("logprobs", &self.logprobs)
            .finish()
    }
}

impl PartialEq for SamplingConfig {
    /// Equal settings, and the same custom processor factories (by identity).
    fn eq(&self, other: &Self) -> bool {
        let same_factories = self.processors.len() == other.processors.len()
            && self.processors.iter().zip(&other.processors).all(|(a, b)| Arc::ptr_eq(a, b));
        (self.temperature, self.top_k, self.top_p, self.min_p, self.seed, self.coupled)
            == (other.temperature, other.top_k, other.top_p, other.min_p, other.seed, other.coupled)
            && self.builtins == other.builtins
            && self.logprobs == other.logprobs
            && same_factories
    }
}

impl Default for SamplingConfig {
    /// Greedy decoding, seed 0.
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingConfig {
    /// Greedy decoding (temperature 0).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            seed: 0,
            coupled: false,
            builtins: BuiltIns::default(),
            processors: Vec::new(),
            logprobs: None,
        }
    }

    /// Sampling at `temperature` (0 = greedy).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when the temperature is negative, NaN or infinite.
    pub fn new(temperature: f32) -> Result<Self> {
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(Error::setting("temperature", temperature, "a finite number >= 0 (0 = greedy)"));
        }
        Ok(Self { temperature, ..Self::greedy() })
    }

    /// Keep only the `k` most likely tokens.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `k` is 0.
    pub fn with_top_k(mut self, k: usize) -> Result<Self> {
        if k == 0 {
            return Err(Error::setting("top_k", k, "at least 1"));
        }
        self.top_k = Some(k);
        Ok(self)
    }

    /// Keep the smallest set of most likely tokens whose probability reaches `p` (nucleus sampling).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `p` is not in (0, 1].
    pub fn with_top_p(mut self, p: f32) -> Result<Self> {
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::setting("top_p", p, "a number in (0, 1]"));
        }
        self.top_p = if p < 1.0 { Some(p) } else { None };
        Ok(self)
    }

    /// Drop the tokens less likely than `p` times the most likely one (min-p sampling),
    /// after temperature and top-k, before top-p.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `p` is not in [0, 1].
    pub fn with_min_p(mut self, p: f32) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::setting("min_p", p, "a number in [0, 1]"));
        }
        self.min_p = (p > 0.0).then_some(p);
        Ok(self)
    }

    /// The repetition penalty (HF, llama.cpp): every token of the prompt and the output has
    /// its logit divided by `penalty` when positive, multiplied when negative (1 = none).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `penalty` is not a finite number > 0.
    pub fn with_repetition_penalty(mut self, penalty: f32) -> Result<Self> {
        if !(penalty.is_finite() && penalty > 0.0) {
            return Err(Error::setting("repetition_penalty", penalty, "a finite number > 0 (1 = none)"));
        }
        self.builtins.repetition = (penalty != 1.0).then_some(penalty);
        Ok(self)
    }

    /// The presence penalty (OpenAI): a token that occurs in the output so far loses
    /// `penalty` from its logit.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `penalty` is not finite.
    pub fn with_presence_penalty(mut self, penalty: f32) -> Result<Self> {
        if !penalty.is_finite() {
            return Err(Error::setting("presence_penalty", penalty, "a finite number (0 = none)"));
        }
        self.builtins.presence = penalty;
        Ok(self)
    }

    /// The frequency penalty (OpenAI): a token loses `penalty` times its count in the output so
    /// far from its logit.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `penalty` is not finite.
    pub fn with_frequency_penalty(mut self, penalty: f32) -> Result<Self> {
        if !penalty.is_finite() {
            return Err(Error::setting("frequency_penalty", penalty, "a finite number (0 = none)"));
        }
        self.builtins.frequency = penalty;
        Ok(self)
    }

    /// Adds `bias` to `token`'s logit (OpenAI `logit_bias`; a second bias on a token adds to
    /// the first). Token ids are checked against the vocabulary when a decoder is built.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `bias` is not finite (ban a token with
    /// [`with_banned`](Self::with_banned)).
    pub fn with_logit_bias(mut self, token: u32, bias: f32) -> Result<Self> {
        if !bias.is_finite() {
            return Err(Error::setting("logit_bias", bias, "a finite number"));
        }
        self.builtins.bias.push((token, bias));
        Ok(self)
    }

    /// Never emit these tokens (their logits become `-inf`; a drafted one ends the block).
    pub fn with_banned(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.builtins.banned.extend(tokens);
        self
    }

    /// Adds a custom processor (see [`LogitsProcessor`]): `factory` makes a fresh one for
    /// each sequence. Processors run after the built-ins, in the order added.
    pub fn with_processor(mut self, factory: ProcessorFactory) -> Self {
        self.processors.push(factory);
        self
    }

    /// Each emitted token carries its log-probability and its row's most likely tokens (see
    /// [`Logprobs`]; [`Generation::logprobs`](crate::Generation::logprobs)). They are read from
    /// the target's row at the token's position, which is plain decoding's row bit for bit, so
    /// they are plain decoding's values under any drafter, and cost no model call. One thing
    /// changes: tokens the processors force (a grammar's fixed text) are then scored by the
    /// target like any other, where otherwise they are emitted without a model call.
    pub fn with_logprobs(mut self, logprobs: Logprobs) -> Self {
        self.logprobs = Some(logprobs);
        self
    }

    /// What each emitted token reports, if asked.
    pub fn logprobs(&self) -> Option<Logprobs> {
        self.logprobs
    }

    /// True when any processor (a built-in or a custom one) changes the rows.
    pub fn has_processors(&self) -> bool {
        !self.builtins.is_empty() || !self.processors.is_empty()
    }

    /// A fresh set of this sequence's processors.
    pub(crate) fn processors(&self) -> Processors {
        Processors::new(self.builtins.clone(), &self.processors)
    }

    /// Checks the token ids the settings name against a vocabulary of `vocab` tokens.
    pub(crate) fn check(&self, vocab: usize) -> Result<()> {
        let ids = self.builtins.bias.iter().map(|&(t, _)| t).chain(self.builtins.banned.iter().copied());
        match ids.into_iter().find(|&t| t as usize >= vocab) {
            Some(token) => Err(Error::TokenOutOfRange { token, vocab }),
            None => Ok(()),
        }
    }

    /// The min-p setting, if any.
    pub fn min_p(&self) -> Option<f32> {
        self.min_p
    }

    /// The seed of the decoder's random number generator.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Coupled sampling: every token is drawn from noise fixed by the seed, the generation's
    /// index and the token's position (see [`Noise`]), and drafts are
    /// judged by agreement under that noise. The distribution is the target's as always, and
    /// the text is then the same for a seed whatever the drafter, k (adaptive included), tree
    /// setting or batch: speculative output equals the plain decoder's in this mode token for
    /// token. The price is a lower acceptance of sampled drafts (the module docs give the
    /// bound); greedy decoding is unaffected. Trees are judged by agreement too: a drafted
    /// child stands when it is the target's race winner at its position.
    pub fn coupled(mut self) -> Self {
        self.coupled = true;
        self
    }

    /// The noise of generation `generation` when sampling is coupled and not greedy.
    pub(crate) fn noise(&self, generation: u64) -> Option<Noise> {
        (self.coupled && !self.is_greedy()).then(|| Noise::new(self.seed, generation))
    }

    /// True for [`coupled`](Self::coupled) sampling.
    pub fn is_coupled(&self) -> bool {
        self.coupled
    }

    /// The temperature (0 = greedy).
    pub fn temperature(&self) -> f32 {
        self.temperature
    }

    /// The top-k setting, if any.
    pub fn top_k(&self) -> Option<usize> {
        self.top_k
    }

    /// The top-p setting, if any (1.0 is stored as none).
    pub fn top_p(&self) -> Option<f32> {
        self.top_p
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// True at temperature 0.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Turns a logits row into the probability row these settings sample from, written to `out`:
    /// divide by the temperature, keep the top-k, softmax, drop what min-p drops, keep the top-p
    /// nucleus, renormalize (processors, if any, have run on the row before: see
    /// [`LogitsProcessor`]).
    /// Ties are broken by the lower token id, so the result is a pure function of the row.
    /// `-inf` logits are allowed (masked tokens); NaN and `+inf` are not.
    ///
    /// At temperature 0 this returns the one-hot row of the argmax, the distribution greedy
    /// decoding samples from.
    ///
    /// # Errors
    /// [`Error::NonFiniteLogits`] for NaN or `+inf`; [`Error::EmptyDistribution`] when every logit is `-inf`.
    pub fn probs(&self, logits: &[f32], out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        if self.is_greedy() {
            let best = argmax(logits)?;
            out.resize(logits.len(), 0.0);
            out[best as usize] = 1.0;
            return Ok(());
        }
        let max = max_logit(logits)?;
        if max == f32::NEG_INFINITY {
            return Err(Error::EmptyDistribution);
        }
        out.resize(logits.len(), 0.0);
        // Temperature scaling is monotone, so the top-k cut can be taken on the raw logits.
        let cutoff = match self.top_k {
            Some(k) if k < logits.len() => Some(kth_largest(logits, k)),
            _ => None,
        };
        exp_scaled(logits, 1.0 / self.temperature, max, out);
        if let Some(c) = cutoff {
            for (i, (w, &x)) in out.iter_mut().zip(logits).enumerate() {
                if !ranks_above(x, i, c) {
                    *w = 0.0;
                }
            }
        }
        if let Some(min_p) = self.min_p {
            // The weights are relative to the most likely kept token (its weight is 1).
            for w in out.iter_mut() {
                if *w < min_p {
                    *w = 0.0;
                }
            }
        }
        if let Some(p) = self.top_p {
            keep_nucleus(out, p as f64);
        }
        normalize(out)
    }
}

multiversion! {
    /// `out[i] = e^((x_i − max)/T)`, 0 for masked (`-inf`) tokens; the largest weight is 1.
    fn exp_scaled(logits: &[f32], inv_t: f32, max: f32, out: &mut [f32]) {
        for (w, &x) in out.iter_mut().zip(logits) {
            *w = if x == f32::NEG_INFINITY { 0.0 } else { crate::math::exp((x - max) * inv_t) };
        }
    }
}

/// The largest logit, or the first NaN / `+inf` as an error.
fn max_logit(logits: &[f32]) -> Result<f32> {
    let (mut max, mut bad) = (f32::NEG_INFINITY, false);
    for &x in logits {
        bad |= x.is_nan() || x == f32::INFINITY;
        max = max.max(x);
    }
    if bad {
        for (i, &x) in logits.iter().enumerate() {
            check_logit(i, x)?;
        }
    }
    Ok(max)
}

/// Rejects NaN and `+inf`; `-inf` is a masked token.
fn check_logit(index: usize, value: f32) -> Result<()> {
    if value.is_nan() || value == f32::INFINITY {
        return Err(Error::NonFiniteLogits { index, value });
    }
    Ok(())
}

/// The index of the largest logit (the lowest index among ties).
///
/// # Errors
/// [`Error::NonFiniteLogits`] for NaN or `+inf`; [`Error::EmptyDistribution`] for an empty or all `-inf` row.
pub fn argmax(logits: &[f32]) -> Result<u32> {
    // Two vectorizable passes (the maximum, then its first position) beat one branchy pass.
    let max = max_logit(logits)?;
    if max == f32::NEG_INFINITY {
        return Err(Error::EmptyDistribution);
    }
    logits.iter().position(|&x| x == max).map(|i| i as u32).ok_or(Error::EmptyDistribution)
}

/// Draws an index with probability proportional to `probs` (sums in f64; need not be normalized).
///
/// # Errors
/// [`Error::EmptyDistribution`] when the row has no positive, finite mass.
pub fn sample<R: Rng + ?Sized>(probs: &[f32], rng: &mut R) -> Result<u32> {
    // Sums of blocks (vectorized) find the block that holds the draw; only it is walked.
    const BLOCK: usize = 1024;
    let sums: Vec<f64> = probs.chunks(BLOCK).map(crate::math::sum).collect();
    let total: f64 = sums.iter().sum();
    if !(total > 0.0 && total.is_finite()) {
        return Err(Error::EmptyDistribution);
    }
    let b = sample_weighted(sums.iter().copied(), total, rng) as usize;
    let block = &probs[b * BLOCK..((b + 1) * BLOCK).min(probs.len())];
    Ok((b * BLOCK) as u32 + sample_weighted(block.iter().map(|&x| x as f64), sums[b], rng))
}

/// Inverse-CDF draw from non-negative `weights` summing to `total`. Falls back to the last
/// positive weight when rounding leaves the target just past the end.
pub(crate) fn sample_weighted<R, I>(weights: I, total: f64, rng: &mut R) -> u32
where
    R: Rng + ?Sized,
    I: Iterator<Item = f64>,
{
    let target = rng.random::<f64>() * total;
    let mut acc = 0.0;
    let mut last_positive = 0;
    for (i, w) in weights.enumerate() {
        if w > 0.0 {
            acc += w;
            last_positive = i;
            if target < acc {
                return i as u32;
            }
        }
    }
    last_positive as u32
}

/// Token order used by top-k and top-p: higher value first, then lower index.
fn ranks_above(x: f32, i: usize, (cx, ci): (f32, usize)) -> bool {
    x > cx || (x == cx && i <= ci)
}

/// The (value, index) of the k-th ranked token; `k` is in 1..=len.
fn kth_largest(logits: &[f32], k: usize) -> (f32, usize) {
    let mut order: Vec<(f32, usize)> = logits.iter().copied().zip(0..).collect();
    let (_, kth, _) = order.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    *kth
}

/// Zeroes every token outside the smallest top set whose mass reaches `top_p` of the total.
fn keep_nucleus(weights: &mut [f32], top_p: f64) {
    // The nucleus is a prefix of the tokens ranked by weight. Bucket the weights by their binary
    // exponent (a positive f32 orders like its bits), add up the buckets from the top to find
    // the one where the prefix reaches `top_p`, and sort only that bucket's tokens.
    let bucket = |w: f32| (w.to_bits() >> 23) as usize;
    let mut mass = [0f64; 256];
    for &w in weights.iter().filter(|&&w| w > 0.0) {
        mass[bucket(w)] += w as f64;
    }
    let target = top_p * mass.iter().sum::<f64>();
    let (mut above, mut edge) = (0.0, 0);
    for b in (0..256).rev() {
        if above + mass[b] >= target {
            edge = b;
            break;
        }
        above += mass[b];
    }
    let mut candidates: Vec<(f32, usize)> =
        weights.iter().copied().zip(0..).filter(|&(w, _)| w > 0.0 && bucket(w) == edge).collect();
    candidates.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut last = candidates.last().copied();
    for &(w, i) in &candidates {
        above += w as f64;
        if above >= target {
            last = Some((w, i));
            break;
        }
    }
    for (i, w) in weights.iter_mut().enumerate() {
        if last.is_some_and(|c| !ranks_above(*w, i, c)) {
            *w = 0.0;
        }
    }
}

/// Scales `weights` to sum to one.
fn normalize(weights: &mut [f32]) -> Result<()> {
    let total = crate::math::sum(weights);
    if !(total > 0.0 && total.is_finite()) {
        return Err(Error::EmptyDistribution);
    }
    let inv = (1.0 / total) as f32;
    weights.iter_mut().for_each(|w| *w *= inv);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probs(cfg: &SamplingConfig, logits: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        cfg.probs(logits, &mut out).unwrap();
        out
    }

    #[test]
    fn greedy_is_one_hot_argmax() {
        assert_eq!(probs(&SamplingConfig::greedy(), &[0.0, 3.0, 3.0, -1.0]), vec![0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn temperature_one_is_softmax() {
        let p = probs(&SamplingConfig::new(1.0).unwrap(), &[0.0, (2.0f32).ln()]);
        assert!((p[0] - 1.0 / 3.0).abs() < 1e-6 && (p[1] - 2.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn top_k_keeps_k_tokens_and_breaks_ties_by_id() {
        let cfg = SamplingConfig::new(1.0).unwrap().with_top_k(2).unwrap();
        let p = probs(&cfg, &[1.0, 2.0, 2.0, 2.0]);
        assert_eq!(p.iter().filter(|&&x| x > 0.0).count(), 2);
        assert!(p[1] > 0.0 && p[2] > 0.0 && p[3] == 0.0);
    }

    #[test]
    fn top_p_keeps_smallest_reaching_set() {
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let cfg = SamplingConfig::new(1.0).unwrap().with_top_p(0.79).unwrap();
        let p = probs(&cfg, &logits);
        assert!((p[0] - 0.625).abs() < 1e-6 && (p[1] - 0.375).abs() < 1e-6);
        assert_eq!(&p[2..], &[0.0, 0.0]);
        let cfg = SamplingConfig::new(1.0).unwrap().with_top_p(0.81).unwrap();
        assert!(probs(&cfg, &logits)[2] > 0.0);
    }

    #[test]
    fn masked_tokens_stay_masked() {
        let p = probs(&SamplingConfig::new(0.7).unwrap(), &[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]);
        assert_eq!(p, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn bad_rows_are_errors() {
        let cfg = SamplingConfig::new(1.0).unwrap();
        let mut out = Vec::new();
        assert!(matches!(cfg.probs(&[0.0, f32::NAN], &mut out), Err(Error::NonFiniteLogits { index: 1, .. })));
        assert!(matches!(cfg.probs(&[f32::INFINITY], &mut out), Err(Error::NonFiniteLogits { .. })));
        assert!(matches!(cfg.probs(&[f32::NEG_INFINITY; 3], &mut out), Err(Error::EmptyDistribution)));
        assert!(matches!(argmax(&[]), Err(Error::EmptyDistribution)));
        assert!(matches!(sample(&[0.0, 0.0], &mut rand::rng()), Err(Error::EmptyDistribution)));
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(SamplingConfig::new(f32::NAN).is_err());
        assert!(SamplingConfig::new(-0.1).is_err());
        assert!(SamplingConfig::new(f32::INFINITY).is_err());
        assert!(SamplingConfig::greedy().with_top_k(0).is_err());
        assert!(SamplingConfig::greedy().with_top_p(0.0).is_err());
        assert!(SamplingConfig::greedy().with_top_p(1.5).is_err());
        assert!(SamplingConfig::greedy().with_top_p(f32::NAN).is_err());
    }
}
