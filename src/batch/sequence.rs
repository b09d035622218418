//! One sequence of a batch: its models, context, settings, random number generator, the
//! block it is drafting, and its acceptance estimate.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{Finished, Request, SeqId};
use crate::decoder::{roll_back, ChainBlock};
use crate::error::{Error, Result};
use crate::model::{DraftModel, Logits, Proposal, TargetModel};
use crate::sampling::SamplingConfig;
use crate::stats::{FinishReason, Generation, Stats};
use crate::stop::{check_prompt, pending, StopRule};

/// How much of the last rounds' acceptance counts stays each round (older rounds fade).
const KEEP: f64 = 0.95;
/// Positions' worth of the prior an estimate starts from (it fades like the counts).
const PRIOR_WEIGHT: f64 = 8.0;
/// How far an estimate moves toward its prior in a step without drafting (half-way in about
/// 70 steps).
pub(super) const RELAX: f64 = 0.01;

/// An estimate of the chance that a drafted position is accepted: faded counts of accepted
/// and judged positions, starting from a prior.
#[derive(Debug, Clone, Copy)]
pub(super) struct Acceptance {
    accepted: f64,
    judged: f64,
}

impl Acceptance {
    /// An estimate that starts at `alpha`.
    pub fn prior(alpha: f64) -> Self {
        Self { accepted: alpha * PRIOR_WEIGHT, judged: PRIOR_WEIGHT }
    }

    /// The estimate.
    pub fn alpha(&self) -> f64 {
        self.accepted / self.judged
    }

    /// Moves the estimate a step of `RELAX` toward `alpha`, keeping its weight: what a
    /// sequence that did not draft does each step, so that an estimate a few unlucky rounds
    /// pulled down is tried again in time rather than never.
    pub fn relax(&mut self, alpha: f64) {
        self.accepted += RELAX * (alpha * self.judged - self.accepted);
    }

    /// Counts a round that drafted `k` tokens (k > 0) and kept `accepted` of them: positions
    /// up to the first rejection were judged.
    pub fn observe(&mut self, k: usize, accepted: usize) {
        self.accepted = KEEP * self.accepted + accepted as f64;
        self.judged = KEEP * self.judged + (accepted + 1).min(k) as f64;
    }
}

pub(super) struct Sequence<D, T> {
    pub id: SeqId,
    pub draft: D,
    pub target: T,
    pub ctx: Vec<u32>,
    prompt_len: usize,
    sampling: SamplingConfig,
    stop: StopRule,
    pub rng: StdRng,
    pub stats: Stats,
    pub finish: Option<FinishReason>,
    /// How often its drafts are accepted.
    pub acceptance: Acceptance,
    /// The block being drafted.
    pub block: ChainBlock,
    /// False once the drafter has nothing more to propose this step.
    pub drafting: bool,
    /// The request's own k, if it has one.
    pub fixed_k: Option<usize>,
}

impl<D: DraftModel, T: TargetModel> Sequence<D, T> {
    /// Checks the request, resets both models and feeds the target all but the prompt's last
    /// token. The draft catches up on the prompt (in one batched call with the others) the first
    /// time it drafts, so a sequence that never drafts never feeds it.
    pub fn start(id: SeqId, mut draft: D, mut target: T, r: Request, prior: f64) -> Result<Self> {
        let vocab = target.vocab_size();
        if draft.vocab_size() != vocab {
            return Err(Error::VocabMismatch { draft: draft.vocab_size(), target: vocab });
        }
        check_prompt(&r.prompt, vocab)?;
        r.stop.check(vocab)?;
        let mut stats = Stats::default();
        let start = std::time::Instant::now();
        target.truncate(0)?;
        draft.truncate(0)?;
        let head = &r.prompt[..r.prompt.len() - 1];
        if !head.is_empty() {
            target.forward(head, 0)?;
        }
        stats.prefill_secs = start.elapsed().as_secs_f64();
        Ok(Self {
            id,
            draft,
            target,
            finish: r.stop.finish(&[]),
            prompt_len: r.prompt.len(),
            ctx: r.prompt,
            rng: StdRng::seed_from_u64(r.sampling.seed()),
            sampling: r.sampling,
            stop: r.stop,
            stats,
            acceptance: Acceptance::prior(prior),
            block: ChainBlock::default(),
            drafting: true,
            fixed_k: r.k,
        })
    }

    /// Tokens left before `max_new_tokens` (at least 1 while active).
    pub fn remaining(&self) -> usize {
        self.stop.max_new_tokens.saturating_sub(self.ctx.len() - self.prompt_len)
    }

    /// The estimated chance that a drafted position is accepted.
    pub fn alpha(&self) -> f64 {
        self.acceptance.alpha()
    }

    /// Starts a new block.
    pub fn new_block(&mut self) {
        // Each request is one generation: coupled noise is that of generation 0 of its seed.
        self.block.clear(self.ctx.len(), self.sampling.noise(0));
        self.drafting = true;
    }

    /// What the draft is fed next: the tokens it has not seen, or the last drafted token.
    pub fn draft_feed(&self) -> Result<Vec<u32>> {
        Ok(match self.block.tokens().last() {
            Some(&t) => vec![t],
            None => pending(&self.ctx, self.draft.context_len(), "draft")?.to_vec(),
        })
    }

    /// What the target scores: the pending token, then the drafts.
    pub fn target_feed(&self) -> Result<Vec<u32>> {
        let mut feed = pending(&self.ctx, self.target.context_len(), "target")?.to_vec();
        feed.extend_from_slice(self.block.tokens());
        Ok(feed)
    }

    /// Turns the draft's proposal into the block's next token (see [`ChainBlock::push`]);
    /// a draft that proposes nothing stops drafting for this step.
    pub fn take_proposal(&mut self, proposal: Proposal, secs: f64) -> Result<()> {
        self.stats.draft_calls += 1;
        self.stats.draft_secs += secs;
        let vocab = self.target.vocab_size();
        self.drafting = self.block.push(proposal, &self.sampling, vocab, &mut self.rng)?;
        Ok(())
    }

    /// Judges the block against the target's rows, keeps the verdict's tokens (up to a stop)
    /// and updates the acceptance estimate (a round without drafts relaxes it toward `prior`).
    /// Returns the round's (drafted, accepted) and the context length both models must be
    /// rolled back to ([`roll_back_to`](Self::roll_back_to)).
    pub fn judge(&mut self, logits: &Logits, secs: f64, prior: f64) -> Result<(usize, usize, usize)> {
        self.stats.target_calls += 1;
        self.stats.target_secs += secs;
        let (k, vocab) = (self.block.tokens().len(), self.target.vocab_size());
        let verdict = self.block.judge(logits, &self.sampling, vocab, &mut self.rng)?;
        let (n, accepted) = (self.ctx.len(), verdict.accepted);
        self.stats.record_round(k, accepted);
        if k > 0 {
            self.acceptance.observe(k, accepted);
        } else {
            self.acceptance.relax(prior);
        }
        for t in verdict.tokens {
            self.ctx.push(t);
            self.stats.new_tokens += 1;
            self.finish = self.stop.finish(&self.ctx[self.prompt_len..]);
            if self.finish.is_some() {
                break;
            }
        }
        Ok((k, accepted, n + accepted))
    }

    /// Rolls both models back to `keep` tokens after a round: the accepted prefix (the last
    /// emitted token is fed next round).
    pub fn roll_back_to(&mut self, keep: usize) -> Result<()> {
        self.target.truncate(keep)?;
        if self.draft.context_len() > keep {
            self.draft.truncate(keep)?;
        }
        Ok(())
    }

    /// After a failure, rolls both models back to the tokens kept so far; false if that fails.
    pub fn resync(&mut self) -> bool {
        roll_back(self.ctx.len() - 1, &mut self.draft, &mut self.target)
    }

    pub fn into_finished(self) -> Finished<D, T> {
        Finished {
            id: self.id,
            generation: Generation {
                tokens: self.ctx[self.prompt_len..].to_vec(),
                finish: self.finish.unwrap_or(FinishReason::Length),
                stats: self.stats,
            },
            draft: self.draft,
            target: self.target,
        }
    }
}
