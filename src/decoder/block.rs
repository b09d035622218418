//! A drafted chain block: its tokens and, for sampled drafts, the q rows they were drawn from;
//! how a draft's proposal becomes the block's next token, and how the target's rows judge the
//! block. The single-sequence and the batch decoders share it.

use rand::Rng;

use crate::error::{Error, Result};
use crate::kernel::{self, DraftRow, Verdict};
use crate::model::{Logits, Proposal};
use crate::sampling::Noise;
use crate::sampling::{argmax, sample, History, Processors, SamplingConfig};

#[derive(Debug, Default)]
pub(crate) struct ChainBlock {
    tokens: Vec<u32>,
    /// Per token: its q row is `q_rows[i]` (a sampled dense proposal), not a point mass.
    dense: Vec<bool>,
    /// Reused from block to block.
    q_rows: Vec<Vec<f32>>,
    /// Coupled sampling's noise (see [`Noise`]), and the context position of the first token.
    noise: Option<Noise>,
    first: u64,
}

impl ChainBlock {
    /// Empties the block for the next round, whose first token lands at `first` in the
    /// context; `noise` for coupled sampling.
    pub fn clear(&mut self, first: usize, noise: Option<Noise>) {
        self.tokens.clear();
        self.dense.clear();
        self.noise = noise;
        self.first = first as u64;
    }

    /// The drafted tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The q row the `i`-th drafted token was sampled from, if it was sampled from a row (for
    /// the injected faults of the tests).
    #[cfg(feature = "fault-injection")]
    pub fn q_row_mut(&mut self, i: usize) -> Option<&mut Vec<f32>> {
        match self.dense.get(i) {
            Some(true) => self.q_rows.get_mut(i),
            _ => None,
        }
    }

    /// Turns the draft's proposal into the block's next token: its row processed for the
    /// history `ctx` (prompt and kept tokens) plus the block so far, then sampled from q with
    /// `sampling` and `rng` (or the winner of the coupled race on q), unless greedy or a point
    /// mass. False when the draft proposed nothing, or a point mass the processors forbid.
    pub fn push<R: Rng + ?Sized>(
        &mut self,
        proposal: Proposal,
        (sampling, procs, ctx): (&SamplingConfig, &mut Processors, History),
        vocab: usize,
        rng: &mut R,
    ) -> Result<bool> {
        let i = self.tokens.len();
        self.q_rows.resize_with(self.q_rows.len().max(i + 1), Vec::new);
        let history = History { drafted: &self.tokens, ..ctx };
        let (token, dense) = match proposal {
            Proposal::Nothing => return Ok(false),
            Proposal::Token(t) if procs.forbids(&history, t)? => return Ok(false),
            Proposal::Token(t) => (t, false),
            Proposal::Logits(row) if row.len() != vocab => {
                return Err(Error::BadModelOutput { model: "draft", what: "logits", expected: vocab, got: row.len() });
            }
            Proposal::Logits(row) if sampling.is_greedy() => (argmax(procs.apply(&history, &row)?)?, false),
            Proposal::Logits(row) => {
                sampling.probs(procs.apply(&history, &row)?, &mut self.q_rows[i])?;
                match &self.noise {
                    // Coupled drafts are judged by agreement: their q rows are not kept.
                    Some(noise) => (noise.pick(&self.q_rows[i], self.first + i as u64)?, false),
                    None => (sample(&self.q_rows[i], rng)?, true),
                }
            }
        };
        if token as usize >= vocab {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        self.tokens.push(token);
        self.dense.push(dense);
        Ok(true)
    }

    /// Appends the token the processors force after the history `ctx` plus the block so far,
    /// if they force one (a point mass the target's row, processed alike, will accept).
    pub fn push_forced(&mut self, procs: &mut Processors, ctx: History) -> Result<bool> {
        let history = History { drafted: &self.tokens, ..ctx };
        let Some(token) = procs.forced(&history)? else { return Ok(false) };
        self.q_rows.resize_with(self.q_rows.len().max(self.tokens.len() + 1), Vec::new);
        self.tokens.push(token);
        self.dense.push(false);
        Ok(true)
    }

    /// Judges the block against the target's rows for the pending token and each draft (one
    /// more row than drafts), with the same settings and processors the drafts were sampled
    /// with (row `i` processed for the history `ctx` plus the first `i` drafts). Coupled blocks
    /// are judged by agreement with the target's race winners.
    pub fn judge<R: Rng + ?Sized>(
        &self,
        logits: &Logits,
        (sampling, procs, ctx): (&SamplingConfig, &mut Processors, History),
        vocab: usize,
        rng: &mut R,
    ) -> Result<Verdict> {
        let k = self.tokens.len();
        if logits.rows() != k + 1 || logits.vocab() != vocab {
            let (expected, got) =
                if logits.vocab() != vocab { (vocab, logits.vocab()) } else { (k + 1, logits.rows()) };
            return Err(Error::BadModelOutput { model: "target", what: "logits rows or row length", expected, got });
        }
        let history = |i: usize| History { drafted: &self.tokens[..i], ..ctx };
        if sampling.is_greedy() {
            return kernel::verify_greedy(&self.tokens, |i| argmax(procs.apply(&history(i), logits.row(i))?));
        }
        if let Some(noise) = &self.noise {
            let mut p = Vec::new();
            return kernel::verify_greedy(&self.tokens, |i| {
                sampling.probs(procs.apply(&history(i), logits.row(i))?, &mut p)?;
                noise.pick(&p, self.first + i as u64)
            });
        }
        let q: Vec<DraftRow> = (self.dense.iter().zip(&self.q_rows))
            .map(|(&d, row)| if d { DraftRow::Dense(row) } else { DraftRow::Point })
            .collect();
        let target_row = |i: usize, buf: &mut Vec<f32>| sampling.probs(procs.apply(&history(i), logits.row(i))?, buf);
        kernel::verify_block(&self.tokens, &q, target_row, rng)
    }
}
