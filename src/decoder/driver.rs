//! The round driver: the one round function every decoder runs. The single decoder is a batch
//! of one, the plain decoder a batch of one under [`KPolicy::Plain`], and the
//! [`BatchDecoder`](crate::BatchDecoder) a batch of many.
//!
//! A round, for every unfinished sequence: a sequence whose chain-or-tree chooser picks a tree
//! runs its own tree round; the others choose their k's (the policy, the cost model for the
//! whole batch, each sequence's probes), catch their drafts up in one batched call, draft one
//! batched call per depth, are scored in one batched target pass, and are judged, kept and
//! rolled back each on its own with the exact kernel.

use super::member::Member;
use super::Injected;
use crate::adaptive::{round_ks, Acceptance, Candidate, CostModel, KPolicy, SeqControl};
use crate::error::{Error, Result};
use crate::model::{DraftModel, TargetModel};
use crate::stats::Clock;

/// The most rows the adaptive policy puts in one target pass (and measures T for).
pub const MAX_ROWS: usize = 128;

/// Whether a step drafts, and its predicted seconds.
type Prediction = (bool, f64);

pub(crate) struct Driver<T, D> {
    pub members: Vec<Member<T, D>>,
    pub policy: KPolicy,
    pub costs: CostModel,
    /// Every sequence's acceptance, pooled: where a new sequence's estimate starts.
    pub pool: Acceptance,
    /// Where times are read.
    pub clock: Clock,
    /// False after a failed round whose roll-back failed too.
    pub ready: bool,
    /// A bug the tests inject (none otherwise).
    pub fault: Injected,
}

impl<T: TargetModel, D: DraftModel> Driver<T, D> {
    /// A driver with no sequence yet, for a `policy` already checked.
    pub fn new(policy: KPolicy, costs: CostModel, clock: Clock) -> Self {
        let (pool, fault) = (Acceptance::new(), Injected::new(None));
        Self { members: Vec::new(), policy, costs, pool, clock, ready: true, fault }
    }

    /// One round for every unfinished sequence. Each sequence's step time is added to its
    /// statistics. A failed round rolls every sequence back to the tokens it kept; so does the
    /// next step after a round that unwound (a panic the caller caught).
    ///
    /// # Errors
    /// [`Error::NotReady`] while a roll-back fails; model failures.
    pub fn step(&mut self) -> Result<()> {
        if !self.resync() {
            return Err(Error::NotReady("a failed round could not roll the models back"));
        }
        // False until the round returns: a round that unwinds leaves it so.
        self.ready = false;
        let running: Vec<bool> = self.members.iter().map(|m| m.seq.finish().is_none() && !m.seq.prefilling()).collect();
        let start = self.clock.seconds();
        let result = self.round();
        let secs = self.clock.seconds() - start;
        for (m, _) in self.members.iter_mut().zip(running).filter(|(_, r)| *r) {
            let stats = &mut m.seq.stats;
            stats.decode_secs += secs;
            if stats.first_token_secs == 0.0 && stats.new_tokens > 0 {
                stats.first_token_secs = stats.prefill_secs + stats.decode_secs;
            }
        }
        self.ready = result.is_ok();
        self.resync();
        result
    }

    /// After a failed or unwound round, rolls every sequence back to the tokens it kept (each
    /// one, even after one that fails). True when all hold exactly those.
    pub fn resync(&mut self) -> bool {
        if !self.ready {
            let synced: Vec<bool> = self.members.iter_mut().map(|m| m.seq.resync()).collect();
            self.ready = synced.iter().all(|&ok| ok);
        }
        self.ready
    }

    /// Tree rounds for the sequences that pick one, then one chain round for the rest.
    fn round(&mut self) -> Result<()> {
        let mut chains = Vec::with_capacity(self.members.len());
        for i in 0..self.members.len() {
            let m = &mut self.members[i];
            // A sequence still prefilling (in chunks, see `BatchDecoder`) waits.
            if m.seq.prefilling() {
                continue;
            }
            if m.seq.finish().is_none() {
                m.seq.fast_forward()?;
            }
            if m.seq.finish().is_some() {
                continue;
            }
            let remaining = m.seq.remaining();
            match m.shape.next(!m.ctl.prober.stopped()) {
                Some(budget) if remaining > 1 => {
                    let start = self.clock.seconds();
                    let verdict = m.seq.tree_round(budget.at_most_deep(remaining - 1))?;
                    m.seq.keep(&verdict.tokens);
                    m.shape.observe(true, verdict.tokens.len(), self.clock.seconds() - start);
                }
                _ => chains.push(i),
            }
        }
        if chains.is_empty() {
            return Ok(());
        }
        self.chain_round(&chains)
    }

    /// One chain round for the sequences `idx`: choose the k's, catch the drafts up, draft
    /// depth by depth, score every block in one target pass, judge, keep and roll back.
    fn chain_round(&mut self, idx: &[usize]) -> Result<()> {
        let start = self.clock.seconds();
        // The adaptive policy's first drafting round times the draft (see `one_measures`).
        let timing = matches!(self.policy, KPolicy::Adaptive { .. }) && !self.costs.has_any_draft();
        let (ks, predicted) = self.choose_ks(idx, timing)?;
        let choosing = self.clock.seconds() - start;
        let catch_up = self.catch_up(idx, &ks)?;
        let busy = self.draft(idx, &ks)?;
        let (target_secs, rows, emitted) = self.verify(idx, timing)?;
        let secs = self.clock.seconds() - start;
        let setup = choosing + catch_up;
        self.costs.observe_other(busy.1 + rows, secs - busy.0 - target_secs - setup);
        if let Some((drafting, predicted)) = predicted {
            self.costs.observe_outcome(drafting, predicted, secs - setup);
        }
        for (&i, tokens) in idx.iter().zip(emitted) {
            self.members[i].shape.observe(false, tokens, secs);
        }
        Ok(())
    }

    /// Drafts the blocks, one batched draft call per depth. Returns the seconds and the rows
    /// of those calls.
    fn draft(&mut self, idx: &[usize], ks: &[usize]) -> Result<(f64, usize)> {
        for &i in idx {
            self.members[i].new_block();
        }
        let (mut busy, mut scored) = (0.0, 0);
        let depth = ks.iter().copied().max().unwrap_or(0);
        for j in 0..depth {
            // Tokens the processors force need no draft call.
            for (&i, &k) in idx.iter().zip(ks) {
                let m = &mut self.members[i];
                if k > j && m.drafting && m.seq.force_block(k)? {
                    m.drafting = false;
                }
            }
            let active: Vec<usize> = idx
                .iter()
                .zip(ks)
                .filter(|&(&i, &k)| k > self.members[i].seq.block.tokens().len() && self.members[i].drafting)
                .map(|(&i, _)| i)
                .collect();
            if active.is_empty() {
                break;
            }
            let start = self.clock.seconds();
            let proposals = {
                let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(active.len());
                for &i in &active {
                    feeds.push(self.members[i].seq.draft_feed()?);
                }
                let mut drafts: Vec<&mut D> = Vec::with_capacity(active.len());
                for (i, m) in self.members.iter_mut().enumerate() {
                    if active.contains(&i) {
                        drafts.push(&mut m.seq.draft);
                    }
                }
                let feeds: Vec<&[u32]> = feeds.iter().map(Vec::as_slice).collect();
                D::propose_batch(&mut drafts, &feeds)?
            };
            let secs = self.clock.seconds() - start;
            self.costs.observe_draft(active.len(), secs);
            (busy, scored) = (busy + secs, scored + active.len());
            for (&i, proposal) in active.iter().zip(proposals) {
                let m = &mut self.members[i];
                self.fault.swap_rng(&mut m.seq.rng);
                let taken = m.take_proposal(proposal, secs);
                self.fault.swap_rng(&mut m.seq.rng);
                taken?;
            }
        }
        Ok((busy, scored))
    }

    /// Scores every block in one target pass, then judges, keeps and rolls back each sequence.
    /// Returns the pass's seconds and rows, and the tokens each sequence emitted.
    fn verify(&mut self, idx: &[usize], timing: bool) -> Result<(f64, usize, Vec<usize>)> {
        self.fault.stale_q(&mut self.members);
        let start = self.clock.seconds();
        let logits = {
            let mut feeds: Vec<(Vec<u32>, usize)> = Vec::with_capacity(idx.len());
            for &i in idx {
                feeds.push(self.members[i].seq.target_feed()?);
            }
            let mut targets: Vec<&mut T> = Vec::with_capacity(idx.len());
            for (i, m) in self.members.iter_mut().enumerate() {
                if idx.contains(&i) {
                    targets.push(&mut m.seq.target);
                }
            }
            let calls: Vec<(&[u32], usize)> = feeds.iter().map(|(f, rows)| (f.as_slice(), *rows)).collect();
            T::forward_batch(&mut targets, &calls)?
        };
        let secs = self.clock.seconds() - start;
        if logits.len() != idx.len() {
            return Err(Error::BadModelOutput {
                model: "target",
                what: "batched calls",
                expected: idx.len(),
                got: logits.len(),
            });
        }
        let rows: usize = logits.iter().map(|l| l.rows()).sum();
        self.costs.observe_target(rows, secs);
        let max_rows = self.longest(idx.len()) + 1;
        let n = self.members.len();
        let mut emitted = Vec::with_capacity(idx.len());
        for (&i, rows) in idx.iter().zip(&logits) {
            let m = &mut self.members[i];
            self.fault.swap_rng(&mut m.seq.rng);
            let judged = m.judge(rows, secs, self.policy, &self.costs, max_rows);
            self.fault.swap_rng(&mut m.seq.rng);
            let (round, tokens, keep) = judged?;
            self.members[self.fault.roll_back_slot(i, n)].seq.roll_back_to(keep)?;
            // Every round, plain ones too (they fade the counts); but not the round that
            // times the draft (see `one_measures`): its one token, an answer's first, in one
            // sequence, would move the estimate of every sequence that has not drafted yet
            // from the prior's 0.8 to 0.87 or 0.53 (on the simulated clock of
            // tests/batch_chooser.rs, the worst of 16 sampled worlds went from 0.934 to 0.971
            // of the best policy without it). The sequence's own estimate counts it.
            if !timing {
                self.pool.observe(round.drafted, round.accepted);
            }
            emitted.push(tokens);
        }
        Ok((secs, rows, emitted))
    }

    /// The longest block a sequence may draft in a round of `seqs` sequences: the policy's,
    /// and under the adaptive policy no more than the most rows measured allow.
    fn longest(&self, seqs: usize) -> usize {
        match self.policy {
            KPolicy::Adaptive { max } => max.min((MAX_ROWS / seqs.max(1)).saturating_sub(1)),
            policy => policy.max(),
        }
    }

    /// Each sequence's k for this round, by the policy (never past its last token), and for the
    /// adaptive policy whether the round drafts and its predicted seconds (catch-up left out).
    fn choose_ks(&mut self, idx: &[usize], timing: bool) -> Result<(Vec<usize>, Option<Prediction>)> {
        let limits: Vec<usize> = idx.iter().map(|&i| self.members[i].seq.remaining().saturating_sub(1)).collect();
        let longest = self.longest(idx.len());
        let mut candidates = Vec::new();
        if let KPolicy::Adaptive { .. } = self.policy {
            for (&i, &limit) in idx.iter().zip(&limits) {
                let m = &self.members[i];
                let missed = m.seq.draft_missed()?.len();
                let behind = if missed > 2 { missed - 1 } else { 0 };
                let (alpha, remaining) = (m.ctl.alpha(&self.pool), m.seq.remaining());
                candidates.push(Candidate { alpha, limit: limit.min(longest), behind, remaining });
            }
        }
        // The cost model's best k's for the whole batch (adaptive), then each sequence's own
        // rule: its probes (see `adaptive::Prober`), its grow/shrink k, or the fixed k.
        // `idx` ascends, so the members it names come in its order.
        let members = self.members.iter_mut().enumerate().filter(|(i, _)| idx.contains(i));
        let mut ctls: Vec<&mut SeqControl> = members.map(|(_, m)| &mut m.ctl).collect();
        let policy_ks = round_ks(self.policy, &self.costs, longest, &mut ctls, &candidates);
        let mut ks = Vec::with_capacity(idx.len());
        for ((&i, k), limit) in idx.iter().zip(policy_ks).zip(limits) {
            let m = &mut self.members[i];
            // A request's own k beats the policy's; then the draft may adjust its block (see
            // `DraftModel::block_len`) within the longest allowed.
            let (k, max) = m.fixed_k.map_or((k, longest), |own| (own, own));
            ks.push(if k > 0 { m.seq.block_len(k.min(limit), max).min(limit) } else { 0 });
        }
        if timing {
            self.one_measures(idx, &candidates, &mut ks);
        }
        candidates.iter_mut().for_each(|c| c.behind = 0);
        let predicted = match candidates.is_empty() {
            true => None,
            false => self.costs.step_secs(&candidates, &ks).map(|p| (ks.iter().any(|&k| k > 0), p)),
        };
        Ok((ks, predicted))
    }

    /// Until a draft call is timed, every sequence's prober asks for one drafted token to time
    /// one (see `adaptive::Prober`); in a batch one sequence measures for all, the one whose
    /// draft has least to catch up on, and the others step plainly: at 8 sequences, each
    /// draft catching up on its prompt to be measured cost 17 % of a 64-token run
    /// (docs/perf/batch.md). A request's own k stands.
    fn one_measures(&self, idx: &[usize], candidates: &[Candidate], ks: &mut [usize]) {
        let own = |pos: usize| self.members[idx[pos]].fixed_k.is_some();
        let asking = (0..ks.len()).filter(|&pos| ks[pos] > 0 && !own(pos));
        let Some(first) = asking.min_by_key(|&pos| candidates[pos].behind) else { return };
        for (pos, k) in ks.iter_mut().enumerate() {
            if pos != first && !own(pos) {
                *k = 0;
            }
        }
    }

    /// Feeds the drafts of the sequences about to draft, in one batched call, all but the last
    /// of the tokens they missed while they decoded plainly (or since their prompt); their
    /// proposals are not used. Each counts the call, with its share of the time, in its draft
    /// calls and seconds. Returns the call's seconds.
    fn catch_up(&mut self, idx: &[usize], ks: &[usize]) -> Result<f64> {
        let mut drafts: Vec<&mut D> = Vec::new();
        let mut feeds: Vec<&[u32]> = Vec::new();
        let mut caught = Vec::new();
        for (i, m) in self.members.iter_mut().enumerate() {
            let Some(pos) = idx.iter().position(|&j| j == i) else { continue };
            if ks[pos] == 0 {
                continue;
            }
            let (draft, missed) = m.seq.draft_with_missed()?;
            if missed.len() > 2 {
                feeds.push(&missed[..missed.len() - 1]);
                drafts.push(draft);
                caught.push(i);
            }
        }
        let start = self.clock.seconds();
        if !drafts.is_empty() {
            D::propose_batch(&mut drafts, &feeds)?;
        }
        let secs = self.clock.seconds() - start;
        // Timed like any draft call, so that the next catch-up is priced by what one costs
        // (a long one is compute-bound, past the line through the drafting calls' few rows).
        if !caught.is_empty() {
            self.costs.observe_draft(feeds.iter().map(|f| f.len()).sum(), secs);
        }
        for &i in &caught {
            let stats = &mut self.members[i].seq.stats;
            stats.draft_calls += 1;
            stats.draft_secs += secs / caught.len() as f64;
        }
        Ok(secs)
    }
}
