//! Choosing k, the number of drafted tokens, round by round.
//!
//! The seed's speedup S(k, α, c) has an interior optimum in k that moves with the acceptance
//! rate α and the cost of a draft call (its Sections 2.4, 3.5 and 6). [`KController`] follows it:
//! it estimates α, the time of a draft call and the time of a target call that verifies m rows,
//! and each round picks the k with the most expected tokens per unit of time, k = 0 (a plain
//! step) when speculation does not pay. Decoding stays exact whatever k is picked, because k is
//! fixed from past rounds before the round's own random draws.

mod acceptance;
mod control;
mod costs;
mod policy;
mod prober;
mod speedup;
mod tree;
mod warm;

pub(crate) use acceptance::Acceptance;
pub(crate) use control::{round_ks, SeqControl};
pub use costs::{Candidate, CostModel};
pub use policy::{KPolicy, DEFAULT_MAX_K};
pub(crate) use prober::Prober;
pub use speedup::{best_k, expected_speedup};
pub use tree::{ShapeChooser, TreePolicy};

use crate::error::Result;

/// The largest k of any [`KPolicy`]: fixed, or the `max` of an adaptive or grow/shrink one
/// (the adaptive policy keeps one cost estimate per block length).
pub const MAX_K: usize = 64;

/// What one round did and cost, as the decoder reports it to the [`KController`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoundReport {
    /// Tokens drafted (fewer than k when the drafter proposed nothing).
    pub drafted: usize,
    /// Drafted tokens accepted.
    pub accepted: usize,
    /// Draft `propose` calls (including one that proposed nothing).
    pub draft_calls: usize,
    /// Seconds in those calls.
    pub draft_secs: f64,
    /// Rows the target verified: `drafted + 1`.
    pub target_rows: usize,
    /// Seconds in the target call.
    pub target_secs: f64,
}

/// How far the cost model's correction of drafting steps moves back toward none in a step
/// without drafting (half-way in about 70 steps).
pub(crate) const RELAX: f64 = 0.01;
/// Chooses k before each round and learns from the round's [`RoundReport`].
///
/// With [`KPolicy::Adaptive`] it keeps a moving estimate of the per-position acceptance α =
/// accepted / (accepted + rejections) (as [`Stats::position_acceptance`](crate::Stats::position_acceptance))
/// and a [`CostModel`], the one the batch decoder's policy keeps too: the time of a draft call,
/// and the time T(m) of a target call verifying m rows (see there how unmeasured sizes are
/// filled in). It then picks the k maximizing `E[tokens](k, α) / (k·t_draft + T(k + 1))`,
/// with `E[tokens](k, α) = (1 − α^(k+1)) / (1 − α)`, as [`CostModel::choose`] does for a
/// batch of one sequence; k = 0 unless that beats plain steps by 3 %. To keep its estimates
/// alive it probes: every 16th round it tries a neighbour of that k, and while it decodes
/// plainly it tries k = 1, spaced (every 2 to 256 rounds) so that these rounds cost about 2 %
/// of the tokens however expensive the draft.
///
/// This is the decoders' own chooser, not a second one: a [`SpeculativeDecoder`](crate::SpeculativeDecoder)
/// is a batch of one, and every sequence of a [`BatchDecoder`](crate::BatchDecoder) follows
/// these rules, the cost model choosing their k's together (with several sequences it also
/// prices a probe by what it costs the others). A `KController` runs that code for one
/// sequence outside a decoder: to simulate a policy (`examples/simulate.rs`), or to choose k
/// for a decoding loop of one's own.
///
/// Two rules bound what a draft too expensive to ever pay (one costing about a target step or
/// more, which no acceptance rate rescues) loses against plain decoding. Until a draft call
/// has been timed, the controller drafts one token, so the first round risks one draft call
/// rather than a block. And a probe from plain decoding (that
/// first round included) counts as *too slow* when neither its own time nor the updated
/// estimates leave any k that would pay even if every drafted token were accepted; each such
/// probe in a row doubles the wait before the next, and after 3 in a row the controller stops
/// probing and decodes plainly from then on. In the seed's cost model with a draft call
/// costing 5 target steps, that keeps a fresh controller within 2 % of plain decoding over 300
/// tokens and within 0.5 % over 5,000. The trade-off: a draft that later becomes cheaper (not
/// better: acceptance cannot rescue it) is no longer noticed, until a new decoder measures
/// again. A draft that is cheap but poorly accepted is never stopped, so its probes notice
/// when the text turns easy. Like the estimates, the verdict is about the model pair on this
/// machine, not about the text, so it carries over from one generation to the next.
///
/// After plain rounds the draft has fallen behind: the decoder feeds it the missed tokens in a
/// call of its own before the round, whose time stays out of the draft-time average (it grows
/// with the plain stretch, not with k). [`next_k_for`](Self::next_k_for) prices that catch-up;
/// and [`planned`](Self::planned) and [`observe_time`](Self::observe_time) tell the cost model
/// a round's predicted and measured seconds and its time outside the models, as the decoders
/// do.
///
/// # Example
/// ```
/// use specdec::adaptive::{KController, KPolicy, RoundReport};
/// let mut ctl = KController::new(KPolicy::Adaptive { max: 8 })?;
/// for _ in 0..200 {
///     let k = ctl.next_k();
///     // A draft that is always right and costs nothing beside a flat-cost target: draft long.
///     let report = RoundReport { drafted: k, accepted: k, draft_calls: k, draft_secs: 0.0,
///                                target_rows: k + 1, target_secs: 1.0 };
///     ctl.observe(&report);
/// }
/// assert!(ctl.next_k() >= 7);
/// # Ok::<(), specdec::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct KController {
    policy: KPolicy,
    /// The sequence's share, as every decoder keeps it per sequence.
    ctl: SeqControl,
    costs: CostModel,
    /// The most rows a round scores: larger reports are ignored.
    max_rows: usize,
    /// The latest round's sequence as the cost model saw it (catch-up left out).
    candidate: Candidate,
    /// The latest round's predicted seconds, and whether it drafts.
    predicted: Option<(bool, f64)>,
    /// The latest round's draft and target rows and seconds, for [`observe_time`](Self::observe_time).
    last: RoundReport,
}

impl KController {
    /// A controller for `policy`.
    ///
    /// # Errors
    /// As [`KPolicy::check`].
    pub fn new(policy: KPolicy) -> Result<Self> {
        let policy = policy.check()?;
        let ctl = SeqControl::new(policy, Acceptance::new(), Prober::default());
        let candidate = Candidate { alpha: ctl.acceptance.alpha(), limit: 0, behind: 0, remaining: usize::MAX };
        let (costs, max_rows, last) = (CostModel::default(), policy.max() + 1, RoundReport::default());
        Ok(Self { policy, ctl, costs, max_rows, candidate, predicted: None, last })
    }

    /// The policy.
    pub fn policy(&self) -> KPolicy {
        self.policy
    }

    /// The k of the latest round (before any round, the k the first round will use).
    pub fn k(&self) -> usize {
        self.ctl.k()
    }

    /// The estimated per-position acceptance α (the prior 0.8 before any drafting).
    pub fn alpha(&self) -> f64 {
        self.ctl.acceptance.alpha()
    }

    /// Whether the controller has stopped probing because the draft is too slow to pay
    /// whatever its acceptance (see above); it then decodes plainly.
    pub fn stopped_probing(&self) -> bool {
        self.ctl.prober.stopped()
    }

    /// The k for the next round, for a draft in step and a long generation
    /// ([`next_k_for`](Self::next_k_for) with nothing behind and no end in sight).
    pub fn next_k(&mut self) -> usize {
        self.next_k_for(0, usize::MAX)
    }

    /// The k for the next round of a generation with `remaining` tokens left, whose draft must
    /// first catch up on `behind` tokens if it drafts (the adaptive policy prices that
    /// catch-up).
    pub fn next_k_for(&mut self, behind: usize, remaining: usize) -> usize {
        let max = self.policy.max();
        let limit = max.min(remaining.saturating_sub(1));
        self.candidate = Candidate { alpha: self.alpha(), limit, behind, remaining };
        let candidates = match self.policy {
            KPolicy::Adaptive { .. } => vec![self.candidate],
            _ => Vec::new(),
        };
        round_ks(self.policy, &self.costs, max, &mut [&mut self.ctl], &candidates)[0]
    }

    /// The k the round will draft after the drafter's block length and the generation's end
    /// cut it (see [`next_k_for`](Self::next_k_for)): the cost model predicts the round's
    /// seconds from it, to compare with what [`observe_time`](Self::observe_time) measures.
    pub fn planned(&mut self, k: usize) {
        if let KPolicy::Adaptive { .. } = self.policy {
            let seq = Candidate { behind: 0, ..self.candidate };
            self.predicted = self.costs.step_secs(&[seq], &[k]).map(|p| (k > 0, p));
        }
    }

    /// Learns from a finished round (each draft call taken to cost the round's mean).
    pub fn observe(&mut self, round: &RoundReport) {
        let mean = round.draft_secs / round.draft_calls.max(1) as f64;
        self.observe_calls(round, &vec![mean; round.draft_calls]);
    }

    /// As [`observe`](Self::observe), with each draft call's own seconds (`draft_calls` of
    /// them), as the decoders record their calls.
    pub fn observe_calls(&mut self, round: &RoundReport, draft_call_secs: &[f64]) {
        if let KPolicy::Adaptive { .. } = self.policy {
            // The cost model ignores impossible times; a round of more rows than the
            // controller chooses, such as a tree's, is left out.
            for &secs in draft_call_secs {
                self.costs.observe_draft(1, secs);
            }
            if (1..=self.max_rows).contains(&round.target_rows) {
                self.costs.observe_target(round.target_rows, round.target_secs);
            }
            self.last = *round;
        }
        self.ctl.observe(self.policy, round, &self.costs, self.max_rows);
    }

    /// Learns a finished round's whole time, after [`observe`](Self::observe): `secs` from the
    /// choice of k to the roll-back, of which `setup` went to the draft's catch-up. The rest
    /// beside the model calls is priced per row, and the measured seconds against the
    /// prediction correct later predictions (see [`CostModel::observe_outcome`]), as the
    /// decoders do after each step.
    pub fn observe_time(&mut self, secs: f64, setup: f64) {
        if let KPolicy::Adaptive { .. } = self.policy {
            let r = &self.last;
            let costs = &mut self.costs;
            costs.observe_other(r.draft_calls + r.target_rows, secs - r.draft_secs - r.target_secs - setup);
            if let Some((drafting, predicted)) = self.predicted.take() {
                costs.observe_outcome(drafting, predicted, secs - setup);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn report(drafted: usize, accepted: usize) -> RoundReport {
        RoundReport {
            drafted,
            accepted,
            draft_calls: drafted,
            draft_secs: 0.1 * drafted as f64,
            target_rows: drafted + 1,
            target_secs: 1.0,
        }
    }

    #[test]
    fn settings_are_checked() {
        assert!(matches!(KController::new(KPolicy::Fixed(0)), Err(Error::InvalidSetting { name: "k", .. })));
        assert!(KController::new(KPolicy::Adaptive { max: 0 }).is_err());
        assert!(KController::new(KPolicy::Adaptive { max: MAX_K + 1 }).is_err());
        assert!(KController::new(KPolicy::GrowShrink { start: 0, max: 3 }).is_err());
        assert!(KController::new(KPolicy::GrowShrink { start: 4, max: 3 }).is_err());
        assert!(KController::new(KPolicy::Adaptive { max: MAX_K }).is_ok());
        assert!(KController::new(KPolicy::Fixed(MAX_K + 1)).is_err());
        assert!(KController::new(KPolicy::GrowShrink { start: 1, max: MAX_K + 1 }).is_err());
        assert!(KController::new(KPolicy::Fixed(MAX_K)).is_ok());
    }

    #[test]
    fn fixed_stays_and_grow_shrink_follows_the_blocks() -> Result<()> {
        let mut fixed = KController::new(KPolicy::Fixed(3))?;
        fixed.observe(&report(3, 0));
        assert_eq!(fixed.next_k(), 3);
        let mut gs = KController::new(KPolicy::GrowShrink { start: 2, max: 3 })?;
        let mut ks = Vec::new();
        for (drafted, accepted) in [(2, 2), (3, 3), (3, 3), (3, 1), (2, 0), (1, 0), (1, 1), (1, 1), (0, 0)] {
            ks.push(gs.next_k());
            gs.observe(&report(drafted, accepted));
        }
        assert_eq!(ks, [2, 3, 3, 3, 2, 1, 1, 2, 2]);
        Ok(())
    }

    #[test]
    fn adaptive_settles_on_plain_decoding_for_a_useless_draft_and_keeps_probing() -> Result<()> {
        let mut ctl = KController::new(KPolicy::Adaptive { max: 6 })?;
        let mut ks = Vec::new();
        for _ in 0..400 {
            let k = ctl.next_k();
            ks.push(k);
            let r = RoundReport {
                drafted: k,
                accepted: 0,
                draft_calls: k,
                draft_secs: 0.5 * k as f64,
                target_rows: k + 1,
                target_secs: 1.0,
            };
            ctl.observe(&r);
        }
        let late = &ks[200..];
        assert!(late.iter().filter(|&&k| k == 0).count() >= late.len() * 9 / 10, "{late:?}");
        assert!(late.contains(&1), "it still probes: {late:?}");
        assert!(ctl.alpha() < 0.05);
        Ok(())
    }

    /// Drives `ctl` for `rounds` rounds with the report `round(k)`; returns the k of each.
    fn drive(ctl: &mut KController, rounds: usize, round: impl Fn(usize) -> RoundReport) -> Vec<usize> {
        (0..rounds)
            .map(|_| {
                let k = ctl.next_k();
                ctl.observe(&round(k));
                k
            })
            .collect()
    }

    #[test]
    fn adaptive_measures_the_draft_with_one_token_before_drafting_long() -> Result<()> {
        let mut ctl = KController::new(KPolicy::default())?;
        assert_eq!(ctl.policy(), KPolicy::Adaptive { max: 8 });
        assert_eq!((ctl.k(), ctl.next_k()), (1, 1));
        ctl.observe(&report(1, 1));
        assert!(ctl.next_k() > 1);
        Ok(())
    }

    #[test]
    fn adaptive_stops_probing_only_a_draft_too_slow_for_any_acceptance() -> Result<()> {
        // Every call of this draft costs 5 target steps: measured, then probed twice, then left.
        let mut slow = KController::new(KPolicy::default())?;
        let ks = drive(&mut slow, 3_000, |k| RoundReport { draft_secs: 5.0 * k as f64, ..report(k, k) });
        assert_eq!(ks.iter().filter(|&&k| k > 0).count(), 3, "{ks:?}");
        assert!(slow.stopped_probing());
        // This one is cheap but poorly accepted, and its probes each pay for one slow call (as a
        // draft catching up after plain rounds does): they lose, but the estimates still say it
        // could pay on easier text, so six of them in a row do not stop it.
        let mut cheap = KController::new(KPolicy::default())?;
        drive(&mut cheap, 1, |k| report(k, 0));
        let mut probes = 0;
        while probes < 6 {
            let ks = drive(&mut cheap, 1, |k| RoundReport { draft_secs: 1.5 * k as f64, ..report(k, 0) });
            probes += usize::from(ks[0] > 0);
            assert!(!cheap.stopped_probing(), "after {probes} probes");
        }
        Ok(())
    }

    #[test]
    fn adaptive_ignores_impossible_times() -> Result<()> {
        let mut ctl = KController::new(KPolicy::Adaptive { max: 4 })?;
        for secs in [f64::NAN, f64::INFINITY, -1.0] {
            let k = ctl.next_k();
            ctl.observe(&RoundReport {
                drafted: k,
                accepted: k,
                draft_calls: k,
                draft_secs: secs,
                target_rows: k + 1,
                target_secs: secs,
            });
        }
        // A report that does not fit (more rows than the controller knows) is ignored too.
        ctl.observe(&RoundReport { target_rows: 99, target_secs: 1.0, ..RoundReport::default() });
        let costs = &ctl.costs;
        assert!(!costs.has_draft(1) && (0..=99).all(|m| !costs.has_target(m)));
        assert!(ctl.next_k() <= 4);
        Ok(())
    }
}
