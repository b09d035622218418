//! Batched speculative decoding: several sequences, each with its own models, settings, seed,
//! stop rule and drafts, verified together in one target pass per step.
//!
//! Sequences join ([`BatchDecoder::add`]) and leave (finished ones are collected with
//! [`BatchDecoder::take_finished`]) between steps: continuous batching at the library level.
//! Each [`step`](BatchDecoder::step) drafts for every sequence with k > 0 (one batched draft
//! call per depth), scores every sequence's pending token and drafts in one
//! [`BatchTarget::forward_batch`] call, and judges each sequence with the same exact kernel as
//! the single-sequence [`SpeculativeDecoder`](crate::SpeculativeDecoder). A sequence with k = 0
//! takes a plain step. The [`BatchPolicy`] picks the k's.

mod fault;
mod policy;
mod sequence;

#[doc(hidden)]
pub use fault::Fault;
use fault::Injected;
pub use policy::BatchPolicy;
use sequence::Member;

use crate::adaptive::{Acceptance, Candidate, CostModel, Prober};
use crate::error::{Error, Result};
use crate::model::{BatchDraft, BatchTarget};
use crate::sampling::SamplingConfig;
use crate::stats::{Clock, Generation};
use crate::stop::StopRule;

/// A sequence's handle in a [`BatchDecoder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// What to generate for one sequence: the prompt, sampling settings (with their seed) and the
/// stop rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// Sampling settings, applied alike to this sequence's drafts and target rows.
    pub sampling: SamplingConfig,
    /// When this sequence ends.
    pub stop: StopRule,
    /// A fixed k for this sequence alone, whatever the batch's policy (0: plain steps).
    pub k: Option<usize>,
}

impl Request {
    /// Greedy, 128 new tokens, no stop token.
    pub fn new(prompt: Vec<u32>) -> Self {
        Self { prompt, sampling: SamplingConfig::greedy(), stop: StopRule::default(), k: None }
    }

    /// Drafts `k` tokens every step for this sequence, whatever the batch's policy.
    pub fn k(mut self, k: usize) -> Self {
        self.k = Some(k);
        self
    }

    /// Sampling settings (default greedy).
    pub fn sampling(mut self, sampling: SamplingConfig) -> Self {
        self.sampling = sampling;
        self
    }

    /// The most tokens to generate.
    pub fn max_new_tokens(mut self, n: usize) -> Self {
        self.stop.max_new_tokens = n;
        self
    }

    /// Tokens that end the sequence.
    pub fn stop_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.stop.stop_tokens = tokens.into_iter().collect();
        self
    }
}

/// A finished sequence: its generation, and its models handed back for another request.
#[derive(Debug)]
pub struct Finished<D, T> {
    /// Which sequence.
    pub id: SeqId,
    /// Its tokens, why it ended, and its statistics (times count every step it took part in).
    pub generation: Generation,
    /// Its draft model.
    pub draft: D,
    /// Its target model.
    pub target: T,
}

/// What a step spent, for the cost estimates.
struct Spent {
    /// Seconds in draft and target calls (catch-up aside).
    busy: f64,
    /// Rows those calls scored.
    rows: usize,
    /// Seconds of choosing the k's and of the drafts' catch-up: left out of the step's rate,
    /// as the single decoder leaves them out of its rounds'.
    setup: f64,
    /// For the adaptive policy, what it predicted.
    predicted: Option<Prediction>,
}

/// Whether a step drafts, and its predicted seconds.
type Prediction = (bool, f64);

/// The most rows the adaptive policy puts in one target pass (and measures T for).
pub const MAX_ROWS: usize = 128;

/// Speculative decoding of a batch of sequences; see the [module docs](self).
///
/// A failed step leaves every sequence's tokens in place and its models rolled back to them,
/// so `step` can be called again; if even the roll-back fails, `step` reports
/// [`Error::NotReady`] from then on.
///
/// # Example
/// ```
/// use specdec::batch::{BatchDecoder, BatchPolicy, Request};
/// use specdec::{toy::{MarkovModel, ToyPair}, SamplingConfig};
/// let ToyPair { target, draft } = MarkovModel::pair(16, 0.2, 7);
/// let mut batch = BatchDecoder::new(BatchPolicy::Fixed(3))?;
/// batch.add(target.clone(), draft.clone(), Request::new(vec![1, 2]).max_new_tokens(20))?;
/// let sampled = SamplingConfig::new(0.8)?.with_seed(5);
/// batch.add(target, draft, Request::new(vec![3]).sampling(sampled).max_new_tokens(10))?;
/// let done = batch.run()?;
/// assert_eq!(done.len(), 2);
/// # Ok::<(), specdec::Error>(())
/// ```
pub struct BatchDecoder<D, T> {
    seqs: Vec<Member<D, T>>,
    finished: Vec<Finished<D, T>>,
    policy: BatchPolicy,
    costs: CostModel,
    next_id: u64,
    ready: bool,
    /// The acceptance of every sequence's drafts, pooled: where a new sequence's estimate
    /// starts (for a batch of one, its own estimate carried over, as the single decoder's
    /// carries over from one generation to the next).
    pool: Acceptance,
    /// The probing state of the latest finished sequence, where a new one's starts (a draft
    /// found too slow to pay stays unprobed, as in the single decoder's next generation).
    prober: Prober,
    /// Where times are read.
    clock: Clock,
    /// A bug the tests inject (none otherwise).
    fault: Injected,
}

impl<D: BatchDraft, T: BatchTarget> BatchDecoder<D, T> {
    /// An empty batch.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for a policy out of range (see [`BatchPolicy::check`]).
    pub fn new(policy: BatchPolicy) -> Result<Self> {
        Self::with_costs(policy, CostModel::default())
    }

    /// An empty batch whose adaptive policy starts from costs measured before (say, once when
    /// a server starts, with [`CostModel::measure`]); without T(1) among them, the first
    /// adaptive step measures T(m) on its first sequence's target, which takes about as long
    /// as scoring 1,500 rows (2 s for SmolLM2-135M in f32 on 2 cores).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_costs(policy: BatchPolicy, costs: CostModel) -> Result<Self> {
        Ok(Self {
            seqs: Vec::new(),
            finished: Vec::new(),
            policy: policy.check()?,
            costs,
            next_id: 0,
            ready: true,
            pool: Acceptance::new(),
            prober: Prober::default(),
            clock: Clock::wall(),
            fault: Injected::new(None),
        })
    }

    /// Where the batch reads times (default the wall clock; see [`Clock`]): its cost
    /// estimates and the sequences' statistics. Sequences added later read it too.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Injects a batch bug, for the tests that show their statistics catch it. Not for use.
    #[doc(hidden)]
    pub fn inject_fault(&mut self, fault: Fault) {
        self.fault = Injected::new(Some(fault));
    }

    /// Adds a sequence that generates `request` with its own `target` and `draft` (target
    /// first, as [`SpeculativeDecoder::builder`](crate::SpeculativeDecoder::builder); for
    /// `Llama` (feature `models`), instances over the same shared weights as the other
    /// sequences', so that one pass serves them all). Both are reset and fed the prompt.
    ///
    /// # Errors
    /// [`Error::VocabMismatch`], bad prompts and stop tokens, model failures (the batch is
    /// unchanged).
    pub fn add(&mut self, target: T, draft: D, request: Request) -> Result<SeqId> {
        let id = SeqId(self.next_id);
        // A k of 0 is the sequence's own plain steps.
        if let Some(k) = request.k.filter(|&k| k > 0) {
            BatchPolicy::Fixed(k).check()?;
        }
        let estimates = (self.pool, self.prober.clone());
        let seq = Member::start(id, target, draft, request, estimates, self.clock.clone())?;
        self.next_id += 1;
        self.seqs.push(seq);
        self.retire();
        Ok(id)
    }

    /// Sequences still generating.
    pub fn active(&self) -> usize {
        self.seqs.len()
    }

    /// The policy that picks each sequence's k.
    pub fn policy(&self) -> BatchPolicy {
        self.policy
    }

    /// The measured costs the adaptive policy decides from.
    pub fn costs(&self) -> &CostModel {
        &self.costs
    }

    /// Takes the sequences that finished since the last call, in the order they finished.
    pub fn take_finished(&mut self) -> Vec<Finished<D, T>> {
        std::mem::take(&mut self.finished)
    }

    /// Steps until every sequence has finished and returns them all (with any finished
    /// before and not yet taken).
    ///
    /// # Errors
    /// As [`step`](Self::step).
    pub fn run(&mut self) -> Result<Vec<Finished<D, T>>> {
        while !self.seqs.is_empty() {
            self.step()?;
        }
        Ok(self.take_finished())
    }

    /// One step for every active sequence. Returns each sequence's new tokens (finished
    /// sequences move to [`take_finished`](Self::take_finished)). Under the adaptive policy the
    /// steps measure T(m) as they go, as the single decoder's rounds do (so a batch of one
    /// chooses its k's as [`SpeculativeDecoder`](crate::SpeculativeDecoder) would), unless
    /// [`calibrate`](Self::calibrate) or [`with_costs`](Self::with_costs) gave it T(m) first;
    /// until a draft call has been timed each sequence drafts one token.
    ///
    /// # Errors
    /// [`Error::NotReady`] after a failed roll-back; model failures (see the type's docs).
    pub fn step(&mut self) -> Result<Vec<(SeqId, Vec<u32>)>> {
        if !self.ready {
            return Err(Error::NotReady("a failed step could not roll the models back"));
        }
        let before: Vec<usize> = self.seqs.iter().map(|s| s.seq.ctx().len()).collect();
        let start = self.clock.seconds();
        let spent = match self.round() {
            Ok(spent) => spent,
            Err(e) => {
                self.ready = self.seqs.iter_mut().all(|s| s.seq.resync());
                return Err(e);
            }
        };
        let secs = self.clock.seconds() - start;
        self.costs.observe_other(spent.rows, secs - spent.busy - spent.setup);
        if let Some((drafting, predicted)) = spent.predicted {
            self.costs.observe_outcome(drafting, predicted, secs - spent.setup);
        }
        let new = self
            .seqs
            .iter_mut()
            .zip(before)
            .map(|(s, n)| {
                s.seq.stats.decode_secs += secs;
                (s.id, s.seq.ctx()[n..].to_vec())
            })
            .collect();
        self.retire();
        Ok(new)
    }

    /// Moves finished sequences to the finished list.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.seqs.len() {
            match self.seqs[i].seq.finish() {
                Some(_) => {
                    let s = self.seqs.remove(i);
                    self.prober = s.prober.clone();
                    self.finished.push(s.into_finished());
                }
                None => i += 1,
            }
        }
    }

    /// Chooses the k's, drafts, verifies in one pass and judges every sequence.
    fn round(&mut self) -> Result<Spent> {
        let start = self.clock.seconds();
        let (ks, predicted) = self.choose_ks()?;
        let choosing = self.clock.seconds() - start;
        let catch_up = self.catch_up(&ks)?;
        let (mut busy, mut scored) = (0.0, 0);
        let depth = ks.iter().copied().max().unwrap_or(0);
        for s in &mut self.seqs {
            s.new_block();
        }
        for j in 0..depth {
            let drafts_now = |i: usize, s: &Member<D, T>| ks[i] > j && s.drafting;
            let active: Vec<usize> = (0..self.seqs.len()).filter(|&i| drafts_now(i, &self.seqs[i])).collect();
            if active.is_empty() {
                break;
            }
            let start = self.clock.seconds();
            let proposals = {
                let mut drafts: Vec<&mut D> = Vec::with_capacity(active.len());
                let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(active.len());
                for (_, s) in self.seqs.iter_mut().enumerate().filter(|(i, s)| drafts_now(*i, s)) {
                    feeds.push(s.seq.draft_feed()?.to_vec());
                    drafts.push(&mut s.seq.draft);
                }
                let feeds: Vec<&[u32]> = feeds.iter().map(Vec::as_slice).collect();
                D::propose_batch(&mut drafts, &feeds)?
            };
            let secs = self.clock.seconds() - start;
            self.costs.observe_draft(active.len(), secs);
            (busy, scored) = (busy + secs, scored + active.len());
            for (&i, proposal) in active.iter().zip(proposals) {
                let s = &mut self.seqs[i];
                self.fault.swap_rng(&mut s.seq.rng);
                let taken = s.take_proposal(proposal, secs);
                self.fault.swap_rng(&mut s.seq.rng);
                taken?;
            }
        }
        self.fault.stale_q(&mut self.seqs);
        let start = self.clock.seconds();
        let logits = {
            let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(self.seqs.len());
            let mut targets: Vec<&mut T> = Vec::with_capacity(self.seqs.len());
            for s in &mut self.seqs {
                feeds.push(s.seq.target_feed()?);
                targets.push(&mut s.seq.target);
            }
            let calls: Vec<(&[u32], usize)> = feeds.iter().map(|f| (f.as_slice(), f.len())).collect();
            T::forward_batch(&mut targets, &calls)?
        };
        let secs = self.clock.seconds() - start;
        let rows: usize = logits.iter().map(|l| l.rows()).sum();
        self.costs.observe_target(rows, secs);
        let n = self.seqs.len();
        // The adaptive policy's probes learn from each round, as the single decoder's do.
        let probing_rows = match self.policy {
            BatchPolicy::Adaptive { max_k } => Some(max_k.min(self.rows_cap()) + 1),
            _ => None,
        };
        if logits.len() != n {
            return Err(Error::BadModelOutput {
                model: "target",
                what: "batched calls",
                expected: n,
                got: logits.len(),
            });
        }
        for (i, rows) in logits.iter().enumerate() {
            let s = &mut self.seqs[i];
            self.fault.swap_rng(&mut s.seq.rng);
            let probing = probing_rows.filter(|_| s.fixed_k.is_none()).map(|rows| (&self.costs, rows));
            let judged = s.judge(rows, secs, probing);
            self.fault.swap_rng(&mut s.seq.rng);
            let (k, accepted, keep) = judged?;
            self.seqs[self.fault.roll_back_slot(i, n)].seq.roll_back_to(keep)?;
            // Every round, plain ones too (they fade the counts), as each sequence's estimate.
            self.pool.observe(k, accepted);
        }
        Ok(Spent { busy: busy + secs, rows: scored + rows, setup: choosing + catch_up, predicted })
    }

    /// The longest block a sequence may draft under the adaptive policy: the most rows
    /// measured bounds the step's rows.
    fn rows_cap(&self) -> usize {
        (MAX_ROWS / self.seqs.len().max(1)).saturating_sub(1)
    }

    /// Each sequence's k for this step, by the policy (never past its last token), and for the
    /// adaptive policy whether the step drafts and its predicted seconds (catch-up
    /// left out).
    fn choose_ks(&mut self) -> Result<(Vec<usize>, Option<Prediction>)> {
        let limits: Vec<usize> = self.seqs.iter().map(|s| s.seq.remaining().saturating_sub(1)).collect();
        let mut candidates = Vec::new();
        let chosen = match self.policy {
            BatchPolicy::Plain => vec![0; self.seqs.len()],
            BatchPolicy::Fixed(k) => limits.iter().map(|&l| k.min(l)).collect(),
            BatchPolicy::Adaptive { max_k } => {
                let longest = max_k.min(self.rows_cap());
                for (s, &limit) in self.seqs.iter().zip(&limits) {
                    let missed = s.seq.draft_missed()?.len();
                    let behind = if missed > 2 { missed - 1 } else { 0 };
                    let limit = limit.min(longest);
                    candidates.push(Candidate { alpha: s.alpha(), limit, behind, remaining: s.seq.remaining() });
                }
                // The cost model's best k's for the whole batch, then each sequence's probes by
                // the single decoder's rules (see `adaptive::Prober`): until a draft call has
                // been timed, one drafted token; then a neighbour now and then, or spaced k = 1
                // probes while it decodes plainly.
                let best = self.costs.choose(&candidates);
                (self.seqs.iter_mut().zip(&candidates).zip(best))
                    .map(|((s, c), k)| s.prober.next_k(k, longest, &self.costs, c.alpha))
                    .collect()
            }
        };
        // Sequences with a k of their own keep it; then each draft may adjust its block, as
        // in the single decoder (see `DraftModel::block_len`), within the policy's longest.
        let longest = match self.policy {
            BatchPolicy::Plain => 0,
            BatchPolicy::Fixed(k) => k,
            BatchPolicy::Adaptive { max_k } => max_k.min(self.rows_cap()),
        };
        let ks: Vec<usize> = (self.seqs.iter_mut().zip(chosen).zip(limits))
            .map(|((s, k), limit)| {
                let (k, max) = s.fixed_k.map_or((k, longest), |own| (own.min(limit), own));
                if k > 0 {
                    s.seq.block_len(k, max).min(limit)
                } else {
                    0
                }
            })
            .collect();
        candidates.iter_mut().for_each(|c| c.behind = 0);
        let predicted = match candidates.is_empty() {
            true => None,
            false => self.costs.step_secs(&candidates, &ks).map(|p| (ks.iter().any(|&k| k > 0), p)),
        };
        Ok((ks, predicted))
    }

    /// Measures T(m) on the first sequence's target when the costs lack it (see
    /// [`CostModel::measure`]: about as long as scoring 1,500 rows, 2 s for SmolLM2-135M in f32
    /// on 2 cores), so that the adaptive policy knows the cost of the larger passes of a large
    /// batch before it first meets them; without it (or [`with_costs`](Self::with_costs)) the
    /// steps learn T(m) from their own passes. Call it after the first [`add`](Self::add).
    /// Does nothing without a sequence or when T(1) is known. Draft costs are learned from the
    /// draft calls themselves.
    ///
    /// # Errors
    /// A target that fails to roll back after a timed pass.
    pub fn calibrate(&mut self) -> Result<()> {
        let Some(s) = self.seqs.first_mut() else { return Ok(()) };
        if !self.costs.has_target(1) {
            let token = s.seq.ctx()[s.seq.ctx().len() - 1];
            self.costs.merge(CostModel::measure(&mut s.seq.target, token, MAX_ROWS)?);
        }
        Ok(())
    }

    /// Feeds the drafts of the sequences about to draft, in one batched call, all but the last
    /// of the tokens they missed while they decoded plainly (see the single decoder's
    /// catch-up); their proposals are not used. Each counts the call, with its share of the
    /// time, in its draft calls and seconds (as the single decoder counts its catch-up).
    fn catch_up(&mut self, ks: &[usize]) -> Result<f64> {
        let mut drafts: Vec<&mut D> = Vec::new();
        let mut feeds: Vec<&[u32]> = Vec::new();
        let mut caught = Vec::new();
        for (i, (s, _)) in self.seqs.iter_mut().zip(ks).enumerate().filter(|(_, (_, &k))| k > 0) {
            let (draft, missed) = s.seq.draft_with_missed()?;
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
        for &i in &caught {
            let stats = &mut self.seqs[i].seq.stats;
            stats.draft_calls += 1;
            stats.draft_secs += secs / caught.len() as f64;
        }
        Ok(secs)
    }
}

impl<D, T> std::fmt::Debug for BatchDecoder<D, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchDecoder")
            .field("active", &self.seqs.len())
            .field("finished", &self.finished.len())
            .field("policy", &self.policy)
            .field("costs", &self.costs)
            .finish()
    }
}
