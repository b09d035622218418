//! Drafting across vocabularies: a draft model with its own tokenizer proposes the target's
//! tokens (Timor et al., ICML 2025, "Accelerating LLM Inference with Lossless Speculative
//! Decoding Algorithms for Heterogeneous Vocabularies").
//!
//! Two methods, both exact through the ordinary kernel:
//! - [`CrossMethod::Text`]: the draft continues the text greedily in its own tokens, the
//!   continuation is re-tokenized with the target's tokenizer, and its tokens are proposed as
//!   point masses (q = 1 on the proposed token, as for n-gram lookup): whatever the proposal,
//!   accepting it with probability p and otherwise sampling p without it yields p.
//! - [`CrossMethod::Intersection`]: the draft's row restricted to the token strings both
//!   vocabularies have, renormalized and written at the target's ids: a proper distribution
//!   over target tokens, sampled and judged by min(1, p/q) as any model draft's row.
//!
//! The draft's context follows the target's text: after every round the text the target
//! accepted since the last point where both tokenizations end together is re-tokenized with
//! the draft's tokenizer, and only what differs from what the draft holds is fed again.

mod vocab;

pub use vocab::VocabMap;

use std::str::FromStr;

use crate::error::{Error, Result};
use crate::model::{DraftModel, Proposal, TokenModel, Vocabulary};
use crate::pair::Pair;
use crate::sampling::argmax;
use crate::stop::check_tokens;
use vocab::text_within;

/// How a [`CrossVocabDraft`] proposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrossMethod {
    /// The draft's greedy text, re-tokenized by the target, as point masses.
    Text,
    /// The draft's row on the shared token strings, sampled.
    Intersection,
}

impl FromStr for CrossMethod {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "text" => Ok(Self::Text),
            "intersection" | "tli" => Ok(Self::Intersection),
            _ => Err(Error::setting("cross-vocabulary method", s, "text or intersection")),
        }
    }
}

impl std::fmt::Display for CrossMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Intersection => "intersection",
        })
    }
}

/// Most draft tokens one [`CrossMethod::Text`] proposal may take to produce.
const MAX_DRAFT_STEPS: usize = 4;

/// A draft model with another tokenizer, proposing the target's tokens (see the module docs).
/// `D` drafts over the ids of `draft_vocab`; the proposals are ids of `target_vocab`, in rows
/// of `target_len` (the target model's row length, which may exceed its tokenizer's size).
#[derive(Debug)]
pub struct CrossVocabDraft<D, V> {
    draft: D,
    draft_vocab: V,
    target_vocab: V,
    target_len: usize,
    method: CrossMethod,
    map: VocabMap,
    /// The target's tokens, as the decoder fed them.
    ctx: Vec<u32>,
    /// The draft tokens the draft holds.
    draft_ids: Vec<u32>,
    /// Points (target tokens, draft tokens) where both tokenizations end at the same text,
    /// increasing; the first is (0, the draft's start tokens).
    synced: Vec<(usize, usize)>,
    /// The draft's last row (valid while `draft_ids` is unchanged since it was computed).
    row: Option<Proposal>,
    /// Text method: the target tokens planned from context position `plan_at` on.
    plan: Vec<u32>,
    plan_at: usize,
    /// Text method: the draft tokens where the plan's continuation starts, the target tokens
    /// the plan's text is anchored to (`ctx[anchor..plan_at]`), and their text (`None` when it
    /// starts or ends inside a character).
    cont_from: usize,
    anchor: usize,
    anchor_text: Option<String>,
    /// Text method: whether a plan was started since the context was last emptied, and whether
    /// its continuation ended (a special token, no proposal, or a merge into the anchor).
    planned: bool,
    cont_done: bool,
}

/// The two vocabularies a [`CrossVocabDraft`] maps between, by name so that they cannot be
/// swapped.
#[derive(Debug, Clone)]
pub struct VocabPair<V> {
    /// The target's vocabulary: the ids the decoder sees.
    pub target: V,
    /// The length of the target's logits rows (at least its vocabulary's size).
    pub target_len: usize,
    /// The draft model's vocabulary.
    pub draft: V,
}

impl<D: DraftModel, V: Vocabulary> CrossVocabDraft<D, V> {
    /// Wraps `draft` (over `vocabs.draft`'s ids) to propose `vocabs.target`'s ids in rows of
    /// `vocabs.target_len`, with `method`. Builds the vocabulary map once.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when the draft's row is shorter than its vocabulary, when
    /// `target_len` is shorter than the target vocabulary, or when the vocabularies share no
    /// token string; decoder failures.
    pub fn new(draft: D, vocabs: VocabPair<V>, method: CrossMethod) -> Result<Self> {
        let VocabPair { target: target_vocab, target_len, draft: draft_vocab } = vocabs;
        if draft.vocab_size() < draft_vocab.len() {
            return Err(Error::setting("draft vocabulary", draft_vocab.len(), "at most the draft model's row length"));
        }
        if target_len < target_vocab.len() {
            return Err(Error::setting("target row length", target_len, "at least the target vocabulary's size"));
        }
        let map = VocabMap::new(Pair { target: &target_vocab, draft: &draft_vocab })?;
        let start = draft_vocab.start();
        let mut me = Self {
            draft,
            draft_vocab,
            target_vocab,
            target_len,
            method,
            map,
            ctx: Vec::new(),
            draft_ids: Vec::new(),
            synced: Vec::new(),
            row: None,
            plan: Vec::new(),
            plan_at: 0,
            cont_from: 0,
            anchor: 0,
            anchor_text: None,
            planned: false,
            cont_done: false,
        };
        me.draft.truncate(0)?;
        me.synced.push((0, start.len()));
        if !start.is_empty() {
            me.push_draft(&start)?;
        }
        Ok(me)
    }

    /// The method in use.
    pub fn method(&self) -> CrossMethod {
        self.method
    }

    /// The vocabulary map.
    pub fn map(&self) -> &VocabMap {
        &self.map
    }

    /// The draft model.
    pub fn draft(&self) -> &D {
        &self.draft
    }

    /// The last synced point (the start point is never removed).
    fn last_synced(&self) -> (usize, usize) {
        self.synced.last().copied().unwrap_or((0, 0))
    }

    /// Brings the draft to the text of the whole context (or of all but its last few tokens
    /// while they end inside a character): the text since the last synced point is
    /// re-tokenized, the draft keeps what it holds of that, and the rest is fed.
    fn sync(&mut self) -> Result<()> {
        let (t0, d0) = self.last_synced();
        let end = self.ctx.len();
        let mut found = None;
        for t1 in (t0.max(end.saturating_sub(4))..=end).rev() {
            if let Some(text) = text_within(&self.target_vocab, &self.ctx, t0, t1)? {
                found = Some((t1, text));
                break;
            }
        }
        let Some((t1, text)) = found else { return Ok(()) };
        if t1 == t0 {
            return Ok(());
        }
        let new = self.draft_vocab.ids(&text).map_err(|e| {
            Error::tokenizer(format!("the draft's tokenizer cannot spell the target's text {text:?}: {e}"))
        })?;
        self.feed_after(d0, &new)?;
        self.synced.push((t1, d0 + new.len()));
        Ok(())
    }

    /// Makes the draft hold `draft_ids[..at]` followed by `new`, feeding only what differs.
    fn feed_after(&mut self, at: usize, new: &[u32]) -> Result<()> {
        let held = &self.draft_ids[at.min(self.draft_ids.len())..];
        let same = held.iter().zip(new).take_while(|(a, b)| a == b).count();
        let keep = at + same;
        if keep == self.draft_ids.len() && same == new.len() {
            return Ok(());
        }
        self.draft_ids.truncate(keep);
        self.draft.truncate(keep)?;
        self.row = None;
        if same < new.len() {
            self.push_draft(&new[same..])?;
        }
        Ok(())
    }

    /// Feeds draft tokens and keeps the row that follows them. A failure rolls the draft back
    /// to what it held before, so the next call starts from a consistent state.
    fn push_draft(&mut self, ids: &[u32]) -> Result<()> {
        match self.draft.propose(ids) {
            Ok(row) => {
                self.draft_ids.extend_from_slice(ids);
                self.row = Some(row);
                Ok(())
            }
            Err(e) => {
                let held = self.draft_ids.len();
                self.row = None;
                self.planned = false;
                self.draft.truncate(held.min(self.draft.context_len()))?;
                self.draft_ids.truncate(self.draft.context_len());
                let len = self.draft_ids.len();
                self.synced.retain(|&(_, d)| d <= len);
                if self.synced.is_empty() {
                    self.synced.push((0, 0));
                }
                Err(e)
            }
        }
    }

    /// Makes sure the draft's row after everything it holds is at hand (re-feeding its last
    /// token when the row was dropped); it stays `None` only when the draft holds nothing.
    fn ensure_row(&mut self) -> Result<()> {
        if self.row.is_none() {
            let Some(&last) = self.draft_ids.last() else { return Ok(()) };
            let n = self.draft_ids.len() - 1;
            self.draft_ids.truncate(n);
            self.draft.truncate(n)?;
            self.push_draft(&[last])?;
        }
        Ok(())
    }

    fn propose_intersection(&mut self) -> Result<Proposal> {
        self.sync()?;
        self.ensure_row()?;
        let n = self.draft_vocab.len();
        Ok(match &self.row {
            Some(Proposal::Logits(row)) if row.len() >= n => {
                let row = self.map.target_row(&row[..n], self.target_len);
                if row.iter().all(|l| *l == f32::NEG_INFINITY) {
                    Proposal::Nothing
                } else {
                    Proposal::Logits(row)
                }
            }
            Some(Proposal::Logits(row)) => {
                return Err(Error::BadModelOutput { model: "draft", what: "logits", expected: n, got: row.len() })
            }
            Some(Proposal::Token(t)) => self.map.target_of(*t).map_or(Proposal::Nothing, Proposal::Token),
            Some(Proposal::Nothing) | None => Proposal::Nothing,
        })
    }

    /// Whether the context so far follows the plan.
    fn on_plan(&self) -> bool {
        let at = self.ctx.len();
        self.planned
            && at >= self.plan_at
            && at - self.plan_at <= self.plan.len()
            && self.ctx[self.plan_at..] == self.plan[..at - self.plan_at]
    }

    fn propose_text(&mut self) -> Result<Proposal> {
        if !self.on_plan() {
            self.new_plan()?;
        }
        let i = self.ctx.len() - self.plan_at;
        let mut steps = 0;
        while self.plan.len() <= i && !self.cont_done && steps < MAX_DRAFT_STEPS {
            self.draft_one()?;
            self.replan()?;
            steps += 1;
        }
        Ok(self.plan.get(i).map_or(Proposal::Nothing, |&t| Proposal::Token(t)))
    }

    /// Starts a plan at the end of the context: syncs the draft and anchors the continuation
    /// to the context's last few tokens. Draft tokens it still holds past that point were
    /// drafted greedily after the same text, so they are the continuation's start.
    fn new_plan(&mut self) -> Result<()> {
        self.sync()?;
        let (t, d) = self.last_synced();
        self.planned = true;
        self.plan.clear();
        self.plan_at = t;
        self.cont_from = d;
        self.anchor = t.saturating_sub(3);
        self.anchor_text = text_within(&self.target_vocab, &self.ctx, self.anchor, t)?;
        self.cont_done = false;
        self.replan()
    }

    /// The draft's next greedy token, from the row it already has (no forward pass).
    fn peek(&self) -> Result<Option<u32>> {
        let next = match &self.row {
            Some(Proposal::Logits(row)) => Some(argmax(&row[..self.draft_vocab.len().min(row.len())])?),
            Some(Proposal::Token(t)) => Some(*t),
            Some(Proposal::Nothing) | None => None,
        };
        Ok(next.filter(|&t| (t as usize) < self.draft_vocab.len()))
    }

    /// Extends the draft's continuation by one greedy token.
    fn draft_one(&mut self) -> Result<()> {
        self.ensure_row()?;
        match self.peek()? {
            Some(t) => self.push_draft(&[t]),
            None => {
                self.cont_done = true;
                Ok(())
            }
        }
    }

    /// Re-tokenizes the anchor's text and the draft's continuation, with the token the draft
    /// will choose next (known from its last row), with the target's tokenizer. The plan is
    /// what follows the anchor's own tokens, less the last token (the text that follows may
    /// extend it) unless the continuation ends in a special token (an end of turn) or is that
    /// one next token alone: a plan's first proposal then costs no draft step beyond the one
    /// that brought the draft up to the context, and is wrong only where the target's token
    /// would also take in text the draft has not written yet.
    fn replan(&mut self) -> Result<()> {
        let from = self.cont_from.saturating_sub(3);
        let mut cont: Vec<u32> = self.draft_ids[from..].to_vec();
        cont.extend(self.peek()?);
        let Some(text) = text_within(&self.draft_vocab, &cont, self.cont_from - from, cont.len())? else {
            return Ok(()); // ends inside a character: wait for the next token
        };
        let Some(anchor) = &self.anchor_text else {
            self.cont_done = true;
            return Ok(());
        };
        let ids = self.target_vocab.ids(&format!("{anchor}{text}"))?;
        let anchor_ids = &self.ctx[self.anchor..self.plan_at];
        if !ids.starts_with(anchor_ids) {
            // The continuation merges into the context's last token: nothing to propose.
            self.cont_done = true;
            self.plan.clear();
            return Ok(());
        }
        let mut plan = ids[anchor_ids.len()..].to_vec();
        let drafted = cont.len() - (self.cont_from - from);
        if drafted > 0 && cont.last().is_some_and(|&t| self.draft_vocab.is_special(t)) {
            self.cont_done = true; // an end of turn or of text: the plan is complete
        } else if drafted > 1 {
            plan.pop();
        }
        self.plan = plan;
        Ok(())
    }
}

impl<D: TokenModel, V: Vocabulary> TokenModel for CrossVocabDraft<D, V> {
    fn vocab_size(&self) -> usize {
        self.target_len
    }

    fn context_len(&self) -> usize {
        self.ctx.len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.ctx.len() {
            return Err(Error::BadTruncate { len: self.ctx.len(), to: len });
        }
        self.ctx.truncate(len);
        self.synced.retain(|&(t, _)| t <= len);
        if self.plan_at > len {
            self.planned = false;
        }
        Ok(())
    }
}

impl<D: DraftModel, V: Vocabulary> DraftModel for CrossVocabDraft<D, V> {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        check_tokens(tokens, self.target_len)?;
        self.ctx.extend_from_slice(tokens);
        let proposal = match self.method {
            CrossMethod::Text => self.propose_text(),
            CrossMethod::Intersection => self.propose_intersection(),
        };
        match proposal {
            // The draft's tokens fill its context before the target's do (its vocabulary may
            // split the text finer): from there on the target decodes alone.
            Err(Error::ContextTooLong { .. }) => Ok(Proposal::Nothing),
            other => other,
        }
    }
}
