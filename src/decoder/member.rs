//! One sequence under the driver: the sequence engine ([`Sequence`]) with what the driver keeps
//! per sequence: its id, its share of the k policy ([`SeqControl`]), its chain-or-tree chooser
//! and its own k if its request fixed one.

use super::Sequence;
use crate::adaptive::{Acceptance, CostModel, KPolicy, Prober, RoundReport, SeqControl, ShapeChooser, TreePolicy};
use crate::error::Result;
use crate::model::{DraftModel, Logits, Proposal, TargetModel};
use crate::sampling::SamplingConfig;
use crate::stats::Clock;
use crate::stop::StopRule;

/// A sequence's handle in a [`BatchDecoder`](crate::BatchDecoder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// What a sequence starts with: its settings, and the estimates it carries over.
pub(crate) struct Start {
    pub sampling: SamplingConfig,
    pub stop: StopRule,
    pub fixed_k: Option<usize>,
    pub policy: KPolicy,
    pub tree: TreePolicy,
    pub estimates: (Acceptance, Prober),
    pub clock: Clock,
}

pub(crate) struct Member<T, D> {
    pub id: SeqId,
    /// The generation, with its models and settings.
    pub seq: Sequence<D, T>,
    /// Its acceptance estimate, probing state and running k.
    pub ctl: SeqControl,
    /// Chains or trees, round by round.
    pub shape: ShapeChooser,
    /// The request's own k, if it has one.
    pub fixed_k: Option<usize>,
    /// Its draft calls, draft seconds and target seconds before this round.
    before: (usize, f64, f64),
    /// False once the drafter has nothing more to propose this round.
    pub drafting: bool,
}

impl<T: TargetModel, D: DraftModel> Member<T, D> {
    /// A sequence of `target` and `draft`, not yet started nor checked (see
    /// [`Sequence::check`]).
    pub fn new(id: SeqId, target: T, draft: D, s: Start) -> Self {
        let tree = s.tree;
        let seq = Sequence::new(target, draft, s.sampling, s.stop, s.clock);
        let (acceptance, prober) = s.estimates;
        let ctl = SeqControl::new(s.policy, acceptance, prober);
        let shape = ShapeChooser::new(tree);
        Self { id, seq, ctl, shape, fixed_k: s.fixed_k, before: (0, 0.0, 0.0), drafting: true }
    }

    /// Starts a new chain block.
    pub fn new_block(&mut self) {
        self.seq.new_block();
        self.drafting = true;
        let stats = &self.seq.stats;
        self.before = (stats.draft_calls, stats.draft_secs, stats.target_secs);
    }

    /// Turns the draft's proposal into the block's next token; a draft that proposes nothing
    /// stops drafting for this round.
    pub fn take_proposal(&mut self, proposal: Proposal, secs: f64) -> Result<()> {
        self.drafting = self.seq.take_proposal(proposal, secs)?;
        Ok(())
    }

    /// Judges the block against the target's rows, keeps the verdict's tokens (up to a stop)
    /// and lets the k policy learn from the round (`max_rows`: the most rows a round scores).
    /// Returns the round's report, the tokens it emitted and the context length both models
    /// must be rolled back to.
    pub fn judge(
        &mut self,
        logits: &Logits,
        secs: f64,
        policy: KPolicy,
        costs: &CostModel,
        max_rows: usize,
    ) -> Result<(RoundReport, usize, usize)> {
        let (k, n) = (self.seq.block.tokens().len(), self.seq.ctx().len());
        let verdict = self.seq.judge(logits, secs)?;
        let stats = &self.seq.stats;
        let round = RoundReport {
            drafted: k,
            accepted: verdict.accepted,
            draft_calls: stats.draft_calls - self.before.0,
            draft_secs: stats.draft_secs - self.before.1,
            target_rows: k + 1,
            target_secs: stats.target_secs - self.before.2,
        };
        // A request's own k is not the policy's: its rounds teach the acceptance alone.
        let policy = if self.fixed_k.is_some() { KPolicy::Plain } else { policy };
        self.ctl.observe(policy, &round, costs, max_rows);
        self.seq.keep(&verdict.tokens);
        Ok((round, verdict.tokens.len(), n + verdict.accepted))
    }
}
