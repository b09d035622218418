//! Plain autoregressive decoding of a [`TargetModel`]: one target call per token, the baseline
//! every speedup is measured against.

use crate::decoder::{NoDraft, Sequence};
use crate::error::Result;
use crate::model::TargetModel;
use crate::sampling::SamplingConfig;
use crate::stats::{Clock, Generation};
use crate::stop::StopRule;

/// Samples one token per target call with the given settings.
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
    /// The sequence engine with a draft that never proposes: every round is a plain step.
    seq: Sequence<NoDraft, T>,
}

impl<T: TargetModel> PlainDecoder<T> {
    /// A decoder with 128 new tokens and no stop token.
    pub fn new(target: T, sampling: SamplingConfig) -> Self {
        let draft = NoDraft { vocab: target.vocab_size() };
        Self { seq: Sequence::new(target, draft, sampling, StopRule::default(), Clock::wall()) }
    }

    /// Where the reported times are read (default the wall clock; see [`Clock`]).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.seq.clock = clock;
        self
    }

    /// The most tokens one generation produces.
    pub fn max_new_tokens(mut self, n: usize) -> Self {
        self.seq.stop.max_new_tokens = n;
        self
    }

    /// Tokens that end a generation.
    pub fn stop_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.seq.stop.stop_tokens = tokens.into_iter().collect();
        self
    }

    /// The target model.
    pub fn target(&self) -> &T {
        &self.seq.target
    }

    /// Gives the model back.
    pub fn into_inner(self) -> T {
        self.seq.target
    }

    /// Generates from `prompt`.
    ///
    /// # Errors
    /// Bad prompts, stop tokens outside the vocabulary, model failures.
    pub fn generate(&mut self, prompt: &[u32]) -> Result<Generation> {
        self.generate_with(prompt, |_| {})
    }

    /// Like [`generate`](Self::generate), calling `on_tokens` with each new token (as a
    /// one-token slice, the same callback type as
    /// [`SpeculativeDecoder::generate_with`](crate::SpeculativeDecoder::generate_with)).
    ///
    /// # Errors
    /// As [`generate`](Self::generate).
    pub fn generate_with(&mut self, prompt: &[u32], mut on_tokens: impl FnMut(&[u32])) -> Result<Generation> {
        let s = &mut self.seq;
        s.check()?;
        s.start(prompt, false)?;
        let start = s.clock.seconds();
        while s.finish().is_none() {
            // An empty block: the target scores the pending token, and the kernel's bonus path
            // draws the next token from its row (argmax, coupled race or a plain draw).
            s.new_block();
            let verdict = s.verify()?;
            let before = s.ctx().len();
            s.keep(&verdict.tokens);
            on_tokens(&s.ctx()[before..]);
        }
        s.stats.decode_secs = s.clock.seconds() - start;
        Ok(s.generation())
    }
}
