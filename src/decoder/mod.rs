//! The speculative decoding loop: draft k tokens, verify them in one target call, keep the
//! accepted prefix plus one token, roll both models back, repeat.

mod block;
mod sequence;
mod tree;

pub(crate) use block::ChainBlock;
pub(crate) use sequence::{NoDraft, Sequence};

use crate::adaptive::{KController, KPolicy, RoundReport, ShapeChooser, TreePolicy};
use crate::error::{Error, Result};
use crate::kernel::Verdict;
use crate::model::{DraftModel, TargetModel};
use crate::sampling::SamplingConfig;
use crate::stats::{Clock, FinishReason, Generation, Stats};
use crate::stop::StopRule;

/// Builds a [`SpeculativeDecoder`]; see [`SpeculativeDecoder::builder`].
pub struct DecoderBuilder<D, T> {
    draft: D,
    target: T,
    policy: KPolicy,
    tree: TreePolicy,
    sampling: SamplingConfig,
    stop: StopRule,
    clock: Clock,
    seed: Option<u64>,
}

impl<D: DraftModel, T: TargetModel> DecoderBuilder<D, T> {
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

    /// Checks the settings and the model pair.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for k = 0 or a k policy out of range (see [`KController::new`]),
    /// [`Error::VocabMismatch`] when the models disagree, [`Error::TokenOutOfRange`] for a stop
    /// token outside the vocabulary.
    pub fn build(self) -> Result<SpeculativeDecoder<D, T>> {
        let k = KController::new(self.policy)?;
        let sampling = match self.seed {
            Some(seed) => self.sampling.with_seed(seed),
            None => self.sampling,
        };
        let seq = Sequence::new(self.target, self.draft, sampling, self.stop, self.clock);
        seq.check()?;
        Ok(SpeculativeDecoder { seq, k, shape: ShapeChooser::new(self.tree), ready: false })
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
/// and whether it stopped probing a draft too slow to pay; see [`KController`]).
///
/// A failed step leaves the tokens produced so far in place and both models rolled back to
/// them, so `step` can be called again; if even the roll-back fails, `step` reports
/// [`Error::NotReady`] until the next `start`.
pub struct SpeculativeDecoder<D, T> {
    /// The generation in progress, with the models and settings.
    seq: Sequence<D, T>,
    k: KController,
    shape: ShapeChooser,
    /// False before `start` and after a failed roll-back.
    ready: bool,
}

impl<D: DraftModel, T: TargetModel> SpeculativeDecoder<D, T> {
    /// Starts a builder for `target`, the model whose distribution the output follows, and
    /// `draft`, the model that proposes (target first, as everywhere the crate takes both),
    /// with adaptive k (up to 8, down to plain decoding when drafting does not pay), greedy
    /// sampling, 128 new tokens and no stop token.
    ///
    /// # Example
    /// ```
    /// use specdec::{toy::{MarkovModel, ToyPair}, SpeculativeDecoder};
    /// let ToyPair { target, draft } = MarkovModel::pair(16, 0.2, 7);
    /// let mut dec = SpeculativeDecoder::builder(target, draft).k(3).max_new_tokens(20).build()?;
    /// assert_eq!(dec.generate(&[1, 2])?.tokens.len(), 20);
    /// # Ok::<(), specdec::Error>(())
    /// ```
    pub fn builder(target: T, draft: D) -> DecoderBuilder<D, T> {
        DecoderBuilder {
            draft,
            target,
            policy: KPolicy::default(),
            tree: TreePolicy::default(),
            sampling: SamplingConfig::greedy(),
            stop: StopRule::default(),
            clock: Clock::wall(),
            seed: None,
        }
    }

    /// Generates from `prompt` until a stop token or `max_new_tokens`.
    ///
    /// # Errors
    /// Bad prompts ([`Error::EmptyPrompt`], [`Error::TokenOutOfRange`]) and model failures.
    pub fn generate(&mut self, prompt: &[u32]) -> Result<Generation> {
        self.generate_with(prompt, |_| {})
    }

    /// Like [`generate`](Self::generate), calling `on_tokens` with each run of newly accepted tokens.
    ///
    /// # Errors
    /// As [`generate`](Self::generate).
    pub fn generate_with(&mut self, prompt: &[u32], mut on_tokens: impl FnMut(&[u32])) -> Result<Generation> {
        self.start(prompt)?;
        while self.seq.finish().is_none() {
            on_tokens(self.step()?);
        }
        Ok(self.seq.generation())
    }

    /// Resets both models and feeds them the prompt (all but its last token, which the first
    /// round feeds along with the drafts).
    ///
    /// # Errors
    /// Bad prompts and model failures.
    pub fn start(&mut self, prompt: &[u32]) -> Result<()> {
        self.ready = false;
        // A draft the controller has given up on is not fed the prompt: it is not expected to
        // draft again, and if it does, its first call catches up on the whole context.
        self.seq.start(prompt, !self.k.stopped_probing())?;
        self.ready = true;
        Ok(())
    }

    /// Runs one round and returns the tokens it added (empty once the generation is finished).
    ///
    /// # Errors
    /// [`Error::NotReady`] before `start` or after a failed roll-back; model failures.
    pub fn step(&mut self) -> Result<&[u32]> {
        if !self.ready {
            return Err(Error::NotReady("no generation in progress"));
        }
        if self.seq.finish().is_some() {
            return Ok(&[]);
        }
        let before = self.seq.ctx().len();
        let start = self.seq.clock.seconds();
        let result = self.round();
        self.seq.stats.decode_secs += self.seq.clock.seconds() - start;
        match result {
            Ok(verdict) => {
                self.seq.keep(&verdict.tokens);
                Ok(&self.seq.ctx()[before..])
            }
            Err(e) => {
                self.ready = self.seq.resync();
                Err(e)
            }
        }
    }

    /// The tokens generated so far in the current generation.
    pub fn generated(&self) -> &[u32] {
        self.seq.generated()
    }

    /// Why the current generation finished, if it has.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.seq.finish()
    }

    /// Counters and timings of the current generation.
    pub fn stats(&self) -> &Stats {
        &self.seq.stats
    }

    /// The k the latest round asked for (before any round, the k the first will ask for); a
    /// round drafts fewer when the drafter runs dry or the generation is about to end.
    pub fn k(&self) -> usize {
        self.k.k()
    }

    /// The controller that chooses k, with its policy and estimates.
    pub fn k_controller(&self) -> &KController {
        &self.k
    }

    /// What chooses between chain and tree rounds, with what it measured.
    pub fn shape_chooser(&self) -> &ShapeChooser {
        &self.shape
    }

    /// The draft model.
    pub fn draft(&self) -> &D {
        &self.seq.draft
    }

    /// The target model.
    pub fn target(&self) -> &T {
        &self.seq.target
    }

    /// Gives the models back.
    pub fn into_parts(self) -> (D, T) {
        (self.seq.draft, self.seq.target)
    }

    /// One round, a chain or a tree as the shape chooser says. Returns the verdict.
    fn round(&mut self) -> Result<Verdict> {
        let remaining = self.seq.remaining();
        let start = self.seq.clock.seconds();
        let (verdict, tree) = match self.shape.next(!self.k.stopped_probing()) {
            Some(b) if remaining > 1 => (self.seq.tree_round(b.at_most_deep(remaining - 1))?, true),
            _ => (self.chain_round(remaining)?, false),
        };
        self.shape.observe(tree, verdict.tokens.len(), self.seq.clock.seconds() - start);
        Ok(verdict)
    }

    /// A chain round: draft, verify in one target call, roll back.
    ///
    /// k = 0 is a plain step: the target verifies only the pending token and the kernel's bonus
    /// path samples the next one from its row.
    fn chain_round(&mut self, remaining: usize) -> Result<Verdict> {
        let (n, start) = (self.seq.ctx().len(), self.seq.clock.seconds());
        // A draft more than two tokens behind catches up on all but the last first (see
        // `Sequence::catch_up_draft`), which the controller prices.
        let behind = self.seq.draft_missed()?.len();
        let k = self.k.next_k_for(if behind > 2 { behind - 1 } else { 0 }, remaining);
        let k = if k > 0 { self.seq.block_len(k, self.k.policy().max()) } else { 0 }.min(remaining - 1);
        self.k.planned(k);
        if k > 0 {
            self.seq.catch_up_draft()?;
        }
        let setup = self.seq.clock.seconds() - start;
        let s = &mut self.seq;
        let before = (s.stats.draft_calls, s.stats.draft_secs, s.stats.target_secs);
        s.new_block();
        let mut calls = Vec::with_capacity(k);
        for _ in 0..k {
            let secs = s.stats.draft_secs;
            let more = s.draft_one()?;
            calls.push(s.stats.draft_secs - secs);
            if !more {
                break;
            }
        }
        let verdict = s.verify()?;
        let drafted = s.block.tokens().len();
        self.k.observe_calls(
            &RoundReport {
                drafted,
                accepted: verdict.accepted,
                draft_calls: s.stats.draft_calls - before.0,
                draft_secs: s.stats.draft_secs - before.1,
                target_rows: drafted + 1,
                target_secs: s.stats.target_secs - before.2,
            },
            &calls,
        );
        // Both models keep the context up to the accepted prefix; the last emitted token is fed next round.
        s.roll_back_to(n + verdict.accepted)?;
        self.k.observe_time(self.seq.clock.seconds() - start, setup);
        Ok(verdict)
    }
}
