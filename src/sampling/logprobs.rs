//! Log-probabilities of the emitted tokens, taken from the target's row at each position.
//!
//! Every token a decoder emits was judged against a target row, and that row is bit for bit
//! the row plain decoding computes at the same position (the models' rows do not depend on
//! the batch, the block or the tree). So the log-probabilities below, a pure function of the
//! row, are the plain decoder's to the last bit, under any drafter: they cost no model call.
//!
//! Two modes, named as vLLM names them:
//! - [`LogprobMode::Raw`]: the log-softmax of the model's logits (what OpenAI returns).
//! - [`LogprobMode::Processed`]: the law the token was drawn from: the row after the logits
//!   processors (penalties, bias, bans, grammar, custom), then temperature, top-k, min-p and
//!   top-p. Greedy decoding draws from a point mass; there the processed mode gives the
//!   log-softmax of the processed logits, before the argmax (as vLLM does at temperature 0).

use serde::Serialize;

use super::{History, Processors, SamplingConfig};
use crate::error::{Error, Result};
use crate::stats::TokenLogprob;

/// The most alternatives a token may carry (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Which row a token's log-probability is read from: the raw logits, or the law the token was
/// drawn from (see [`Logprobs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LogprobMode {
    /// The log-softmax of the model's logits.
    #[default]
    Raw,
    /// The log of the law the token was drawn from.
    Processed,
}

/// What a generation reports for each emitted token: its log-probability and the `top` most
/// likely tokens of its row.
///
/// The values are read from the target's row at the token's position, which is the row plain
/// decoding computes there, bit for bit (rows depend on neither the batch, the block nor the
/// tree): they are plain decoding's values under any drafter, and cost no model call. In
/// [`LogprobMode::Raw`] they are the log-softmax of the model's logits (what OpenAI returns);
/// in [`LogprobMode::Processed`], the log of the law the token was drawn from (the logits
/// processors, then temperature, top-k, min-p and top-p; at temperature 0, whose law is a
/// point mass, the log-softmax of the processed logits, as vLLM does).
///
/// # Example
/// ```
/// use specdec::sampling::{LogprobMode, Logprobs};
/// let asked = Logprobs::new(5, LogprobMode::Raw)?;
/// assert_eq!(asked.top(), 5);
/// assert!(Logprobs::new(21, LogprobMode::Raw).is_err());
/// # Ok::<(), specdec::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Logprobs {
    top: usize,
    mode: LogprobMode,
}

impl Logprobs {
    /// Each token's log-probability and its row's `top` most likely tokens, in `mode`.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `top` is above [`MAX_TOP_LOGPROBS`].
    pub fn new(top: usize, mode: LogprobMode) -> Result<Self> {
        if top > MAX_TOP_LOGPROBS {
            return Err(Error::setting("top_logprobs", top, "at most 20"));
        }
        Ok(Self { top, mode })
    }

    /// How many alternatives each token carries.
    pub fn top(&self) -> usize {
        self.top
    }

    /// Which row the values are read from.
    pub fn mode(&self) -> LogprobMode {
        self.mode
    }

    /// `token`'s values from the target's logits `row` at a position whose history is
    /// `history`, processed as `sampling` and `procs` process it for the draw.
    pub(crate) fn of(
        &self,
        (sampling, procs, history): (&SamplingConfig, &mut Processors, &History),
        row: &[f32],
        token: u32,
    ) -> Result<TokenLogprob> {
        if self.mode == LogprobMode::Raw {
            return Ok(from_logits(row, token, self.top));
        }
        let processed = procs.apply(history, row)?;
        if sampling.is_greedy() {
            return Ok(from_logits(processed, token, self.top));
        }
        let mut probs = Vec::new();
        sampling.probs(processed, &mut probs)?;
        Ok(from_probs(&probs, token, self.top))
    }
}

/// The log-softmax of `logits` at `token`, and its `top` largest entries. A pure function of
/// the row's bits: the sums run in a fixed order.
fn from_logits(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0;
    exp_sum_into(logits, max, &mut total);
    let norm = max as f64 + total.ln();
    let log = |x: f32| (x as f64 - norm) as f32;
    let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&x| log(x));
    let top = largest(logits, top).into_iter().map(|i| (i, log(logits[i as usize]))).collect();
    TokenLogprob { token, logprob, top }
}

/// The log of the probability row `probs` (normalized by its f64 sum) at `token`, and its
/// `top` largest entries.
fn from_probs(probs: &[f32], token: u32, top: usize) -> TokenLogprob {
    let total = crate::math::sum(probs);
    let log = |p: f32| (p as f64 / total).ln() as f32;
    let logprob = probs.get(token as usize).map_or(f32::NEG_INFINITY, |&p| log(p));
    let top = largest(probs, top).into_iter().map(|i| (i, log(probs[i as usize]))).collect();
    TokenLogprob { token, logprob, top }
}

multiversion! {
    /// Σ e^(x − max) over `row`, accumulated in f64 by eight running sums added up in a fixed
    /// order, compiled for the CPU's vectors (one scalar running sum over a vocabulary's row
    /// cost more than the rest of a token's values).
    fn exp_sum_into(row: &[f32], max: f32, out: &mut f64) {
        let mut lanes = [0f64; 8];
        let mut chunks = row.chunks_exact(8);
        for chunk in &mut chunks {
            for (lane, &x) in lanes.iter_mut().zip(chunk) {
                *lane += crate::math::exp(x - max) as f64;
            }
        }
        for (lane, &x) in lanes.iter_mut().zip(chunks.remainder()) {
            *lane += crate::math::exp(x - max) as f64;
        }
        *out = lanes.iter().sum();
    }
}

/// The indices of the `n` largest values of `row`, largest first, ties to the lower index
/// (NaN never ranks).
fn largest(row: &[f32], n: usize) -> Vec<u32> {
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return Vec::new();
    }
    for (i, &x) in row.iter().enumerate() {
        if x.is_nan() || (best.len() == n && best.last().is_some_and(|&(last, _)| x <= last)) {
            continue;
        }
        let at = best.partition_point(|&(y, _)| y >= x);
        best.insert(at, (x, i as u32));
        best.truncate(n);
    }
    best.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logits_and_probs_give_the_same_law() {
        let logits = [1.0f32, 3.0, f32::NEG_INFINITY, 3.0, -2.0];
        let raw = from_logits(&logits, 4, 3);
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        assert!((raw.logprob as f64 - (-2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(raw.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 0]);
        let probs: Vec<f32> = logits.iter().map(|&x| ((x as f64).exp() / z) as f32).collect();
        let via_probs = from_probs(&probs, 4, 3);
        assert!((via_probs.logprob - raw.logprob).abs() < 1e-5);
        assert_eq!(from_probs(&probs, 2, 0).logprob, f32::NEG_INFINITY);
        assert!(from_logits(&logits, 0, 0).top.is_empty());
    }

    #[test]
    fn the_largest_are_found_in_order_with_ties_to_the_lower_index() {
        let row = [0.5f32, 2.0, 2.0, f32::NAN, -1.0, 7.0];
        assert_eq!(largest(&row, 3), [5, 1, 2]);
        assert_eq!(largest(&row, 10), [5, 1, 2, 0, 4]);
        assert!(largest(&row, 0).is_empty());
    }
}
