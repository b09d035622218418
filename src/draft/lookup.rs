//! N-gram lookup where the context has a match, a model draft elsewhere: code edits repeat
//! long spans of the prompt, which lookup drafts for free, while new code needs the model.

use crate::draft::ngram::MAX_BLOCK;
use crate::draft::NGramDraft;
use crate::error::{Error, Result};
use crate::model::{DraftModel, KvRows, Proposal, TokenModel};

/// Shortest suffix the lookup matches: shorter matches are too often wrong to stand in for the
/// model (on the Qwen2.5-Coder pair, 3-token matches cut the acceptance of fresh code from
/// 0.96 to 0.87 a position).
const MIN_MATCH: usize = 4;

/// Proposes the n-gram continuation (a point mass) when the context's last 4 to 16 tokens
/// occurred before, and the model's row otherwise. A round starting inside such a match is as
/// long as [`NGramDraft`]'s block there, or the decoder's k if that is longer. The model is fed
/// lazily: the tokens it missed while lookup drafted go in with its next call, one forward pass
/// for all of them.
///
/// Exactness is the kernel's: each position's draft law is the one its proposal states (a
/// point mass or the model's row), and which of the two a position gets depends only on the
/// context.
#[derive(Debug)]
pub struct LookupOr<D, L = NGramDraft> {
    lookup: L,
    model: D,
    ctx: Vec<u32>,
}

impl<D: DraftModel> LookupOr<D> {
    /// Lookup first, then `model`.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for a model with an empty vocabulary.
    pub fn new(model: D) -> Result<Self> {
        let lookup = NGramDraft::with_range(model.vocab_size(), MIN_MATCH, MAX_BLOCK)?;
        Ok(Self { lookup, model, ctx: Vec::new() })
    }
}

impl<D: DraftModel, L: DraftModel> LookupOr<D, L> {
    /// Another lookup first (a [`SuffixDraft`](crate::SuffixDraft), say), then `model`: the
    /// lookup's point mass where it proposes one, the model's row where it proposes nothing.
    ///
    /// # Errors
    /// [`Error::VocabMismatch`] when their vocabularies differ.
    pub fn with_lookup(lookup: L, model: D) -> Result<Self> {
        if lookup.vocab_size() != model.vocab_size() {
            return Err(Error::VocabMismatch { draft: lookup.vocab_size(), target: model.vocab_size() });
        }
        Ok(Self { lookup, model, ctx: Vec::new() })
    }

    /// The lookup.
    pub fn lookup(&self) -> &L {
        &self.lookup
    }

    /// Replaces the lookup (between generations: the new one starts empty).
    pub fn set_lookup(&mut self, lookup: L) {
        self.lookup = lookup;
    }

    /// The model draft.
    pub fn model(&self) -> &D {
        &self.model
    }

    /// The model, to change.
    pub fn model_mut(&mut self) -> &mut D {
        &mut self.model
    }
}

impl<D: TokenModel, L: TokenModel> TokenModel for LookupOr<D, L> {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn context_len(&self) -> usize {
        self.ctx.len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.ctx.truncate(len);
        self.lookup.truncate(len)?;
        if self.model.context_len() > len {
            self.model.truncate(len)?;
        }
        Ok(())
    }

    /// The model's rows: the positions it holds (the lookup has no state to keep).
    fn save_rows(&self, from: usize) -> Option<KvRows> {
        self.model.save_rows(from)
    }

    /// Restores the model alone, while this context is empty: the first proposal then feeds
    /// the lookup every token and the model those past the restored ones.
    fn restore_rows(&mut self, tokens: &[u32], rows: &KvRows) -> Result<bool> {
        if !self.ctx.is_empty() {
            return Ok(false);
        }
        self.model.restore_rows(tokens, rows)
    }
}

impl<D: DraftModel, L: DraftModel> DraftModel for LookupOr<D, L> {
    fn block_len(&mut self, ctx: &[u32], k: usize, max: usize) -> usize {
        self.lookup.block_len(ctx, k, max).max(k)
    }

    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        self.ctx.extend_from_slice(tokens);
        if let found @ Proposal::Token(_) = self.lookup.propose(tokens)? {
            return Ok(found);
        }
        match self.ctx.get(self.model.context_len()..) {
            Some(missed) if !missed.is_empty() => self.model.propose(missed),
            _ => Err(Error::BadModelOutput {
                model: "draft",
                what: "context tokens",
                expected: self.ctx.len(),
                got: self.model.context_len(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::MarkovModel;

    #[test]
    fn lookup_drafts_repeats_and_the_model_catches_up_in_one_call() -> Result<()> {
        let mut d = LookupOr::new(MarkovModel::random(8, 1, 3))?;
        // No earlier occurrence of a 4-token suffix: the model proposes.
        assert!(matches!(d.propose(&[1, 2, 3, 4, 0])?, Proposal::Logits(_)));
        assert_eq!(d.model().context_len(), 5);
        // "1 2 3 4" occurred, followed by 0: lookup proposes, the model is not fed.
        assert_eq!(d.propose(&[5, 1, 2, 3, 4])?, Proposal::Token(0));
        assert_eq!((d.context_len(), d.model().context_len()), (10, 5));
        // "2 3 4 7" never occurred: the model takes the 6 tokens it missed at once.
        assert!(matches!(d.propose(&[7])?, Proposal::Logits(_)));
        assert_eq!(d.model().context_len(), 11);
        d.truncate(6)?;
        assert_eq!((d.context_len(), d.model().context_len()), (6, 6));
        Ok(())
    }
}
