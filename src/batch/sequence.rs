//! One sequence of a batch: the sequence engine ([`Sequence`], the same one the
//! single-sequence decoder runs) with the batch's bookkeeping: its id, its acceptance estimate
//! and probing state (the single decoder's rules), and its own k if the request fixed one.

use super::{Finished, Request, SeqId};
use crate::adaptive::{Acceptance, CostModel, Prober, RoundReport};
use crate::decoder::Sequence;
use crate::error::Result;
use crate::model::{DraftModel, Logits, Proposal, TargetModel};
use crate::stats::Clock;

pub(super) struct Member<D, T> {
    pub id: SeqId,
    /// The generation, with its models and settings.
    pub seq: Sequence<D, T>,
    /// How often its drafts are accepted.
    pub acceptance: Acceptance,
    /// When the adaptive policy probes other k's for it (as the single decoder does).
    pub prober: Prober,
    /// Its draft calls, draft seconds and target seconds before this step.
    before: (usize, f64, f64),
    /// False once the drafter has nothing more to propose this step.
    pub drafting: bool,
    /// The request's own k, if it has one.
    pub fixed_k: Option<usize>,
}

impl<D: DraftModel, T: TargetModel> Member<D, T> {
    /// Checks the request, resets both models and feeds the target all but the prompt's last
    /// token. The draft catches up on the prompt (in one batched call with the others) the first
    /// time it drafts, so a sequence that never drafts never feeds it. Its acceptance estimate
    /// and probing state start as given (the batch's).
    pub fn start(
        id: SeqId,
        target: T,
        draft: D,
        r: Request,
        (acceptance, prober): (Acceptance, Prober),
        clock: Clock,
    ) -> Result<Self> {
        let mut seq = Sequence::new(target, draft, r.sampling, r.stop, clock);
        seq.check()?;
        // Each request is one generation: coupled noise is that of generation 0 of its seed.
        seq.start(&r.prompt, false)?;
        Ok(Self { id, seq, acceptance, prober, before: (0, 0.0, 0.0), drafting: true, fixed_k: r.k })
    }

    /// The estimated chance that a drafted position is accepted.
    pub fn alpha(&self) -> f64 {
        self.acceptance.alpha()
    }

    /// Starts a new block.
    pub fn new_block(&mut self) {
        self.seq.new_block();
        self.drafting = true;
        let stats = &self.seq.stats;
        self.before = (stats.draft_calls, stats.draft_secs, stats.target_secs);
    }

    /// Turns the draft's proposal into the block's next token; a draft that proposes nothing
    /// stops drafting for this step.
    pub fn take_proposal(&mut self, proposal: Proposal, secs: f64) -> Result<()> {
        self.drafting = self.seq.take_proposal(proposal, secs)?;
        Ok(())
    }

    /// Judges the block against the target's rows, keeps the verdict's tokens (up to a stop)
    /// and updates the acceptance estimate and, under the adaptive policy (`probing`: the
    /// batch's costs and the most rows it measures), the probing state, as the single
    /// decoder's controller does. Returns the round's (drafted, accepted) and the context
    /// length both models must be rolled back to.
    pub fn judge(
        &mut self,
        logits: &Logits,
        secs: f64,
        probing: Option<(&CostModel, usize)>,
    ) -> Result<(usize, usize, usize)> {
        let (k, n) = (self.seq.block.tokens().len(), self.seq.ctx().len());
        let verdict = self.seq.judge(logits, secs)?;
        self.acceptance.observe(k, verdict.accepted);
        if let Some((costs, max_rows)) = probing {
            let stats = &self.seq.stats;
            let round = RoundReport {
                drafted: k,
                accepted: verdict.accepted,
                draft_calls: stats.draft_calls - self.before.0,
                draft_secs: stats.draft_secs - self.before.1,
                target_rows: k + 1,
                target_secs: stats.target_secs - self.before.2,
            };
            self.prober.observe(&round, costs, max_rows);
        }
        self.seq.keep(&verdict.tokens);
        Ok((k, verdict.accepted, n + verdict.accepted))
    }

    pub fn into_finished(self) -> Finished<D, T> {
        Finished { id: self.id, generation: self.seq.generation(), draft: self.seq.draft, target: self.seq.target }
    }
}
