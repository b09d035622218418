//! Drafting with an EAGLE head: its own KV cache over the context, fed the target's
//! recorded states where they exist and its own guesses beyond, and trees grown level by level
//! (EAGLE-2) with the tree's nodes attending to their ancestors in the head's cache.

use std::sync::Arc;

use candle_core::Tensor;

use super::eagle::{EagleHead, HeadInput};
use crate::error::{Error, Result};
use crate::model::grow;
use crate::model::{DraftModel, Proposal, TokenModel};
use crate::models::block::mask;
use crate::models::kv_cache::KvCache;
use crate::models::Features;
use crate::stop::check_tokens;
use crate::tree::{ChildPicker, DraftTree, TreeBudget};

/// An EAGLE head drafting for the target whose hidden states `features` records.
///
/// Token `i` of the context is paired with the target's state after token `i − 1`; after a
/// roll-back the head keeps only positions it computed from the target's own states (those
/// computed from its guesses are redone when the target's states arrive), so its
/// [`context_len`](TokenModel::context_len) may fall below what `truncate` asked for.
#[derive(Debug)]
pub struct EagleDraft {
    head: Arc<EagleHead>,
    features: Features,
    held: usize,
    /// Cache positions computed from the target's states (a prefix of the cache).
    real: usize,
    /// Grows in place: a drafted token costs the same however long the context.
    cache: KvCache,
    /// The head's guess of the state after the last held token.
    last: Option<Tensor>,
}

impl EagleDraft {
    /// A drafter over `head` reading `features` (from
    /// [`Llama::record_hidden`](crate::Llama::record_hidden) with [`EagleHead::taps`]).
    ///
    /// # Errors
    /// [`Error::HeadMismatch`] when the recorded rows are not as wide as the head reads.
    pub fn new(head: Arc<EagleHead>, features: Features) -> Result<Self> {
        let need = head.taps().len() * head.hidden();
        if features.width() != need {
            return Err(Error::HeadMismatch {
                what: "recorded hidden-state width".into(),
                head: need.to_string(),
                target: features.width().to_string(),
            });
        }
        let cache = head.cache(false)?;
        Ok(Self { head, features, held: 0, real: 0, cache, last: None })
    }

    /// Runs the head at cache positions `from..from + tokens.len()` with `input`, each row
    /// seeing the cache and the rows before it. Returns the states `(n, hidden)`.
    fn run_chain(&mut self, tokens: &[u32], input: HeadInput) -> Result<Tensor> {
        let (n, from) = (tokens.len(), self.cache.len());
        let positions: Vec<usize> = (from..from + n).collect();
        let m = mask(n, from + n, self.head.device(), |r, c| c <= from + r)?;
        self.head.step(tokens, input, &positions, m.as_ref(), &mut self.cache)
    }

    /// Absorbs `tokens`: each (but the context's very first) adds one cache position. Returns
    /// the head's guess of the state after the last one, if any position was added.
    fn absorb(&mut self, tokens: &[u32]) -> Result<Option<Tensor>> {
        check_tokens(tokens, self.head.vocab_size())?;
        // Token `held + i` pairs with the state after token `held + i - 1`.
        let skip = usize::from(self.held == 0);
        let start = self.cache.len();
        let end = self.held + tokens.len() - 1;
        let paired = &tokens[skip..];
        let known = self.features.len().clamp(start, end);
        let mut out = None;
        if known > start {
            let rows = self.features.rows(start, known)?;
            let x = Tensor::from_vec(rows, (known - start, self.features.width()), self.head.device())?;
            let states = self.run_chain(&paired[..known - start], HeadInput::Target(x))?;
            if self.real == start {
                self.real = known;
            }
            out = Some(states.narrow(0, known - start - 1, 1)?);
        }
        let own = &paired[known - start..];
        // Tokens past the target's states (drafted, or forced by a grammar) run on the head's
        // own states, one after another.
        out = out.or_else(|| self.last.take());
        for t in own {
            let Some(prev) = out.take() else {
                return Err(Error::NotReady("the draft head is ahead of the target's recorded hidden states"));
            };
            out = Some(self.run_chain(std::slice::from_ref(t), HeadInput::Own(prev))?);
        }
        self.held += tokens.len();
        self.last = out.clone();
        Ok(out)
    }

    /// Grows a tree from the root state `root` (the guess after the last held token) within
    /// `budget`, with tree nodes in the cache after the context while it grows.
    fn grow_tree(
        &mut self,
        root_row: Vec<f32>,
        root: Tensor,
        budget: TreeBudget,
        picker: &mut ChildPicker,
    ) -> Result<DraftTree> {
        let base = self.cache.len();
        let dev = self.head.device().clone();
        // Per node of the whole tree: its state (once it has been run); per tree slot of the
        // cache: its node.
        let mut states: Vec<Option<Tensor>> = Vec::new();
        let mut slot_node: Vec<usize> = Vec::new();
        let grown = grow(budget, picker, root_row, |all, frontier| {
            states.resize(all.len(), None);
            let inputs = frontier
                .iter()
                .map(|&n| all.parents()[n].map_or(Some(root.clone()), |p| states[p].clone()))
                .collect::<Option<Vec<Tensor>>>()
                .ok_or(Error::NotReady("a tree node's parent has no state"))?;
            let x = Tensor::cat(&inputs, 0)?;
            let positions: Vec<usize> = frontier.iter().map(|&n| base + all.depth(n)).collect();
            let first = base + slot_node.len();
            let lines: Vec<Vec<usize>> = frontier.iter().map(|&n| all.line(n)).collect();
            let m = mask(frontier.len(), first + frontier.len(), &dev, |r, c| {
                c < base || (c >= first && c - first == r) || (c < first && lines[r].contains(&slot_node[c - base]))
            })?;
            let tokens: Vec<u32> = frontier.iter().map(|&n| all.tokens()[n]).collect();
            let out = self.head.step(&tokens, HeadInput::Own(x), &positions, m.as_ref(), &mut self.cache)?;
            for (i, &n) in frontier.iter().enumerate() {
                states[n] = Some(out.narrow(0, i, 1)?);
                slot_node.push(n);
            }
            self.head.logits(&out)
        });
        self.cache.truncate(base);
        Ok(grown?.0)
    }
}

impl TokenModel for EagleDraft {
    fn vocab_size(&self) -> usize {
        self.head.vocab_size()
    }

    fn context_len(&self) -> usize {
        self.held
    }

    /// Rolls back to `len` tokens, or further: to the last position computed from the
    /// target's own states.
    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.held {
            return Err(Error::BadTruncate { len: self.held, to: len });
        }
        let keep = len.saturating_sub(1).min(self.real);
        self.cache.truncate(keep);
        self.real = keep;
        self.held = if len == 0 { 0 } else { keep + 1 };
        self.last = None;
        Ok(())
    }
}

impl DraftModel for EagleDraft {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        match self.absorb(tokens)? {
            Some(state) => Ok(Proposal::Logits(self.head.logits(&state)?.swap_remove(0))),
            None => Ok(Proposal::Nothing),
        }
    }

    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, picker: &mut ChildPicker) -> Result<DraftTree> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let Some(root) = self.absorb(tokens)? else { return Ok(DraftTree::new()) };
        let row = self.head.logits(&root)?.swap_remove(0);
        self.grow_tree(row, root, budget, picker)
    }
}
