//! [`Vocabulary`]: the tokenizer's role, as a drafter with another vocabulary than its
//! target's needs it.

use crate::error::Result;

/// A tokenizer as a cross-vocabulary drafter uses it: token ids to text and back.
///
/// `Tokenizer` is one (with the `llama` feature); tests use
/// [`ToyVocab`](crate::toy::ToyVocab).
pub trait Vocabulary {
    /// The text of `ids`, special tokens written out (`<|im_end|>`).
    ///
    /// # Errors
    /// Ids outside the vocabulary, decoder failures.
    fn text(&self, ids: &[u32]) -> Result<String>;

    /// `text` as ids, without a start token; special tokens written in it become their ids.
    ///
    /// # Errors
    /// Encoder failures.
    fn ids(&self, text: &str) -> Result<Vec<u32>>;

    /// How many ids the vocabulary has.
    fn len(&self) -> usize;

    /// Whether the vocabulary is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids a context starts with (a start token), before any text.
    fn start(&self) -> Vec<u32> {
        Vec::new()
    }

    /// Whether `id` is a special token (an end of turn or of text, not plain text).
    fn is_special(&self, _id: u32) -> bool {
        false
    }
}
