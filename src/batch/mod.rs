//! Batched speculative decoding: several sequences, each with its own models, settings, seed,
//! stop rule and drafts, verified together in one target pass per step.
//!
//! Sequences join ([`BatchDecoder::add`]) and leave (finished ones are collected with
//! [`BatchDecoder::take_finished`]) between steps: continuous batching at the library level.
//! Each [`step`](BatchDecoder::step) drafts for every sequence with k > 0 (one batched draft
//! call per depth), scores every sequence's pending token and drafts in one
//! [`TargetModel::forward_batch`] call, and judges each sequence with the same exact kernel as
//! the single-sequence [`SpeculativeDecoder`](crate::SpeculativeDecoder): both run the one round
//! driver. A sequence with k = 0 takes a plain step. The [`KPolicy`] picks the k's.

use std::ops::ControlFlow;

use crate::adaptive::{CostModel, KPolicy, Prober, TreePolicy};
#[cfg(feature = "fault-injection")]
pub use crate::decoder::Fault;
use crate::decoder::{Driver, Member, Start};
pub use crate::decoder::{SeqId, MAX_ROWS};
use crate::error::{Error, Result};
use crate::model::{DraftModel, TargetModel};
use crate::pair::Pair;
use crate::prefix::PrefixCache;
use crate::sampling::SamplingConfig;
use crate::stats::{Clock, Generation, TokenLogprob};
use crate::stop::StopRule;

/// What to generate for one sequence: the prompt, sampling settings (with their seed) and the
/// stop rule.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Request {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// Sampling settings, applied alike to this sequence's drafts and target rows.
    pub sampling: SamplingConfig,
    /// When this sequence ends.
    pub stop: StopRule,
    /// This sequence's own rounds, whatever the batch's policy: [`KPolicy::Fixed`] or
    /// [`KPolicy::Plain`] (`None`: the batch's policy).
    pub k: Option<KPolicy>,
    /// Chains or trees for this sequence (default chains only; see [`TreePolicy`]).
    pub tree: TreePolicy,
}

impl Request {
    /// Greedy, 128 new tokens, no stop token.
    pub fn new(prompt: Vec<u32>) -> Self {
        Self { prompt, sampling: SamplingConfig::greedy(), stop: StopRule::default(), k: None, tree: TreePolicy::Never }
    }

    /// Whether this sequence's rounds draft trees (see [`TreePolicy`]): a sequence whose
    /// chooser picks a tree runs its own tree round, the others are batched.
    pub fn tree(mut self, policy: TreePolicy) -> Self {
        self.tree = policy;
        self
    }

    /// Drafts `k` tokens every step for this sequence, whatever the batch's policy
    /// (`KPolicy::Fixed(k)`; see [`plain`](Self::plain) for none).
    pub fn k(mut self, k: usize) -> Self {
        self.k = Some(KPolicy::Fixed(k));
        self
    }

    /// Plain steps for this sequence (no drafts), whatever the batch's policy.
    pub fn plain(mut self) -> Self {
        self.k = Some(KPolicy::Plain);
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
#[non_exhaustive]
pub struct Finished<T, D> {
    /// Which sequence.
    pub id: SeqId,
    /// Its tokens, why it ended, and its statistics (times count every step it took part in).
    pub generation: Generation,
    /// Its target model.
    pub target: T,
    /// Its draft model.
    pub draft: D,
}

/// Speculative decoding of a batch of sequences; see the [module docs](self).
///
/// A failed step leaves every sequence's tokens in place and its models rolled back to them,
/// so `step` can be called again; if even the roll-back fails, `step` reports
/// [`Error::NotReady`] from then on.
///
/// # Example
/// ```
/// use specdec::batch::{BatchDecoder, Request};
/// use specdec::KPolicy;
/// use specdec::{toy::MarkovModel, SamplingConfig};
/// let pair = MarkovModel::pair(16, 0.2, 7);
/// let mut batch = BatchDecoder::new(KPolicy::Fixed(3))?;
/// batch.add(pair.clone(), Request::new(vec![1, 2]).max_new_tokens(20))?;
/// let sampled = SamplingConfig::new(0.8)?.with_seed(5);
/// batch.add(pair, Request::new(vec![3]).sampling(sampled).max_new_tokens(10))?;
/// let done = batch.run()?;
/// assert_eq!(done.len(), 2);
/// # Ok::<(), specdec::Error>(())
/// ```
pub struct BatchDecoder<T, D> {
    /// The round driver, with the sequences still generating.
    driver: Driver<T, D>,
    finished: Vec<Finished<T, D>>,
    next_id: u64,
    /// The probing state of the latest finished sequence, where a new one's starts (a draft
    /// found too slow to pay stays unprobed, as in the single decoder's next generation).
    prober: Prober,
    /// The prefix cache the sequences start from and leave their contexts in.
    prefix: Option<PrefixCache>,
    /// The most prompt tokens prefilled in one step (`None`: a sequence is prefilled whole
    /// when it is added).
    prefill_chunk: Option<usize>,
}

impl<T: TargetModel, D: DraftModel> BatchDecoder<T, D> {
    /// An empty batch.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for a policy out of range (see [`KPolicy::check`]).
    pub fn new(policy: KPolicy) -> Result<Self> {
        Self::with_costs(policy, CostModel::default())
    }

    /// An empty batch whose adaptive policy starts from costs measured before (say, once when
    /// a server starts, with [`CostModel::measure`]); without T(1) among them, the first
    /// adaptive step measures T(m) on its first sequence's target, which takes about as long
    /// as scoring 1,500 rows.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_costs(policy: KPolicy, costs: CostModel) -> Result<Self> {
        let driver = Driver::new(policy.check()?, costs, Clock::wall());
        Ok(Self {
            driver,
            finished: Vec::new(),
            next_id: 0,
            prober: Prober::default(),
            prefix: None,
            prefill_chunk: None,
        })
    }

    /// Where the batch reads times (default the wall clock; see [`Clock`]): its cost
    /// estimates and the sequences' statistics. Sequences added later read it too.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.driver.clock = clock;
        self
    }

    /// Starts each sequence from the longest prefix of its prompt that `cache` holds (the
    /// states of both its models, copied into them) and leaves each finished or cancelled
    /// sequence's context (prompt and output) there, so that a request that resends a
    /// conversation prefills only what is new. The tokens are the same with and without it
    /// (see [`PrefixCache`]).
    pub fn with_prefix_cache(mut self, cache: PrefixCache) -> Self {
        self.prefix = Some(cache);
        self
    }

    /// Prefills new sequences in chunks: each [`step`](Self::step) first feeds at most
    /// `tokens` prompt tokens (to the sequences still prefilling, oldest first, their drafts
    /// along), so that a long prompt joining costs the running sequences a little more per
    /// step rather than one long stall (while no sequence decodes, prompts are prefilled
    /// whole). A sequence takes part in rounds once its prompt is
    /// in. Without it (the default), [`add`](Self::add) prefills the whole prompt. The
    /// tokens are the same either way.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for 0 tokens.
    pub fn with_prefill_chunk(mut self, tokens: usize) -> Result<Self> {
        if tokens == 0 {
            return Err(Error::setting("prefill chunk", 0, "at least 1 token"));
        }
        self.prefill_chunk = Some(tokens);
        Ok(self)
    }

    /// The prefix cache, if the batch has one.
    pub fn prefix_cache(&self) -> Option<&PrefixCache> {
        self.prefix.as_ref()
    }

    /// Injects a batch bug, for the tests that show their statistics catch it (feature
    /// `fault-injection`, test-only).
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&mut self, fault: Fault) {
        self.driver.fault = crate::decoder::Injected::new(Some(fault));
    }

    /// Adds a sequence that generates `request` with its own target and draft (for
    /// `Llama` (feature `models`), instances over the same shared weights as the other
    /// sequences', so that one pass serves them all). Both are reset and the target is fed the
    /// prompt; the draft catches up on it (in one batched call with the others) the first time
    /// it drafts. Its estimates start from the batch's.
    ///
    /// # Errors
    /// [`Error::VocabMismatch`], bad prompts and stop tokens, model failures (the batch is
    /// unchanged).
    pub fn add(&mut self, pair: Pair<T, D>, request: Request) -> Result<SeqId> {
        let Pair { target, draft } = pair;
        let id = SeqId(self.next_id);
        let fixed_k = match request.k.map(KPolicy::check).transpose()? {
            None => None,
            Some(KPolicy::Plain) => Some(0),
            Some(KPolicy::Fixed(k)) => Some(k),
            Some(other) => return Err(Error::setting("request k", other, "KPolicy::Fixed(k) or KPolicy::Plain")),
        };
        let start = Start {
            sampling: request.sampling,
            stop: request.stop,
            fixed_k,
            policy: self.driver.policy,
            tree: request.tree,
            estimates: (self.driver.pool, self.prober.clone()),
            clock: self.driver.clock.clone(),
        };
        let mut m = Member::new(id, target, draft, start);
        m.seq.check()?;
        m.seq.prefix = self.prefix.clone();
        // Each request is one generation: coupled noise is that of generation 0 of its seed.
        m.seq.begin(&request.prompt)?;
        if self.prefill_chunk.is_none() {
            // The draft catches up in one batched call with the others when it first drafts.
            m.seq.prefill(usize::MAX, false)?;
        }
        self.next_id += 1;
        self.driver.members.push(m);
        self.retire();
        Ok(id)
    }

    /// Sequences still generating.
    pub fn active(&self) -> usize {
        self.driver.members.len()
    }

    /// The policy that picks each sequence's k.
    pub fn policy(&self) -> KPolicy {
        self.driver.policy
    }

    /// The measured costs the adaptive policy decides from.
    pub fn costs(&self) -> &CostModel {
        &self.driver.costs
    }

    /// Merges costs measured elsewhere (say, when a server starts) into the ones the adaptive
    /// policy decides from; those it learns in its steps follow on from them.
    pub fn learn_costs(&mut self, costs: CostModel) {
        self.driver.costs.merge(costs);
    }

    /// The acceptance of every sequence's drafts, pooled (where a new sequence's estimate
    /// starts), less the adaptive policy's round that times the draft (one token, which would
    /// move it for every sequence that has not drafted).
    pub fn alpha(&self) -> f64 {
        self.driver.pool.alpha()
    }

    /// Takes the sequences that finished since the last call, in the order they finished.
    pub fn take_finished(&mut self) -> Vec<Finished<T, D>> {
        std::mem::take(&mut self.finished)
    }

    /// Stops sequence `id` between steps and hands it back with the tokens it has (its
    /// [`FinishReason`](crate::FinishReason) is `Cancelled`); the others go on untouched.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when no running sequence has that id.
    pub fn cancel(&mut self, id: SeqId) -> Result<Finished<T, D>> {
        let Some(i) = self.driver.members.iter().position(|m| m.id == id) else {
            return Err(Error::setting("sequence", id.0, "a running sequence of this batch"));
        };
        let mut m = self.driver.members.remove(i);
        m.seq.cancel();
        m.seq.save_prefix();
        Ok(finished(m))
    }

    /// Removes sequence `id` as [`cancel`](Self::cancel) does, but leaves nothing of it in the
    /// prefix cache: for a sequence whose step failed, whose models may hold a broken state.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when no running sequence has that id.
    pub fn discard(&mut self, id: SeqId) -> Result<Finished<T, D>> {
        let Some(i) = self.driver.members.iter().position(|m| m.id == id) else {
            return Err(Error::setting("sequence", id.0, "a running sequence of this batch"));
        };
        let mut m = self.driver.members.remove(i);
        m.seq.cancel();
        m.seq.prefix = None;
        Ok(finished(m))
    }

    /// Steps until every sequence has finished and returns them all (with any finished
    /// before and not yet taken).
    ///
    /// # Errors
    /// As [`step`](Self::step).
    pub fn run(&mut self) -> Result<Vec<Finished<T, D>>> {
        self.run_with(|_, _| ControlFlow::Continue(()))
    }

    /// Like [`run`](Self::run), calling `on_tokens` with each sequence's new tokens after each
    /// step; `ControlFlow::Break(())` cancels that sequence (see [`cancel`](Self::cancel)).
    ///
    /// # Errors
    /// As [`step`](Self::step).
    pub fn run_with(
        &mut self,
        mut on_tokens: impl FnMut(SeqId, &[u32]) -> ControlFlow<()>,
    ) -> Result<Vec<Finished<T, D>>> {
        while !self.driver.members.is_empty() {
            let mut stop = Vec::new();
            for (id, tokens) in self.step()? {
                if on_tokens(id, &tokens).is_break() {
                    stop.push(id);
                }
            }
            for id in stop {
                // A sequence that finished in this very step is already in the finished list.
                if let Ok(f) = self.cancel(id) {
                    self.finished.push(f);
                }
            }
        }
        Ok(self.take_finished())
    }

    /// One step for every active sequence. Returns each sequence's new tokens (finished
    /// sequences move to [`take_finished`](Self::take_finished)). Under the adaptive policy the
    /// steps measure T(m) as they go, unless [`calibrate`](Self::calibrate) or
    /// [`with_costs`](Self::with_costs) gave it T(m) first; until a draft call has been timed
    /// one sequence (the one whose draft has least to catch up on) drafts one token to time it
    /// while the others step plainly ([`CostModel::warm`](crate::adaptive::CostModel::warm) and
    /// [`learn_costs`](Self::learn_costs) spare that step). A batch of one runs exactly the rounds of a
    /// [`SpeculativeDecoder`](crate::SpeculativeDecoder) (the same driver).
    ///
    /// # Errors
    /// [`Error::NotReady`] after a failed roll-back; model failures. A failed step leaves every
    /// sequence's tokens in place and its models rolled back to them, so `step` can be called
    /// again.
    pub fn step(&mut self) -> Result<Vec<(SeqId, Vec<u32>)>> {
        let before: Vec<usize> = self.driver.members.iter().map(|m| m.seq.ctx().len()).collect();
        // Chunks only while some sequence decodes: alone, a prompt is prefilled whole.
        let decoding = self.driver.members.iter().any(|m| !m.seq.prefilling());
        let mut budget = self.prefill_chunk.filter(|_| decoding).unwrap_or(usize::MAX);
        for m in self.driver.members.iter_mut().filter(|m| m.seq.prefilling()) {
            // While others decode, the draft is fed along (a whole prompt's catch-up would stall
            // them); otherwise it catches up when the k policy, which prices that, drafts.
            budget -= m.seq.prefill(budget, decoding)?;
            if budget == 0 {
                break;
            }
        }
        self.driver.step()?;
        let new = (self.driver.members.iter().zip(before)).map(|(m, n)| (m.id, m.seq.ctx()[n..].to_vec())).collect();
        self.retire();
        Ok(new)
    }

    /// One step for sequence `id` alone, the others waiting untouched: what a server does after
    /// a failed [`step`](Self::step) to find the sequence that failed (see the `serve` module).
    /// Returns its new tokens. A panic in the step reaches the caller as from `step`, with the
    /// other sequences kept.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when no running sequence has that id; as [`step`](Self::step).
    pub fn step_alone(&mut self, id: SeqId) -> Result<Vec<u32>> {
        let Some(i) = self.driver.members.iter().position(|m| m.id == id) else {
            return Err(Error::setting("sequence", id.0, "a running sequence of this batch"));
        };
        // After a step that unwound, the others are rolled back now: the alone step that
        // follows would roll back only this one.
        self.driver.resync();
        if self.driver.members[i].seq.prefilling() {
            let budget = self.prefill_chunk.unwrap_or(usize::MAX);
            return self.driver.members[i].seq.prefill(budget, true).map(|_| Vec::new());
        }
        let mut others = std::mem::take(&mut self.driver.members);
        self.driver.members.push(others.remove(i));
        let before = self.driver.members[0].seq.ctx().len();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.driver.step()));
        let new = self.driver.members.first().map_or(Vec::new(), |m| m.seq.ctx()[before..].to_vec());
        others.insert(i.min(others.len()), self.driver.members.pop().expect("the sequence stepped"));
        self.driver.members = others;
        let result = result.unwrap_or_else(|payload| std::panic::resume_unwind(payload));
        self.retire();
        result.map(|()| new)
    }

    /// The log-probabilities so far of sequence `id`, running or finished and not yet taken
    /// (one per token, when its sampling settings ask for them; empty otherwise).
    pub fn logprobs(&self, id: SeqId) -> Option<&[TokenLogprob]> {
        match self.driver.members.iter().find(|m| m.id == id) {
            Some(m) => Some(m.seq.logprobs()),
            None => self.finished.iter().find(|f| f.id == id).map(|f| f.generation.logprobs.as_slice()),
        }
    }

    /// The statistics so far of running sequence `id`.
    pub fn stats(&self, id: SeqId) -> Option<&crate::stats::Stats> {
        self.driver.members.iter().find(|m| m.id == id).map(|m| &m.seq.stats)
    }

    /// Moves finished sequences to the finished list.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.driver.members.len() {
            match self.driver.members[i].seq.finish() {
                Some(_) => {
                    let mut m = self.driver.members.remove(i);
                    m.seq.save_prefix();
                    self.prober = m.ctl.prober.clone();
                    self.finished.push(finished(m));
                }
                None => i += 1,
            }
        }
    }

    /// Measures T(m) on the first sequence's target when the costs lack it (see
    /// [`CostModel::measure`]: about as long as scoring 1,500 rows), so that the adaptive
    /// policy knows the cost of the larger passes of a large batch before it first meets them;
    /// without it (or [`with_costs`](Self::with_costs)) the steps learn T(m) from their own
    /// passes. Call it after the first [`add`](Self::add). Does nothing without a sequence or
    /// when T(1) is known. Draft costs are learned from the draft calls themselves.
    ///
    /// # Errors
    /// A target that fails to roll back after a timed pass.
    pub fn calibrate(&mut self) -> Result<()> {
        let Some(m) = self.driver.members.first_mut() else { return Ok(()) };
        if !self.driver.costs.has_target(1) {
            let token = m.seq.ctx()[m.seq.ctx().len() - 1];
            self.driver.costs.merge(CostModel::measure(&mut m.seq.target, token, MAX_ROWS)?);
        }
        Ok(())
    }
}

/// A member's generation and models.
fn finished<T: TargetModel, D: DraftModel>(m: Member<T, D>) -> Finished<T, D> {
    Finished { id: m.id, generation: m.seq.generation(), target: m.seq.target, draft: m.seq.draft }
}

impl<T, D> std::fmt::Debug for BatchDecoder<T, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchDecoder")
            .field("active", &self.driver.members.len())
            .field("finished", &self.finished.len())
            .field("policy", &self.driver.policy)
            .field("costs", &self.driver.costs)
            .finish()
    }
}
