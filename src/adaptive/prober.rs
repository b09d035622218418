//! The probing rules of the adaptive k ([`Prober`]), kept by each sequence of a decoder and by
//! a [`KController`].

use super::speedup::{best_k, expected_speedup, MIN_GAIN};
#[cfg(doc)]
use super::KController;
use super::{CostModel, RoundReport};

/// While drafting, every this many rounds the adaptive controller tries a neighbour of its
/// best k, so that the cost of other block lengths keeps being measured (and T(1) by k = 0).
const PROBE_EVERY: usize = 16;
/// While it decodes plainly, its probes (k = 1) lose time to a poor draft; they are spaced so
/// that they cost about this fraction of the tokens,
pub(super) const PROBE_BUDGET: f64 = 0.02;
/// but come at least this often, so that a draft that turns good is noticed.
pub(super) const PROBE_MAX_GAP: usize = 256;
/// After this many probes from plain decoding in a row that show the draft too slow to pay
/// even if it were always right, the prober stops probing (see [`KController`]).
const SLOW_PROBES_TO_STOP: usize = 3;

/// The probing rules of the adaptive k, the same for the single decoder's [`KController`] and
/// for each sequence of a batch (see [`KController`] for what they are and why): until a draft
/// call and a target pass are timed, one drafted token; then the cost model's best k, with a
/// neighbour every [`PROBE_EVERY`] rounds, or, from plain decoding, k = 1 spaced to cost about
/// [`PROBE_BUDGET`] of the tokens; and no more probes after [`SLOW_PROBES_TO_STOP`] in a row
/// found the draft too slow to pay at any acceptance.
#[derive(Debug, Clone, Default)]
pub(crate) struct Prober {
    since_probe: usize,
    probes: usize,
    /// Whether the latest round drafts only to measure (the first round, or a probe from plain
    /// decoding), so that `observe` judges it.
    measuring: bool,
    /// Consecutive measuring rounds that found the draft too slow to pay.
    slow_probes: usize,
}

impl Prober {
    /// Whether it has stopped probing a draft too slow to pay whatever its acceptance.
    pub(crate) fn stopped(&self) -> bool {
        self.slow_probes >= SLOW_PROBES_TO_STOP
    }

    /// The k of the next round, in `0..=max`: `best`, the k the cost model chose at the
    /// estimated acceptance `alpha`, or a probe (1 until the costs are measured). `probe_loss`:
    /// the tokens a probe from plain decoding loses in a batch (`None`: one sequence's loss).
    pub(crate) fn next_k(
        &mut self,
        best: usize,
        max: usize,
        costs: &CostModel,
        alpha: f64,
        probe_loss: Option<f64>,
    ) -> usize {
        if !measured(costs) {
            // The draft's cost is still unknown: one drafted token measures it, where a block
            // would risk several calls of a draft that may cost more than the target.
            self.measuring = true;
            return 1;
        }
        self.measuring = false;
        if best == 0 && self.stopped() {
            return 0;
        }
        let gap = match best {
            // Each slow probe in a row doubles the wait: a short generation pays for the first
            // round's measurement alone, a long one for 3 probes in all.
            0 => plain_probe_gap(costs, alpha, max, probe_loss) << self.slow_probes,
            _ => PROBE_EVERY,
        };
        self.since_probe += 1;
        if self.since_probe < gap {
            return best;
        }
        self.since_probe = 0;
        self.probes += 1;
        self.measuring = best == 0;
        probe(best, max, self.probes)
    }

    /// Judges a finished round by the costs it updated (`max_rows`: the most rows a round of
    /// this policy scores). A round without a draft call (cut to k = 0 at the end of a
    /// generation, or with an impossible time) measured nothing about the draft.
    pub(crate) fn observe(&mut self, round: &RoundReport, costs: &CostModel, max_rows: usize) {
        if self.measuring && round.draft_calls > 0 {
            let slow = too_slow(costs, round, max_rows);
            self.slow_probes = if slow { self.slow_probes + 1 } else { 0 };
        }
    }
}

/// The probe after `best`: k = 1 from plain decoding, else alternately one up and one down.
fn probe(best: usize, max: usize, nth: usize) -> usize {
    match best {
        0 => 1,
        b if nth % 2 == 1 && b < max => b + 1,
        b => b - 1,
    }
}

/// Whether a draft call and a one-row target pass were timed.
fn measured(costs: &CostModel) -> bool {
    costs.has_any_draft() && costs.target_secs(1).is_some()
}

/// The time of a one-row draft call and T(m) for m = 1..=max + 1 (before any target call,
/// T(1) is the unit and the others follow the cost model's prior).
fn unit_costs(costs: &CostModel, max: usize) -> (f64, Vec<f64>) {
    let one = costs.target_secs(1).unwrap_or(1.0);
    let verify = (1..=max + 1).map(|m| costs.target_secs(m).unwrap_or(one)).collect();
    (costs.draft_secs(1), verify)
}

/// Whether drafting is too slow to pay even if every drafted token were accepted, both by
/// `round`'s own time (against plain steps at the estimated T(1)) and by the estimates at any
/// k up to `max_rows - 1`. Both, so that neither one slow call (a draft catching up after
/// plain rounds) nor an estimate still dragged by an old slow call stops the probes of a draft
/// that pays.
fn too_slow(costs: &CostModel, round: &RoundReport, max_rows: usize) -> bool {
    if !measured(costs) {
        return false;
    }
    let (draft, verify) = unit_costs(costs, max_rows - 1);
    let plain_secs = (round.drafted + 1) as f64 * verify[0];
    let round_too_slow = plain_secs < MIN_GAIN * (round.draft_secs + round.target_secs);
    round_too_slow && best_k(1.0, draft, &verify) == 0
}

/// Rounds between probes while decoding plainly: a k = 1 round yields E = 1 + α tokens in the
/// time plain decoding yields E / S(1), so it loses E / S(1) − E tokens; at [`PROBE_BUDGET`]
/// tokens earned per round, that takes that many rounds (at least 2: when k = 1 is nearly as
/// good as plain decoding, probing it often costs little and settles the choice quickly; at
/// most [`PROBE_MAX_GAP`]). In a batch the loss is the batch's (`probe_loss`): a probe there
/// turns a plain step of all the sequences into a drafting one, where the draft catches up
/// on what it missed; one sequence's rule would probe every other step, because a draft that
/// pays alone (the batch chose plain steps for the others' sake) loses nothing by it.
fn plain_probe_gap(costs: &CostModel, alpha: f64, max: usize, probe_loss: Option<f64>) -> usize {
    let (draft, verify) = unit_costs(costs, max);
    let (tokens, speedup) = (1.0 + alpha, expected_speedup(1, alpha, draft, &verify));
    let alone = if speedup > 0.0 { tokens / speedup - tokens } else { f64::INFINITY };
    let loss = probe_loss.unwrap_or(alone);
    // `as` saturates, and turns NaN (which cannot arise here) into 0, then 2.
    ((loss / PROBE_BUDGET).ceil() as usize).clamp(2, PROBE_MAX_GAP)
}
