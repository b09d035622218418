//! The two roles a model plays: the target that verifies and the draft that proposes.

use crate::error::{Error, Result};

/// Logits rows on the host: `rows() × vocab()` values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    data: Vec<f32>,
    vocab: usize,
}

impl Logits {
    /// Wraps `data` as rows of `vocab` logits.
    ///
    /// # Errors
    /// [`Error::BadModelOutput`] when `vocab` is 0 or does not divide `data.len()`.
    pub fn new(data: Vec<f32>, vocab: usize) -> Result<Self> {
        if vocab == 0 || !data.len().is_multiple_of(vocab) {
            return Err(Error::BadModelOutput {
                model: "model",
                what: "logits values",
                expected: vocab,
                got: data.len(),
            });
        }
        Ok(Self { data, vocab })
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.data.len() / self.vocab
    }

    /// The row length.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row `i` (panics when `i >= rows()`, like slice indexing).
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// All values, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The last row as an owned vector (empty when there are no rows).
    pub fn into_last_row(mut self) -> Vec<f32> {
        let start = self.data.len().saturating_sub(self.vocab);
        self.data.drain(..start);
        self.data
    }
}

/// A model that scores tokens: it keeps a context (its KV cache) and extends it.
///
/// The target verifies k drafted tokens plus the bonus position in ONE `forward` call, and is
/// rolled back with `truncate` after a rejection.
pub trait TargetModel {
    /// The number of tokens in the vocabulary; every logits row has this length.
    fn vocab_size(&self) -> usize;

    /// How many tokens the model's context holds.
    fn context_len(&self) -> usize;

    /// Appends `tokens` to the context and returns the logits that follow each of the last
    /// `rows` of them (`rows <= tokens.len()`; 0 when only the cache is wanted, as in prefill).
    /// Row `i` is the next-token distribution after `tokens[tokens.len() - rows + i]`.
    ///
    /// # Errors
    /// Out-of-vocabulary tokens, a context past the model's limit, backend failures.
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits>;

    /// Rolls the context back to its first `len` tokens.
    ///
    /// # Errors
    /// [`Error::BadTruncate`] when `len > context_len()`.
    fn truncate(&mut self, len: usize) -> Result<()>;
}

/// What a drafter proposes as the next token.
#[derive(Debug, Clone, PartialEq)]
pub enum Proposal {
    /// A logits row: the decoder applies the sampling settings and samples the draft token.
    Logits(Vec<f32>),
    /// One token with certainty (n-gram lookup and other deterministic drafters).
    Token(u32),
    /// Nothing worth proposing: the block ends early (possibly with no drafted token at all).
    Nothing,
}

/// A model or heuristic that proposes tokens cheaply.
///
/// Every [`TargetModel`] is a `DraftModel` (through its last logits row), so a small model is a
/// drafter as it is; heuristic drafters implement this trait directly.
pub trait DraftModel {
    /// The number of tokens in the vocabulary.
    fn vocab_size(&self) -> usize;

    /// How many tokens the drafter's context holds.
    fn context_len(&self) -> usize;

    /// Appends `tokens` (at least one) to the context and proposes the token that follows.
    ///
    /// # Errors
    /// Out-of-vocabulary tokens, backend failures.
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal>;

    /// Rolls the context back to its first `len` tokens.
    ///
    /// # Errors
    /// [`Error::BadTruncate`] when `len > context_len()`.
    fn truncate(&mut self, len: usize) -> Result<()>;
}

impl<M: TargetModel> DraftModel for M {
    fn vocab_size(&self) -> usize {
        TargetModel::vocab_size(self)
    }

    fn context_len(&self) -> usize {
        TargetModel::context_len(self)
    }

    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        let logits = self.forward(tokens, 1)?;
        if logits.rows() != 1 {
            return Err(Error::BadModelOutput { model: "draft", what: "logits rows", expected: 1, got: logits.rows() });
        }
        Ok(Proposal::Logits(logits.into_last_row()))
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        TargetModel::truncate(self, len)
    }
}

impl<M: TargetModel + ?Sized> TargetModel for &mut M {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn context_len(&self) -> usize {
        (**self).context_len()
    }

    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        (**self).forward(tokens, rows)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        (**self).truncate(len)
    }
}
