//! Plain autoregressive decoding of a [`TargetModel`]: one target call per token, the baseline
//! every speedup is measured against.

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::error::{Error, Result};
use crate::model::TargetModel;
use crate::sampling::{argmax, sample, SamplingConfig};
use crate::stats::{Clock, FinishReason, Generation, Stats};
use crate::stop::{check_prompt, pending, StopRule};

/// Samples one token per target call with the given settings.
///
/// # Example
/// ```
/// use specdec::{toy::MarkovModel, PlainDecoder, SamplingConfig};
/// let (target, _) = MarkovModel::pair(16, 0.2, 7);
/// let mut plain = PlainDecoder::new(target, SamplingConfig::greedy()).max_new_tokens(10);
/// assert_eq!(plain.generate(&[1, 2])?.tokens.len(), 10);
/// # Ok::<(), specdec::Error>(())
/// ```
pub struct PlainDecoder<T> {
    target: T,
    sampling: SamplingConfig,
    stop: StopRule,
    rng: StdRng,
    probs: Vec<f32>,
    /// Generations started, which key coupled sampling's noise.
    generations: u64,
    clock: Clock,
}

impl<T: TargetModel> PlainDecoder<T> {
    /// A decoder with 128 new tokens and no stop token.
    pub fn new(target: T, sampling: SamplingConfig) -> Self {
        Self {
            rng: StdRng::seed_from_u64(sampling.seed()),
            target,
            sampling,
            stop: StopRule::default(),
            probs: Vec::new(),
            generations: 0,
            clock: Clock::wall(),
        }
    }

    /// Where the reported times are read (default the wall clock; see [`Clock`]).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The most tokens one generation produces.
    pub fn max_new_tokens(mut self, n: usize) -> Self {
        self.stop.max_new_tokens = n;
        self
    }

    /// Tokens that end a generation.
    pub fn stop_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        self.stop.stop_tokens = tokens.into_iter().collect();
        self
    }

    /// The target model.
    pub fn target(&self) -> &T {
        &self.target
    }

    /// Gives the model back.
    pub fn into_inner(self) -> T {
        self.target
    }

    /// Generates from `prompt`.
    ///
    /// # Errors
    /// Bad prompts, stop tokens outside the vocabulary, model failures.
    pub fn generate(&mut self, prompt: &[u32]) -> Result<Generation> {
        self.generate_with(prompt, |_| {})
    }

    /// Like [`generate`](Self::generate), calling `on_token` with each new token.
    ///
    /// # Errors
    /// As [`generate`](Self::generate).
    pub fn generate_with(&mut self, prompt: &[u32], mut on_token: impl FnMut(u32)) -> Result<Generation> {
        let vocab = self.target.vocab_size();
        check_prompt(prompt, vocab)?;
        self.stop.check(vocab)?;
        let mut stats = Stats::default();
        let noise = self.sampling.noise(self.generations);
        self.generations += 1;
        let (target, clock) = (&mut self.target, &self.clock);
        clock.timed(&mut stats.prefill_secs, || -> Result<()> {
            target.truncate(0)?;
            if prompt.len() > 1 {
                target.forward(&prompt[..prompt.len() - 1], 0)?;
            }
            Ok(())
        })?;
        let mut ctx = prompt.to_vec();
        let start = self.clock.seconds();
        let mut finish = self.stop.finish(&[]);
        while finish.is_none() {
            let feed = pending(&ctx, self.target.context_len(), "target")?;
            let target = &mut self.target;
            let logits = self.clock.timed(&mut stats.target_secs, || target.forward(feed, 1))?;
            stats.target_calls += 1;
            if logits.rows() != 1 || logits.vocab() != vocab {
                return Err(Error::BadModelOutput {
                    model: "target",
                    what: "logits rows",
                    expected: 1,
                    got: logits.rows(),
                });
            }
            let token = if self.sampling.is_greedy() {
                argmax(logits.row(0))?
            } else {
                self.sampling.probs(logits.row(0), &mut self.probs)?;
                match &noise {
                    Some(noise) => noise.pick(&self.probs, ctx.len() as u64)?,
                    None => sample(&self.probs, &mut self.rng)?,
                }
            };
            ctx.push(token);
            stats.new_tokens += 1;
            on_token(token);
            finish = self.stop.finish(&ctx[prompt.len()..]);
        }
        stats.decode_secs = self.clock.seconds() - start;
        Ok(Generation { tokens: ctx[prompt.len()..].to_vec(), finish: finish.unwrap_or(FinishReason::Length), stats })
    }
}
