//! Logits processors: functions of the history and the logits row that run before the
//! sampling settings (temperature, top-k, min-p, top-p).
//!
//! Exactness under speculation needs one rule: at position `i` of a round, the draft's row and
//! the target's row are processed with the same processors and the same history, the context
//! plus the tokens drafted before `i`. Then `q_i` and `p_i` are the laws a plain decoder with
//! the same processors would use there, and the kernel's accept/residual rule emits `p_i`'s law
//! token by token (the seed's argument, with `p` and `q` read as the processed rows). Every
//! processor here is handed that history whole, so its state can never drift from it: a
//! processor may cache what it computed for a history and must give what a fresh one given the
//! same history would ([`Counts`] does so for the built-in penalties).
//!
//! The built-ins follow their usual definitions:
//! - **logit bias** (OpenAI `logit_bias`): adds the token's bias to its logit; **banned
//!   tokens**: their logits become `-inf`;
//! - **repetition penalty** (HF `RepetitionPenaltyLogitsProcessor`, llama.cpp `repeat_penalty`
//!   over the whole context): a token seen in the prompt or the output has its logit divided by
//!   the penalty when positive, multiplied when negative;
//! - **presence and frequency penalties** (OpenAI): a token's logit loses
//!   `presence · [count > 0] + frequency · count`, its count taken over the output so far;
//! - **min-p** (in [`SamplingConfig::probs`](super::SamplingConfig::probs), after temperature
//!   and top-k): tokens less likely than `min_p` times the most likely one are dropped.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;

/// What a processor sees at a position: the prompt, the tokens generated so far, and the
/// tokens drafted before this position in the current round (not yet judged; empty in plain
/// decoding).
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    /// The prompt.
    pub prompt: &'a [u32],
    /// The tokens kept after the prompt.
    pub generated: &'a [u32],
    /// The tokens drafted before this position in the round.
    pub drafted: &'a [u32],
}

impl History<'_> {
    /// The output at this position: the generated tokens, then the drafted ones.
    pub fn output(&self) -> impl Iterator<Item = u32> + '_ {
        self.generated.iter().chain(self.drafted).copied()
    }

    /// Every token before this position: prompt, generated, drafted.
    pub fn all(&self) -> impl Iterator<Item = u32> + '_ {
        self.prompt.iter().copied().chain(self.output())
    }

    /// How many tokens precede this position.
    pub fn len(&self) -> usize {
        self.prompt.len() + self.generated.len() + self.drafted.len()
    }

    /// True before the first token (never, in a decoder: a prompt has at least one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A logits processor with per-sequence state: it changes a logits row given the history
/// before the row's position. The decoders call it on every draft row and every target row,
/// in chains, batches and plain decoding alike, with the history of that position, so the
/// output keeps the law of plain decoding with the same processor. It must be a function of
/// the history and the row: a state it keeps is a cache of the history (advance it on new
/// tokens, roll it back where the history is shorter or differs).
pub trait LogitsProcessor: Send + Debug {
    /// Changes `logits`, the next-token logits after `history`, in place (`-inf` masks a
    /// token; NaN and `+inf` are errors downstream).
    ///
    /// # Errors
    /// Whatever the processor cannot do (a typed error stops the generation; the decoder
    /// stays usable).
    fn process(&mut self, history: &History, logits: &mut [f32]) -> Result<()>;

    /// The one token this processor leaves after `history`, whatever the row, if there is
    /// one (a grammar's forced token). The decoders then emit it without a model call: a plain
    /// decoder with the same processor would draw it with probability 1. The default: none.
    ///
    /// # Errors
    /// As [`process`](Self::process).
    fn forced(&mut self, history: &History) -> Result<Option<u32>> {
        let _ = history;
        Ok(None)
    }

    /// False when this processor masks `token` after `history` whatever the row (a grammar's
    /// forbidden token): a point-mass draft of it would only waste a verification row. The
    /// default: true.
    ///
    /// # Errors
    /// As [`process`](Self::process).
    fn allows(&mut self, history: &History, token: u32) -> Result<bool> {
        let _ = (history, token);
        Ok(true)
    }
}

/// Makes a fresh processor for each sequence (each generation of a decoder, each request of a
/// batch): processors keep per-sequence state.
pub type ProcessorFactory = Arc<dyn Fn() -> Box<dyn LogitsProcessor> + Send + Sync>;

/// The built-in processors' settings (part of a [`SamplingConfig`](super::SamplingConfig)).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct BuiltIns {
    pub repetition: Option<f32>,
    pub presence: f32,
    pub frequency: f32,
    pub bias: Vec<(u32, f32)>,
    pub banned: Vec<u32>,
}

impl BuiltIns {
    pub fn is_empty(&self) -> bool {
        self.repetition.is_none()
            && self.presence == 0.0
            && self.frequency == 0.0
            && self.bias.is_empty()
            && self.banned.is_empty()
    }
}

/// Token counts of a history, kept as a cache: [`sync`](Self::sync) advances it over new
/// tokens and rolls it back where the history is shorter or differs, so that its counts are
/// always those of a fresh count of the history.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    seen: Vec<u32>,
    counts: HashMap<u32, u32>,
}

impl Counts {
    /// Brings the counts to those of `tokens`.
    pub fn sync(&mut self, tokens: impl Iterator<Item = u32>) {
        let mut n = 0;
        let mut tail = Vec::new();
        for t in tokens {
            if tail.is_empty() && n < self.seen.len() && self.seen[n] == t {
                n += 1;
            } else {
                tail.push(t);
            }
        }
        for t in self.seen.drain(n..) {
            if let Some(c) = self.counts.get_mut(&t) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&t);
                }
            }
        }
        for t in tail {
            *self.counts.entry(t).or_insert(0) += 1;
            self.seen.push(t);
        }
    }

    /// How often `token` occurs.
    pub fn count(&self, token: u32) -> u32 {
        self.counts.get(&token).copied().unwrap_or(0)
    }

    /// The tokens counted, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.seen
    }

    /// Each distinct token with its count.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.counts.iter().map(|(&t, &c)| (t, c))
    }
}

/// One sequence's processors: the built-ins and fresh instances of the custom ones, with the
/// scratch row they write to.
#[derive(Debug, Default)]
pub(crate) struct Processors {
    builtins: BuiltIns,
    custom: Vec<Box<dyn LogitsProcessor>>,
    /// Counts over the whole history (repetition) and over the output (presence, frequency).
    context: Counts,
    output: Counts,
    scratch: Vec<f32>,
    /// Seconds spent in the processors.
    pub secs: f64,
}

impl Processors {
    pub fn new(builtins: BuiltIns, factories: &[ProcessorFactory]) -> Self {
        Self { builtins, custom: factories.iter().map(|f| f()).collect(), ..Self::default() }
    }

    /// True when nothing changes a row.
    pub fn is_empty(&self) -> bool {
        self.builtins.is_empty() && self.custom.is_empty()
    }

    /// True when `token` is masked after `history` whatever the row (banned, or refused by a
    /// custom processor): a point-mass draft of it would only waste a verification row.
    pub fn forbids(&mut self, history: &History, token: u32) -> Result<bool> {
        if self.builtins.banned.contains(&token) {
            return Ok(true);
        }
        let start = Instant::now();
        let mut allowed = true;
        for p in &mut self.custom {
            allowed = allowed && p.allows(history, token)?;
        }
        self.secs += start.elapsed().as_secs_f64();
        Ok(!allowed)
    }

    /// The token the processors force after `history`, if one does and no other processor
    /// masks it (then the processed law is a point mass on it, whatever the row).
    pub fn forced(&mut self, history: &History) -> Result<Option<u32>> {
        if self.custom.is_empty() {
            return Ok(None);
        }
        let start = Instant::now();
        let mut forced = None;
        for p in &mut self.custom {
            if let Some(t) = p.forced(history)? {
                forced = Some(t);
                break;
            }
        }
        self.secs += start.elapsed().as_secs_f64();
        match forced {
            Some(t) if !self.forbids(history, t)? => Ok(Some(t)),
            _ => Ok(None),
        }
    }

    /// The row processed for `history` (the row itself when nothing changes it).
    pub fn apply<'a>(&'a mut self, history: &History, row: &'a [f32]) -> Result<&'a [f32]> {
        if self.is_empty() {
            return Ok(row);
        }
        let start = Instant::now();
        self.scratch.clear();
        self.scratch.extend_from_slice(row);
        let b = &self.builtins;
        let out = &mut self.scratch;
        if let Some(r) = b.repetition {
            self.context.sync(history.all());
            for (t, _) in self.context.iter() {
                if let Some(x) = out.get_mut(t as usize) {
                    *x = if *x > 0.0 { *x / r } else { *x * r };
                }
            }
        }
        if b.presence != 0.0 || b.frequency != 0.0 {
            self.output.sync(history.output());
            for (t, c) in self.output.iter() {
                if let Some(x) = out.get_mut(t as usize) {
                    *x -= b.presence + b.frequency * c as f32;
                }
            }
        }
        for &(t, bias) in &b.bias {
            if let Some(x) = out.get_mut(t as usize) {
                *x += bias;
            }
        }
        for &t in &b.banned {
            if let Some(x) = out.get_mut(t as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
        for p in &mut self.custom {
            p.process(history, out)?;
        }
        self.secs += start.elapsed().as_secs_f64();
        Ok(&self.scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_their_history_whatever_came_before() {
        let mut cached = Counts::default();
        let histories: [&[u32]; 6] = [&[1, 2, 2], &[1, 2, 2, 5, 5], &[1, 2], &[1, 3, 3, 3], &[], &[4, 1, 2, 2, 9]];
        for h in histories {
            cached.sync(h.iter().copied());
            let mut fresh = Counts::default();
            fresh.sync(h.iter().copied());
            assert_eq!(cached, fresh, "{h:?}");
            assert_eq!(cached.tokens(), h);
        }
    }

    #[test]
    fn built_ins_follow_their_definitions() -> Result<()> {
        let builtins =
            BuiltIns { repetition: Some(2.0), presence: 0.5, frequency: 0.25, bias: vec![(0, 1.0)], banned: vec![3] };
        let mut p = Processors::new(builtins, &[]);
        let h = History { prompt: &[1], generated: &[2, 2], drafted: &[0] };
        let row = [1.0, 4.0, -2.0, 0.5, 3.0];
        let out = p.apply(&h, &row)?.to_vec();
        // Token 0: seen once in the output (repetition 1/2, presence, frequency), then +1 bias.
        assert_eq!(out[0], 1.0 / 2.0 - 0.5 - 0.25 + 1.0);
        // Token 1: in the prompt only: repetition alone.
        assert_eq!(out[1], 2.0);
        // Token 2: negative, so multiplied; twice in the output.
        assert_eq!(out[2], -4.0 - 0.5 - 0.5);
        assert_eq!(out[3], f32::NEG_INFINITY);
        assert_eq!(out[4], 3.0);
        assert!(p.forbids(&h, 3)? && !p.forbids(&h, 4)?);
        Ok(())
    }
}
