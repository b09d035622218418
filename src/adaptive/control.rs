//! The k chooser: one sequence's share of the k policy ([`SeqControl`]), and the round's
//! choice for a set of sequences ([`round_ks`]). The decoders (a batch, and the single decoder
//! as a batch of one) and the public [`KController`](super::KController) all choose k here.

use super::{Acceptance, Candidate, CostModel, KPolicy, Prober, RoundReport};

/// The policy's k for each sequence of a round, before a request's own k and the drafts'
/// block lengths: the cost model's best k's for the whole set (`candidates`, one per
/// sequence, under the adaptive policy; empty otherwise), then each sequence's own rule (its
/// probes, see [`Prober`]; its grow/shrink k; the fixed k) within the longest block `longest`.
pub(crate) fn round_ks(
    policy: KPolicy,
    costs: &CostModel,
    longest: usize,
    ctls: &mut [&mut SeqControl],
    candidates: &[Candidate],
) -> Vec<usize> {
    let best = if candidates.is_empty() { vec![0; ctls.len()] } else { costs.choose(candidates) };
    let mut ks = Vec::with_capacity(ctls.len());
    for (pos, (ctl, b)) in ctls.iter_mut().zip(best).enumerate() {
        let seq = candidates.get(pos);
        // A draft further behind than the tokens left (a new prompt's tail before a short
        // answer) cannot pay its catch-up back: its probes wait, and the prober is not asked
        // (it would count a probe that did not run, and wait a whole gap for the next).
        let hopeless = seq.is_some_and(|c| c.behind > c.remaining);
        if b == 0 && hopeless {
            ks.push(ctl.wait());
            continue;
        }
        // A probe from plain steps costs the whole batch's step (one sequence: its own), and
        // its draft's whole catch-up.
        let priced = candidates.len() > 1;
        let probe_loss = (b == 0 && priced).then(|| costs.probe_loss(candidates, pos)).flatten();
        let alpha = seq.map_or(0.0, |c| c.alpha);
        ks.push(ctl.next_k(policy, (b, alpha), longest, costs, probe_loss));
    }
    ks
}

/// A sequence's acceptance estimate, its probing state and its current k.
#[derive(Debug, Clone)]
pub(crate) struct SeqControl {
    pub acceptance: Acceptance,
    pub prober: Prober,
    /// The latest k chosen (the grow/shrink policy's running k).
    k: usize,
    /// Whether a round of its own drafted: until then its estimate is the one it started from,
    /// and the batch's pooled estimate, which its neighbours' rounds keep teaching, is better.
    drafted: bool,
}

impl SeqControl {
    /// A fresh sequence under `policy`, starting from estimates carried over from others.
    pub fn new(policy: KPolicy, acceptance: Acceptance, prober: Prober) -> Self {
        let k = match policy {
            KPolicy::Fixed(k) | KPolicy::GrowShrink { start: k, .. } => k,
            KPolicy::Adaptive { .. } => 1,
            KPolicy::Plain => 0,
        };
        Self { acceptance, prober, k, drafted: false }
    }

    /// The latest k (before any round, the first round's).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Its acceptance estimate, or `pooled` (every sequence's, as it stands now) until a round
    /// of its own drafted.
    pub fn alpha(&self, pooled: &Acceptance) -> f64 {
        if self.drafted {
            self.acceptance.alpha()
        } else {
            pooled.alpha()
        }
    }

    /// The k of the next round: the policy's (fixed, the grow/shrink running k), or under the
    /// adaptive policy the cost model's choice `best` unless the prober measures or probes,
    /// within the longest block `max`, at the acceptance `alpha` the cost model chose from
    /// (see [`alpha`](Self::alpha)). `probe_loss`: the tokens a k = 1 probe from plain
    /// decoding loses in a batch (see [`CostModel::probe_loss`]); `None` for one sequence.
    fn next_k(
        &mut self,
        policy: KPolicy,
        (best, alpha): (usize, f64),
        max: usize,
        costs: &CostModel,
        probe_loss: Option<f64>,
    ) -> usize {
        if let KPolicy::Adaptive { .. } = policy {
            self.k = self.prober.next_k(best, max, costs, alpha, probe_loss);
        }
        self.k
    }

    /// A round in which its draft may not draft (see [`round_ks`]): k = 0, the prober not asked.
    fn wait(&mut self) -> usize {
        self.k = 0;
        0
    }

    /// Learns from a finished round: the acceptance always, the grow/shrink k, and under the
    /// adaptive policy the prober's verdict (`max_rows`: the most rows a round scores).
    pub fn observe(&mut self, policy: KPolicy, round: &RoundReport, costs: &CostModel, max_rows: usize) {
        self.acceptance.observe(round.drafted, round.accepted);
        self.drafted |= round.drafted > 0;
        match policy {
            KPolicy::Plain | KPolicy::Fixed(_) => {}
            KPolicy::GrowShrink { max, .. } => {
                if round.accepted < round.drafted {
                    self.k = self.k.saturating_sub(1).max(1);
                } else if round.drafted >= self.k && self.k < max {
                    // A block cut short (the drafter ran dry, the generation ended) says nothing
                    // about a longer one, so only a full block grows k.
                    self.k += 1;
                }
            }
            KPolicy::Adaptive { .. } => self.prober.observe(round, costs, max_rows),
        }
    }
}
