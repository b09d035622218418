//! One generation in progress: the sequence engine under every decoder.
//!
//! A [`Sequence`] holds the two models, the context, the settings, the random number generator
//! and the block being drafted, and does what every decoder does alike: start (check the
//! prompt, reset and prefill), draft a token into the block, judge the block against the
//! target's rows, keep the verdict's tokens up to a stop, and roll both models back.
//! [`SpeculativeDecoder`](super::SpeculativeDecoder) drives one, the
//! [`BatchDecoder`](crate::BatchDecoder) several (batching their model calls), and the
//! [`PlainDecoder`](crate::PlainDecoder) one whose blocks are always empty ([`NoDraft`]): a
//! round with no draft is a plain step, the bonus token drawn from the target's row.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::ChainBlock;
use crate::error::{Error, Result};
use crate::kernel::Verdict;
use crate::model::{DraftModel, Logits, Proposal, TargetModel, TokenModel};
use crate::prefix::PrefixCache;
use crate::sampling::{History, Noise, Processors, SamplingConfig};
use crate::stats::{Clock, FinishReason, Generation, Stats, TokenLogprob};
use crate::stop::{check_prompt, pending, StopRule};

pub(crate) struct Sequence<D, T> {
    pub draft: D,
    pub target: T,
    pub sampling: SamplingConfig,
    pub stop: StopRule,
    pub rng: StdRng,
    /// Where call times are read.
    pub clock: Clock,
    pub stats: Stats,
    /// The block being drafted.
    pub block: ChainBlock,
    pub(super) ctx: Vec<u32>,
    pub(super) prompt_len: usize,
    finish: Option<FinishReason>,
    /// Coupled sampling's noise for the current generation.
    pub(super) noise: Option<Noise>,
    /// The generation's logits processors (made anew at each start).
    pub(super) procs: Processors,
    /// Generations started, which key coupled sampling's noise.
    generations: u64,
    /// Where the models' states for prompts seen before are kept, if anywhere.
    pub prefix: Option<PrefixCache>,
    /// Whether this generation's context is in the prefix cache (or has no models' state to
    /// give it).
    saved: bool,
    /// Whether the prompt's head is still being fed (see [`prefill`](Self::prefill)).
    prefilling: bool,
    /// Whether this generation looked its prompt up in the prefix cache.
    looked_up: bool,
    /// The generated tokens' log-probabilities, when the settings ask for them.
    logprobs: Vec<TokenLogprob>,
    /// Those of the latest round's tokens, until [`keep`](Self::keep) keeps them.
    round_logprobs: Vec<TokenLogprob>,
}

impl<D: DraftModel, T: TargetModel> Sequence<D, T> {
    /// A sequence of `target` and `draft` with these settings; see [`check`](Self::check).
    pub fn new(target: T, draft: D, sampling: SamplingConfig, stop: StopRule, clock: Clock) -> Self {
        Self {
            draft,
            target,
            rng: StdRng::seed_from_u64(sampling.seed()),
            sampling,
            stop,
            clock,
            stats: Stats::default(),
            block: ChainBlock::default(),
            ctx: Vec::new(),
            prompt_len: 0,
            finish: None,
            noise: None,
            procs: Processors::default(),
            generations: 0,
            prefix: None,
            saved: true,
            prefilling: false,
            looked_up: false,
            logprobs: Vec::new(),
            round_logprobs: Vec::new(),
        }
    }

    /// Checks that the models share a vocabulary and that the stop tokens and the tokens the
    /// sampling settings name lie in it.
    ///
    /// # Errors
    /// [`Error::VocabMismatch`], [`Error::TokenOutOfRange`].
    pub fn check(&self) -> Result<()> {
        let (draft, target) = (self.draft.vocab_size(), self.target.vocab_size());
        if draft != target {
            return Err(Error::VocabMismatch { draft, target });
        }
        self.sampling.check(target)?;
        self.stop.check(target)
    }

    /// Replaces the sampling settings (checked against the vocabulary) and reseeds the random
    /// number generator with their seed; the next generation uses them.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for a token the settings name outside the vocabulary.
    pub fn set_sampling(&mut self, sampling: SamplingConfig) -> Result<()> {
        sampling.check(self.target.vocab_size())?;
        self.rng = StdRng::seed_from_u64(sampling.seed());
        self.sampling = sampling;
        Ok(())
    }

    /// Starts a generation and prefills it whole: [`begin`](Self::begin), then
    /// [`prefill`](Self::prefill) with no limit.
    ///
    /// # Errors
    /// Bad prompts ([`Error::EmptyPrompt`], [`Error::TokenOutOfRange`]) and model failures.
    pub fn start(&mut self, prompt: &[u32], prefill_draft: bool) -> Result<()> {
        self.begin(prompt)?;
        self.prefill(usize::MAX, prefill_draft).map(drop)
    }

    /// Begins a generation: checks the prompt, leaves the last generation's context in the
    /// prefix cache (if it was not yet) and resets both models. The prompt but its last token
    /// (which the first round feeds) is left to [`prefill`](Self::prefill).
    ///
    /// # Errors
    /// Bad prompts ([`Error::EmptyPrompt`], [`Error::TokenOutOfRange`]) and model failures.
    pub fn begin(&mut self, prompt: &[u32]) -> Result<()> {
        check_prompt(prompt, self.target.vocab_size())?;
        self.save_prefix();
        self.ctx = prompt.to_vec();
        self.prompt_len = prompt.len();
        self.stats = Stats::default();
        self.noise = self.sampling.noise(self.generations);
        self.procs = self.sampling.processors();
        self.generations += 1;
        self.finish = self.stop.finish(&[]);
        (self.saved, self.prefilling, self.looked_up) = (false, true, false);
        self.logprobs.clear();
        self.round_logprobs.clear();
        let (draft, target) = (&mut self.draft, &mut self.target);
        self.clock.timed(&mut self.stats.prefill_secs, || -> Result<()> {
            target.truncate(0)?;
            draft.truncate(0)
        })
    }

    /// Feeds the target up to `budget` more tokens of the prompt's head (all but its last
    /// token), and the draft the same tokens it lacks when `prefill_draft` (otherwise its first
    /// draft call catches up). The first call restores both models from the longest prefix of
    /// the head that the prefix cache holds (late, so that a sequence that began beside
    /// another with the same prompt finds what that one prefilled before it); the last leaves
    /// the head in the cache. Returns the tokens fed to the target; the prefill is over when
    /// [`prefilling`](Self::prefilling) turns false.
    ///
    /// # Errors
    /// Model failures (the models keep what they held before the call).
    pub fn prefill(&mut self, budget: usize, prefill_draft: bool) -> Result<usize> {
        let head = &self.ctx[..self.prompt_len.saturating_sub(1)];
        let (draft, target, prefix) = (&mut self.draft, &mut self.target, &self.prefix);
        let mut hit = None;
        let mut fed = 0;
        let looked_up = self.looked_up;
        self.clock.timed(&mut self.stats.prefill_secs, || -> Result<()> {
            if let (Some(cache), false) = (prefix, looked_up) {
                hit = Some(cache.restore(head, target, draft)?);
            }
            let from = target.context_len().min(head.len());
            let to = head.len().min(from.saturating_add(budget));
            if to > from {
                target.forward(&head[from..to], 0)?;
            }
            let seen = draft.context_len().min(to);
            if prefill_draft && seen < to {
                draft.propose(&head[seen..to])?;
            }
            fed = to - from;
            if let (Some(cache), true, true) = (prefix, to == head.len(), fed > 0) {
                cache.insert(head, &*target, &*draft);
            }
            Ok(())
        })?;
        if let Some(hit) = hit {
            (self.looked_up, self.stats.prefix_hit_tokens) = (true, hit.target);
        }
        self.stats.prefill_tokens += fed;
        self.prefilling = self.target.context_len() < head.len();
        Ok(fed)
    }

    /// Whether the prompt's head is not all fed yet (the sequence takes no round until it is).
    pub fn prefilling(&self) -> bool {
        self.prefilling
    }

    /// Leaves the context the models hold (prompt and output) in the prefix cache, once per
    /// generation: when a sequence leaves a batch, and when a decoder starts its next one.
    pub fn save_prefix(&mut self) {
        if std::mem::replace(&mut self.saved, true) {
            return;
        }
        if let Some(cache) = &self.prefix {
            let n = self.target.context_len().min(self.ctx.len());
            cache.insert(&self.ctx[..n], &self.target, &self.draft);
        }
    }

    /// The context: the prompt and the tokens kept so far.
    pub fn ctx(&self) -> &[u32] {
        &self.ctx
    }

    /// The draft's block length for the next chain round, given the controller's `k` and the
    /// policy's longest block `max` (see [`DraftModel::block_len`]).
    pub fn block_len(&mut self, k: usize, max: usize) -> usize {
        self.draft.block_len(&self.ctx, k, max)
    }

    /// The tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.ctx[self.prompt_len.min(self.ctx.len())..]
    }

    /// Why the generation finished, if it has.
    pub fn finish(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Tokens left before `max_new_tokens` (at least 1 while the generation runs).
    pub fn remaining(&self) -> usize {
        self.stop.max_new_tokens.saturating_sub(self.ctx.len() - self.prompt_len)
    }

    /// The context's tokens the draft has not seen.
    pub fn draft_missed(&self) -> Result<&[u32]> {
        pending(&self.ctx, self.draft.context_len(), "draft")
    }

    /// The draft, with the context's tokens it has not seen (for a batched catch-up call).
    pub fn draft_with_missed(&mut self) -> Result<(&mut D, &[u32])> {
        let missed = pending(&self.ctx, self.draft.context_len(), "draft")?;
        Ok((&mut self.draft, missed))
    }

    /// Empties the block for a new round.
    pub fn new_block(&mut self) {
        self.block.clear(self.ctx.len(), self.noise);
    }

    /// What the draft is fed next: the tokens of the context and the block it has not seen
    /// (the last drafted token, or more after forced tokens or a plain round).
    pub fn draft_feed(&self) -> Result<Vec<u32>> {
        let seen = self.draft.context_len();
        let block = self.block.tokens();
        if seen >= self.ctx.len() && !block.is_empty() {
            let from = (seen - self.ctx.len()).min(block.len());
            return Ok(block[from..].to_vec());
        }
        let mut feed = pending(&self.ctx, seen, "draft")?.to_vec();
        feed.extend_from_slice(block);
        Ok(feed)
    }

    /// What the target scores: the pending token(s), then the drafts; and how many rows it
    /// returns (one per draft, and one after the last token).
    pub fn target_feed(&self) -> Result<(Vec<u32>, usize)> {
        let mut feed = pending(&self.ctx, self.target.context_len(), "target")?.to_vec();
        feed.extend_from_slice(self.block.tokens());
        Ok((feed, self.block.tokens().len() + 1))
    }

    /// Keeps the tokens the processors force after the context, with no model call (a plain
    /// decoder with the same processors would draw each with probability 1), until one is not
    /// forced or the generation ends. Returns how many.
    pub fn fast_forward(&mut self) -> Result<usize> {
        let mut n = 0;
        // Asked for, log-probabilities need the target's row at every token.
        if self.sampling.logprobs().is_some() {
            return Ok(n);
        }
        while self.finish.is_none() {
            let Some(t) = self.procs.forced(&history(&self.ctx, self.prompt_len))? else { break };
            self.keep(&[t]);
            n += 1;
        }
        self.stats.forced_tokens += n;
        self.stats.process_secs = self.procs.secs;
        Ok(n)
    }

    /// Appends to the block the tokens the processors force after it, while the block is
    /// shorter than `k`; they need no draft call. True when the block ends with a stop token.
    pub fn force_block(&mut self, k: usize) -> Result<bool> {
        let ctx = history(&self.ctx, self.prompt_len);
        while self.block.tokens().len() < k && self.block.push_forced(&mut self.procs, ctx)? {
            self.stats.forced_tokens += 1;
            if self.block.tokens().last().is_some_and(|t| self.stop.stop_tokens.contains(t)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Counts a draft call of `secs` and turns its proposal into the block's next token (see
    /// [`ChainBlock::push`]). False when the draft proposed nothing.
    pub fn take_proposal(&mut self, proposal: Proposal, secs: f64) -> Result<bool> {
        self.stats.draft_calls += 1;
        self.stats.draft_secs += secs;
        let vocab = self.target.vocab_size();
        let ctx = history(&self.ctx, self.prompt_len);
        self.block.push(proposal, (&self.sampling, &mut self.procs, ctx), vocab, &mut self.rng)
    }

    /// Counts a target call of `secs` and judges the block against its rows (one for the
    /// pending token, one per draft).
    pub fn judge(&mut self, logits: &Logits, secs: f64) -> Result<Verdict> {
        self.stats.target_calls += 1;
        self.stats.target_secs += secs;
        let vocab = self.target.vocab_size();
        let ctx = history(&self.ctx, self.prompt_len);
        let verdict = self.block.judge(logits, (&self.sampling, &mut self.procs, ctx), vocab, &mut self.rng)?;
        self.stats.record_round(self.block.tokens().len(), verdict.accepted);
        let rows: Vec<usize> = (0..verdict.tokens.len()).collect();
        self.score(&verdict.tokens, logits, &rows)?;
        self.stats.process_secs = self.procs.secs;
        Ok(verdict)
    }

    /// When the settings ask for them, the log-probabilities of a round's `tokens`, token `j`
    /// from row `rows[j]` of `logits` (for [`keep`](Self::keep) to keep with the tokens).
    pub(super) fn score(&mut self, tokens: &[u32], logits: &Logits, rows: &[usize]) -> Result<()> {
        self.round_logprobs.clear();
        let Some(asked) = self.sampling.logprobs() else { return Ok(()) };
        let ctx = history(&self.ctx, self.prompt_len);
        for (j, (&token, &row)) in tokens.iter().zip(rows).enumerate() {
            let history = History { drafted: &tokens[..j], ..ctx };
            let value = asked.of((&self.sampling, &mut self.procs, &history), logits.row(row), token)?;
            self.round_logprobs.push(value);
        }
        Ok(())
    }

    /// Ends the generation where it stands, as cancelled (a finished one keeps its reason).
    pub fn cancel(&mut self) {
        self.finish = self.finish.or(Some(FinishReason::Cancelled));
    }

    /// Appends a round's tokens to the context, up to the first that ends the generation.
    pub fn keep(&mut self, tokens: &[u32]) {
        let mut values = std::mem::take(&mut self.round_logprobs).into_iter();
        for &t in tokens {
            self.logprobs.extend(values.next().filter(|v| v.token == t));
            self.ctx.push(t);
            self.stats.new_tokens += 1;
            self.finish = self.stop.finish(&self.ctx[self.prompt_len..]);
            if self.finish.is_some() {
                break;
            }
        }
    }

    /// Rolls both models back to their first `keep` tokens after a round (the accepted part;
    /// the last token kept is fed next round).
    pub fn roll_back_to(&mut self, keep: usize) -> Result<()> {
        self.target.truncate(keep)?;
        if self.draft.context_len() > keep {
            self.draft.truncate(keep)?;
        }
        Ok(())
    }

    /// After a failed round, rolls both models back to the tokens kept so far (all but the
    /// pending last one). True when they hold exactly that, so that the next round can run.
    pub fn resync(&mut self) -> bool {
        if self.prefilling {
            // A failed chunk moved nothing: the models hold a prefix of the head.
            return true;
        }
        let keep = self.ctx.len().saturating_sub(1);
        let target_ok = self.target.context_len() <= keep || self.target.truncate(keep).is_ok();
        let draft_ok = self.draft.context_len() <= keep || self.draft.truncate(keep).is_ok();
        target_ok && draft_ok && self.target.context_len() == keep
    }

    /// The generated tokens' log-probabilities (empty unless the settings ask for them).
    pub fn logprobs(&self) -> &[TokenLogprob] {
        &self.logprobs
    }

    /// The generation so far: its tokens, why it finished (the length limit when it has not),
    /// its statistics and the log-probabilities asked for.
    pub fn generation(&self) -> Generation {
        Generation {
            tokens: self.generated().to_vec(),
            finish: self.finish.unwrap_or(FinishReason::Length),
            stats: self.stats.clone(),
            logprobs: self.logprobs.clone(),
        }
    }
}

/// The history at a block's start: the context's prompt and generated tokens, nothing drafted.
pub(super) fn history(ctx: &[u32], prompt_len: usize) -> History<'_> {
    let (prompt, generated) = ctx.split_at(prompt_len.min(ctx.len()));
    History { prompt, generated, drafted: &[] }
}

/// The draft of a plain decoder: it never proposes, so every round is a plain step.
pub(crate) struct NoDraft {
    pub vocab: usize,
}

impl TokenModel for NoDraft {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn context_len(&self) -> usize {
        0
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        match len {
            0 => Ok(()),
            _ => Err(Error::BadTruncate { len: 0, to: len }),
        }
    }
}

impl DraftModel for NoDraft {
    fn propose(&mut self, _tokens: &[u32]) -> Result<Proposal> {
        Ok(Proposal::Nothing)
    }
}
