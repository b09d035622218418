//! What a generation produced and what it cost, plus the seed's speedup formulas.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::{json, Value};

/// Where a decoder reads the times it reports in [`Stats`] and its adaptive k weighs: the wall
/// clock (the default), or a manual clock that moves only when told to. A manual clock makes
/// the k a decoder chooses a function of the seed alone: tests and simulations give it to the
/// decoder and to their models, and each model call advances it by what it is meant to cost.
///
/// # Example
/// ```
/// use specdec::Clock;
/// let clock = Clock::manual();
/// let seen_by_the_decoder = clock.clone();
/// clock.advance(0.25);
/// assert_eq!(seen_by_the_decoder.seconds(), 0.25);
/// ```
#[derive(Debug, Clone)]
pub struct Clock {
    origin: Instant,
    /// Nanoseconds a manual clock has been advanced, shared by its clones.
    manual: Option<Arc<AtomicU64>>,
}

impl Default for Clock {
    /// The wall clock.
    fn default() -> Self {
        Self::wall()
    }
}

impl Clock {
    /// The wall clock: seconds since this value was made.
    pub fn wall() -> Self {
        Self { origin: Instant::now(), manual: None }
    }

    /// A clock at 0 that moves only by [`advance`](Self::advance); its clones share its time.
    pub fn manual() -> Self {
        Self { origin: Instant::now(), manual: Some(Arc::new(AtomicU64::new(0))) }
    }

    /// Moves a manual clock forward by `secs` (rounded to whole nanoseconds; negative or NaN
    /// counts as 0). The wall clock ignores it.
    pub fn advance(&self, secs: f64) {
        if let Some(nanos) = &self.manual {
            nanos.fetch_add((secs.max(0.0) * 1e9) as u64, Ordering::Relaxed);
        }
    }

    /// Seconds since the clock was made (wall) or advanced in all (manual).
    pub fn seconds(&self) -> f64 {
        match &self.manual {
            Some(nanos) => nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            None => self.origin.elapsed().as_secs_f64(),
        }
    }

    /// Runs `f` and adds the time it took to `secs`.
    pub(crate) fn timed<R>(&self, secs: &mut f64, f: impl FnOnce() -> R) -> R {
        let start = self.seconds();
        let out = f();
        *secs += self.seconds() - start;
        out
    }
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FinishReason {
    /// `max_new_tokens` tokens were produced.
    Length,
    /// A stop token was produced (it is the last token of the output).
    Stop,
    /// The caller stopped it (a streaming callback's `ControlFlow::Break`, or a cancel).
    Cancelled,
}

/// Counters and timings of one generation. Times are in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// Tokens generated (the prompt not counted).
    pub new_tokens: usize,
    /// Target forward calls after the prefill (one per speculative round).
    pub target_calls: usize,
    /// Draft `propose` calls after the prefill.
    pub draft_calls: usize,
    /// Tokens the draft proposed.
    pub drafted: usize,
    /// Drafted tokens the target accepted.
    pub accepted: usize,
    /// Rounds that ended in a rejection (as opposed to a fully accepted block).
    pub rejections: usize,
    /// Rounds that drafted a tree (the others drafted a chain or none).
    pub tree_rounds: usize,
    /// Tokens the logits processors forced (a grammar's fast-forward), emitted with no draft
    /// call; those inside a drafted block also count as drafted and accepted.
    pub forced_tokens: usize,
    /// Seconds spent in the logits processors (masks, penalties), draft and target rows.
    pub process_secs: f64,
    /// Seconds spent in the prefill of both models.
    pub prefill_secs: f64,
    /// Prompt tokens the target prefilled (the prompt but its last token, less the cached
    /// prefix).
    pub prefill_tokens: usize,
    /// Prompt tokens whose target state came from a prefix cache.
    pub prefix_hit_tokens: usize,
    /// Seconds from the start of the prefill to the first token generated.
    pub first_token_secs: f64,
    /// Seconds spent in draft calls.
    pub draft_secs: f64,
    /// Seconds spent in target calls (after the prefill).
    pub target_secs: f64,
    /// Seconds from the end of the prefill to the last token.
    pub decode_secs: f64,
    /// Per drafting depth (index 0: the first drafted token): how many rounds reached it (every
    /// earlier depth accepted, a draft there) and how many of those accepted it.
    pub by_depth: Vec<(usize, usize)>,
}

impl Stats {
    /// Fraction of drafted tokens that were accepted (the figure peers print).
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }

    /// Per-position acceptance probability: accepted / (accepted + rejections). This is the α of
    /// the seed's geometric model (each drafted position passes with probability α once reached),
    /// and the estimate its formulas need; `acceptance_rate` undercounts it because positions
    /// after a rejection are never tested.
    pub fn position_acceptance(&self) -> f64 {
        ratio(self.accepted, self.accepted + self.rejections)
    }

    /// Prompt tokens prefilled per second (0 without a prefill).
    pub fn prefill_tok_s(&self) -> f64 {
        if self.prefill_secs > 0.0 {
            self.prefill_tokens as f64 / self.prefill_secs
        } else {
            0.0
        }
    }

    /// Acceptance at each drafting depth, given that the round got there: α₁, α₂, ….
    pub fn acceptance_by_depth(&self) -> Vec<f64> {
        self.by_depth.iter().map(|&(reached, accepted)| ratio(accepted, reached)).collect()
    }

    /// Counts a chain round that drafted `drafted` tokens and kept `accepted` of them.
    pub(crate) fn record_round(&mut self, drafted: usize, accepted: usize) {
        self.drafted += drafted;
        self.accepted += accepted;
        self.rejections += usize::from(accepted < drafted);
        self.record_depths(drafted, accepted);
    }

    /// Counts a round that drafted `depth` levels and accepted `accepted` tokens.
    pub(crate) fn record_depths(&mut self, depth: usize, accepted: usize) {
        let reached = (accepted + 1).min(depth);
        if self.by_depth.len() < reached {
            self.by_depth.resize(reached, (0, 0));
        }
        for (d, entry) in self.by_depth.iter_mut().enumerate().take(reached) {
            entry.0 += 1;
            entry.1 += usize::from(d < accepted);
        }
    }

    /// New tokens per target call.
    pub fn tokens_per_target_call(&self) -> f64 {
        ratio(self.new_tokens, self.target_calls)
    }

    /// Mean drafted tokens per round.
    pub fn mean_k(&self) -> f64 {
        ratio(self.drafted, self.target_calls)
    }

    /// c: mean time of a draft call over mean time of a target (verification) call.
    pub fn cost_ratio(&self) -> f64 {
        let draft = self.draft_secs / self.draft_calls.max(1) as f64;
        let target = self.target_secs / self.target_calls.max(1) as f64;
        if target > 0.0 {
            draft / target
        } else {
            0.0
        }
    }

    /// Decoding speed in tokens per second (prefill excluded).
    pub fn tokens_per_sec(&self) -> f64 {
        if self.decode_secs > 0.0 {
            self.new_tokens as f64 / self.decode_secs
        } else {
            0.0
        }
    }

    /// The seed's S(k, α, c) at the mean k, the per-position α and the measured c.
    pub fn predicted_speedup(&self) -> f64 {
        predicted_speedup(self.mean_k(), self.position_acceptance(), self.cost_ratio())
    }

    /// The counters, the timings and every derived figure above, as JSON.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            let derived = json!({
                "acceptance_rate": self.acceptance_rate(),
                "position_acceptance": self.position_acceptance(),
                "tokens_per_target_call": self.tokens_per_target_call(),
                "mean_k": self.mean_k(),
                "cost_ratio": self.cost_ratio(),
                "tokens_per_sec": self.tokens_per_sec(),
                "predicted_speedup": self.predicted_speedup(),
                "acceptance_by_depth": self.acceptance_by_depth(),
            });
            if let Value::Object(d) = derived {
                m.extend(d);
            }
        }
        v
    }
}

impl std::ops::AddAssign<&Stats> for Stats {
    /// Adds the counters and times of another generation (for totals over several).
    fn add_assign(&mut self, o: &Stats) {
        self.new_tokens += o.new_tokens;
        self.target_calls += o.target_calls;
        self.draft_calls += o.draft_calls;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.rejections += o.rejections;
        self.tree_rounds += o.tree_rounds;
        self.forced_tokens += o.forced_tokens;
        self.process_secs += o.process_secs;
        self.prefill_secs += o.prefill_secs;
        self.prefill_tokens += o.prefill_tokens;
        self.prefix_hit_tokens += o.prefix_hit_tokens;
        self.first_token_secs += o.first_token_secs;
        self.draft_secs += o.draft_secs;
        self.target_secs += o.target_secs;
        self.decode_secs += o.decode_secs;
        if self.by_depth.len() < o.by_depth.len() {
            self.by_depth.resize(o.by_depth.len(), (0, 0));
        }
        for (a, b) in self.by_depth.iter_mut().zip(&o.by_depth) {
            a.0 += b.0;
            a.1 += b.1;
        }
    }
}

/// Tokens generated and what it took.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Generation {
    /// The new tokens (a stop token, when one ended the generation, is the last).
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// Counters and timings.
    pub stats: Stats,
    /// Each token's log-probability and its row's most likely tokens, when the sampling
    /// settings ask for them ([`SamplingConfig::with_logprobs`](crate::SamplingConfig::with_logprobs));
    /// empty otherwise.
    pub logprobs: Vec<TokenLogprob>,
}

/// One emitted token's log-probability, and the most likely tokens of its row (see
/// [`Logprobs`](crate::sampling::Logprobs) for which row).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its natural log-probability (`-inf` for a token the processed law excludes).
    pub logprob: f32,
    /// The row's most likely tokens with theirs, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Expected tokens per target call with a block of `k` drafts accepted with probability `alpha`
/// each: (1 − α^(k+1)) / (1 − α), which tends to k + 1 as α → 1. `k` may be fractional (a mean).
pub fn expected_tokens_per_call(k: f64, alpha: f64) -> f64 {
    if alpha >= 1.0 - 1e-12 {
        k + 1.0
    } else {
        (1.0 - alpha.powf(k + 1.0)) / (1.0 - alpha)
    }
}

/// The seed's speedup S(k, α, c) = (1 − α^(k+1)) / ((1 − α)(k·c + 1)): tokens per call over the
/// cost of k draft calls and one target call that costs the same as a single-token step.
pub fn predicted_speedup(k: f64, alpha: f64, c: f64) -> f64 {
    predicted_speedup_with_verify(k, alpha, c, 1.0)
}

/// S with the verification cost included: tokens per call / (k·c + v), where v is the cost of
/// the (k+1)-token target call in units of a one-token step.
pub fn predicted_speedup_with_verify(k: f64, alpha: f64, c: f64, v: f64) -> f64 {
    expected_tokens_per_call(k, alpha) / (k * c + v)
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_by_depth_counts_the_rounds_that_reached_each_depth() {
        let mut s = Stats::default();
        s.record_depths(3, 3); // all three accepted
        s.record_depths(3, 1); // the second rejected, the third never tried
        s.record_depths(2, 0); // the first rejected
        assert_eq!(s.by_depth, vec![(3, 2), (2, 1), (1, 1)]);
        let mut total = Stats::default();
        total += &s;
        total += &s;
        assert_eq!(total.acceptance_by_depth(), vec![2.0 / 3.0, 0.5, 1.0]);
    }

    #[test]
    fn seed_formula_values() {
        assert!((predicted_speedup(4.0, 1.0, 0.15) - 3.125).abs() < 1e-12);
        assert!((expected_tokens_per_call(4.0, 0.416) - 1.6911).abs() < 1e-3);
        assert!((expected_tokens_per_call(3.0, 0.0) - 1.0).abs() < 1e-12);
    }
}
