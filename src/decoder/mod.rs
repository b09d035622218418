//! The speculative decoding loop: draft k tokens, verify them in one target call, keep the
//! accepted prefix plus one token, roll both models back, repeat. [`SpeculativeDecoder`] is a
//! batch of one under the round driver (`driver.rs`), the one round function every decoder
//! runs.

mod block;
mod driver;
mod fault;
mod member;
mod sequence;
mod tree;

pub(crate) use block::ChainBlock;
pub(crate) use driver::Driver;
pub use driver::MAX_ROWS;
#[cfg(feature = "fault-injection")]
pub use fault::Fault;
pub(crate) use fault::Injected;
pub use member::SeqId;
pub(crate) use member::{Member, Start};
pub(crate) use sequence::{NoDraft, Sequence};

use std::ops::ControlFlow;

use crate::adaptive::{Acceptance, CostModel, KPolicy, Prober, ShapeChooser, TreePolicy};
use crate::error::{Error, Result};
use crate::model::{DraftModel, TargetModel};
use crate::pair::Pair;
use crate::prefix::PrefixCache;
use crate::sampling::SamplingConfig;
use crate::stats::{Clock, FinishReason, Generation, Stats, TokenLogprob};
use crate::stop::StopRule;

/// Builds a [`SpeculativeDecoder`]; see [`SpeculativeDecoder::builder`].
pub struct DecoderBuilder<T, D> {
    target: T,
    draft: D,
    policy: KPolicy,
    tree: TreePolicy,
    sampling: SamplingConfig,
    stop: StopRule,
    clock: Clock,
    seed: Option<u64>,
    prefix: Option<PrefixCache>,
}

impl<T: TargetModel, D: DraftModel> DecoderBuilder<T, D> {
    /// Whether rounds draft trees of candidates rather than one chain (default: chains only;
    /// see [`TreePolicy`]). The target scores a tree in one call through
    /// [`TargetModel::forward_tree`] and the tree is judged exactly
    /// ([`verify_tree`](crate::kernel::verify_tree)); the draft proposes it through
    /// [`DraftModel::propose_tree`].
    pub fn tree(mut self, policy: TreePolicy) -> Self {
        self.tree = policy;
        self
    }

    /// Drafts `k` tokens every round: shorthand for `k_policy(KPolicy::Fixed(k))`. The default
    /// is adaptive (see [`KPolicy::default`]); a fixed k makes sampled output reproducible from
    /// the seed, but is slower than plain decoding where the draft turns out costly.
    pub fn k(mut self, k: usize) -> Self {
        self.policy = KPolicy::Fixed(k);
        self
    }

    /// How k is chosen each round: fixed, adaptive to the measured acceptance and costs (the
    /// default, up to 8), or grown and shrunk with the blocks (see [`KPolicy`]).
    pub fn k_policy(mut self, policy: KPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sampling settings, applied alike to draft and target (default greedy). Their seed is
    /// used unless [`seed`](Self::seed) sets one, before or after.
    pub fn sampling(mut self, sampling: SamplingConfig) -> Self {
        self.sampling = sampling;
        self
    }

    /// The seed of the random number generator (overrides the sampling settings' seed,
    /// whichever is set last).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The most tokens one generation produces (default 128).
    pub fn max_new_tokens(mut self, n: usize) -> Self {
        self.stop.max_new_tokens = n;
        self
    }

    /// Tokens that end a generation, such as end-of-sequence.
    pub fn stop_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.stop.stop_tokens = tokens.into_iter().collect();
        self
    }

    /// Where times are read (default the wall clock). The adaptive k and the tree/chain choice
    /// weigh the times measured on it; a [`Clock::manual`] that the models advance makes
    /// their choices, and so sampled output, reproducible.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Starts each generation from the longest prefix of its prompt that `cache` holds (both
    /// models' states) and leaves each generation's context there when the next starts or
    /// [`generate`](SpeculativeDecoder::generate) returns (see [`PrefixCache`]). The output
    /// is the same with and without it, token for token.
    pub fn prefix_cache(mut self, cache: PrefixCache) -> Self {
        self.prefix = Some(cache);
        self
    }

    /// Checks the settings and the model pair.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for k = 0 or a k policy out of range (see [`KPolicy::check`]),
    /// [`Error::VocabMismatch`] when the models disagree, [`Error::TokenOutOfRange`] for a stop
    /// token outside the vocabulary.
    pub fn build(self) -> Result<SpeculativeDecoder<T, D>> {
        let sampling = match self.seed {
            Some(seed) => self.sampling.with_seed(seed),
            None => self.sampling,
        };
        let mut driver = Driver::new(self.policy.check()?, CostModel::default(), self.clock.clone());
        let start = Start {
            sampling,
            stop: self.stop,
            fixed_k: None,
            policy: self.policy,
            tree: self.tree,
            estimates: (Acceptance::new(), Prober::default()),
            clock: self.clock,
        };
        let mut member = Member::new(SeqId(0), self.target, self.draft, start);
        member.seq.check()?;
        member.seq.prefix = self.prefix;
        driver.members.push(member);
        Ok(SpeculativeDecoder { driver, started: false })
    }
}

/// Exact speculative decoding of `target` with proposals from `draft`.
///
/// Use [`generate`](Self::generate) for a whole generation, [`generate_with`](Self::generate_with)
/// to stream tokens as they are accepted, or [`start`](Self::start) and [`step`](Self::step) to
/// drive it round by round. The random number generator carries on from one generation to the
/// next; with a fixed k (`.k(n)`), a decoder built with the same seed repeats the same sequence
/// of generations. Under the default [`KPolicy::Adaptive`], k follows the measured times, and
/// with random sampling the draws follow k, so only greedy output is reproducible; with
/// [`SamplingConfig::coupled`] the text depends on the seed alone (generation n of a decoder
/// equals generation n of a [`PlainDecoder`](crate::PlainDecoder) with the same settings). The k
/// controller, too, carries what it learned from one generation to the next (its estimates,
/// and whether it stopped probing a draft too slow to pay; see [`KController`](crate::KController)).
///
/// A failed step leaves the tokens produced so far in place and both models rolled back to
/// them, so `step` can be called again; if even the roll-back fails, `step` reports
/// [`Error::NotReady`] until the next `start`.
pub struct SpeculativeDecoder<T, D> {
    /// A batch of one: its member persists from one generation to the next (models, random
    /// number generator, estimates).
    driver: Driver<T, D>,
    /// Whether a generation was started (and its prompt fed).
    started: bool,
}

impl<T: TargetModel, D: DraftModel> SpeculativeDecoder<T, D> {
    /// Starts a builder for `pair.target`, the model whose distribution the output follows, and
    /// `pair.draft`, the model that proposes,
    /// with adaptive k (up to 8, down to plain decoding when drafting does not pay), greedy
    /// sampling, 128 new tokens and no stop token.
    ///
    /// # Example
    /// ```
    /// use specdec::{toy::MarkovModel, SpeculativeDecoder};
    /// let mut dec = SpeculativeDecoder::builder(MarkovModel::pair(16, 0.2, 7)).k(3).max_new_tokens(20).build()?;
    /// assert_eq!(dec.generate(&[1, 2])?.tokens.len(), 20);
    /// # Ok::<(), specdec::Error>(())
    /// ```
    pub fn builder(pair: Pair<T, D>) -> DecoderBuilder<T, D> {
        let Pair { target, draft } = pair;
        DecoderBuilder {
            draft,
            target,
            policy: KPolicy::default(),
            tree: TreePolicy::default(),
            sampling: SamplingConfig::greedy(),
            stop: StopRule::default(),
            clock: Clock::wall(),
            seed: None,
            prefix: None,
        }
    }

    /// Generates from `prompt` until a stop token or `max_new_tokens`.
    ///
    /// # Errors
    /// Bad prompts ([`Error::EmptyPrompt`], [`Error::TokenOutOfRange`]) and model failures.
    pub fn generate(&mut self, prompt: &[u32]) -> Result<Generation> {
        self.generate_with(prompt, |_| ControlFlow::Continue(()))
    }

    /// Like [`generate`](Self::generate), calling `on_tokens` with each run of newly accepted
    /// tokens; `ControlFlow::Break(())` from it stops the generation there (its
    /// [`FinishReason`] is then `Cancelled`). For text, feed the tokens to a
    /// `TextStream` (feature `llama`), which holds back incomplete characters.
    ///
    /// # Errors
    /// As [`generate`](Self::generate).
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        mut on_tokens: impl FnMut(&[u32]) -> ControlFlow<()>,
    ) -> Result<Generation> {
        self.start(prompt)?;
        while self.finish_reason().is_none() {
            if on_tokens(self.step()?).is_break() {
                self.member_mut().seq.cancel();
            }
        }
        self.member_mut().seq.save_prefix();
        Ok(self.member().seq.generation())
    }

    /// Resets both models and feeds them the prompt (all but its last token, which the first
    /// round feeds along with the drafts).
    ///
    /// # Errors
    /// Bad prompts and model failures.
    pub fn start(&mut self, prompt: &[u32]) -> Result<()> {
        self.started = false;
        // A draft the policy has given up on is not fed the prompt: it is not expected to
        // draft again, and if it does, its first round catches up on the whole context.
        let plain = self.driver.policy == KPolicy::Plain;
        let m = self.member_mut();
        let prefill_draft = !m.ctl.prober.stopped() && !plain;
        m.seq.start(prompt, prefill_draft)?;
        (self.started, self.driver.ready) = (true, true);
        Ok(())
    }

    /// Runs one round and returns the tokens it added (empty once the generation is finished).
    ///
    /// # Errors
    /// [`Error::NotReady`] before `start` or while a roll-back fails; model failures.
    pub fn step(&mut self) -> Result<&[u32]> {
        if !self.started {
            return Err(Error::NotReady("no generation in progress"));
        }
        let before = self.member().seq.ctx().len();
        self.driver.step()?;
        Ok(&self.member().seq.ctx()[before..])
    }

    /// Sets the length limit of the next generations.
    pub fn set_max_new_tokens(&mut self, n: usize) {
        self.member_mut().seq.stop.max_new_tokens = n;
    }

    /// Replaces the sampling settings for the next generation (a request's own temperature,
    /// penalties or grammar) and reseeds the random number generator with their seed.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for a token the settings name outside the vocabulary.
    pub fn set_sampling(&mut self, sampling: SamplingConfig) -> Result<()> {
        self.member_mut().seq.set_sampling(sampling)
    }

    /// Stops the current generation where it stands (its [`FinishReason`] becomes
    /// `Cancelled`); the next [`start`](Self::start) begins a new one.
    pub fn cancel(&mut self) {
        self.member_mut().seq.cancel();
    }

    /// The tokens generated so far in the current generation.
    pub fn generated(&self) -> &[u32] {
        self.member().seq.generated()
    }

    /// Why the current generation finished, if it has.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.member().seq.finish()
    }

    /// The log-probabilities of the tokens generated so far, one per token, when the sampling
    /// settings ask for them ([`SamplingConfig::with_logprobs`]); empty otherwise.
    pub fn logprobs(&self) -> &[TokenLogprob] {
        self.member().seq.logprobs()
    }

    /// Counters and timings of the current generation.
    pub fn stats(&self) -> &Stats {
        &self.member().seq.stats
    }

    /// The k the latest round asked for (before any round, the k the first will ask for); a
    /// round drafts fewer when the drafter runs dry or the generation is about to end.
    pub fn k(&self) -> usize {
        self.member().ctl.k()
    }

    /// The policy that chooses k.
    pub fn k_policy(&self) -> KPolicy {
        self.driver.policy
    }

    /// The estimated chance that a drafted position is accepted (the prior 0.8 before any
    /// drafting).
    pub fn alpha(&self) -> f64 {
        self.member().ctl.acceptance.alpha()
    }

    /// Whether the adaptive policy has stopped probing a draft too slow to pay whatever its
    /// acceptance (see [`KController`](crate::KController)); it then decodes plainly.
    pub fn stopped_probing(&self) -> bool {
        self.member().ctl.prober.stopped()
    }

    /// The measured costs the adaptive policy decides from.
    pub fn costs(&self) -> &CostModel {
        &self.driver.costs
    }

    /// What chooses between chain and tree rounds, with what it measured.
    pub fn shape_chooser(&self) -> &ShapeChooser {
        &self.member().shape
    }

    /// The target model.
    pub fn target(&self) -> &T {
        &self.member().seq.target
    }

    /// The draft model.
    pub fn draft(&self) -> &D {
        &self.member().seq.draft
    }

    /// The draft, to change between generations (say, to give a suffix drafter another
    /// cache); the next [`start`](Self::start) resets its context.
    pub fn draft_mut(&mut self) -> &mut D {
        &mut self.member_mut().seq.draft
    }

    /// Gives the models back: the target, then the draft.
    pub fn into_parts(mut self) -> (T, D) {
        let m = self.driver.members.swap_remove(0);
        (m.seq.target, m.seq.draft)
    }

    fn member(&self) -> &Member<T, D> {
        &self.driver.members[0]
    }

    fn member_mut(&mut self) -> &mut Member<T, D> {
        &mut self.driver.members[0]
    }
}
