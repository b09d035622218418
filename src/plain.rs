//! Plain autoregressive decoding of a [`TargetModel`]: one target call per token, the baseline
//! every speedup is measured against.

use std::ops::ControlFlow;

use crate::adaptive::{Acceptance, CostModel, KPolicy, Prober, TreePolicy};
use crate::decoder::{Driver, Member, NoDraft, SeqId, Start};
use crate::error::Result;
use crate::model::TargetModel;
use crate::prefix::PrefixCache;
use crate::sampling::SamplingConfig;
use crate::stats::{Clock, FinishReason, Generation, TokenLogprob};
use crate::stop::StopRule;

/// Samples one token per target call with the given settings: the round driver under
/// [`KPolicy::Plain`], with a draft that never proposes.
///
/// # Example
/// ```
/// use specdec::{toy::{MarkovModel, ToyPair}, PlainDecoder, SamplingConfig};
/// let ToyPair { target, .. } = MarkovModel::pair(16, 0.2, 7);
/// let mut plain = PlainDecoder::new(target, SamplingConfig::greedy()).max_new_tokens(10);
/// assert_eq!(plain.generate(&[1, 2])?.tokens.len(), 10);
/// # Ok::<(), specdec::Error>(())
/// ```
pub struct PlainDecoder<T> {
    /// A batch of one under the plain policy.
    driver: Driver<T, NoDraft>,
    /// Whether a generation was started (and its prompt fed).
    started: bool,
}

impl<T: TargetModel> PlainDecoder<T> {
    /// A decoder with 128 new tokens and no stop token.
    pub fn new(target: T, sampling: SamplingConfig) -> Self {
        let draft = NoDraft { vocab: target.vocab_size() };
        let start = Start {
            sampling,
            stop: StopRule::default(),
            fixed_k: None,
            policy: KPolicy::Plain,
            tree: TreePolicy::Never,
            estimates: (Acceptance::new(), Prober::default()),
            clock: Clock::wall(),
        };
        let mut driver = Driver::new(KPolicy::Plain, CostModel::default(), Clock::wall());
        driver.members.push(Member::new(SeqId(0), target, draft, start));
        Self { driver, started: false }
    }

    /// Where the reported times are read (default the wall clock; see [`Clock`]).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.driver.clock = clock.clone();
        self.member_mut().seq.clock = clock;
        self
    }

    /// Starts each generation from the longest prefix of its prompt that `cache` holds and
    /// leaves its context there when it ends (see [`PrefixCache`]); the output is the same.
    pub fn prefix_cache(mut self, cache: PrefixCache) -> Self {
        self.member_mut().seq.prefix = Some(cache);
        self
    }

    /// The most tokens one generation produces.
    pub fn max_new_tokens(mut self, n: usize) -> Self {
        self.member_mut().seq.stop.max_new_tokens = n;
        self
    }

    /// Tokens that end a generation.
    pub fn stop_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.member_mut().seq.stop.stop_tokens = tokens.into_iter().collect();
        self
    }

    /// Sets the length limit of the next generations.
    pub fn set_max_new_tokens(&mut self, n: usize) {
        self.member_mut().seq.stop.max_new_tokens = n;
    }

    /// Replaces the sampling settings for the next generation and reseeds the random number
    /// generator with their seed.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`](crate::Error::TokenOutOfRange) for a token the settings name
    /// outside the vocabulary.
    pub fn set_sampling(&mut self, sampling: SamplingConfig) -> Result<()> {
        self.member_mut().seq.set_sampling(sampling)
    }

    /// The target model.
    pub fn target(&self) -> &T {
        &self.member().seq.target
    }

    /// Gives the model back.
    pub fn into_inner(mut self) -> T {
        self.driver.members.swap_remove(0).seq.target
    }

    /// Generates from `prompt`.
    ///
    /// # Errors
    /// Bad prompts, stop tokens outside the vocabulary, model failures.
    pub fn generate(&mut self, prompt: &[u32]) -> Result<Generation> {
        self.generate_with(prompt, |_| ControlFlow::Continue(()))
    }

    /// Like [`generate`](Self::generate), calling `on_tokens` with each new token (as a
    /// one-token slice, the same callback as
    /// [`SpeculativeDecoder::generate_with`](crate::SpeculativeDecoder::generate_with));
    /// `ControlFlow::Break(())` stops the generation there.
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
                self.cancel();
            }
        }
        self.member_mut().seq.save_prefix();
        Ok(self.member().seq.generation())
    }

    /// Resets the model and feeds it the prompt (all but its last token, which the first step
    /// feeds), as [`SpeculativeDecoder::start`](crate::SpeculativeDecoder::start) does.
    ///
    /// # Errors
    /// Bad prompts, stop tokens outside the vocabulary, model failures.
    pub fn start(&mut self, prompt: &[u32]) -> Result<()> {
        self.started = false;
        let m = self.member_mut();
        m.seq.check()?;
        m.seq.start(prompt, false)?;
        (self.started, self.driver.ready) = (true, true);
        Ok(())
    }

    /// Draws one token and returns it (empty once the generation is finished).
    ///
    /// # Errors
    /// [`Error::NotReady`](crate::Error::NotReady) before `start` or while a roll-back
    /// fails; model failures.
    pub fn step(&mut self) -> Result<&[u32]> {
        if !self.started {
            return Err(crate::Error::NotReady("no generation in progress"));
        }
        let before = self.member().seq.ctx().len();
        self.driver.step()?;
        Ok(&self.member().seq.ctx()[before..])
    }

    /// Stops the current generation where it stands (its finish reason becomes `Cancelled`).
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

    /// The log-probabilities of the tokens generated so far, when the sampling settings ask
    /// for them; empty otherwise.
    pub fn logprobs(&self) -> &[TokenLogprob] {
        self.member().seq.logprobs()
    }

    fn member(&self) -> &Member<T, NoDraft> {
        &self.driver.members[0]
    }

    fn member_mut(&mut self) -> &mut Member<T, NoDraft> {
        &mut self.driver.members[0]
    }
}
