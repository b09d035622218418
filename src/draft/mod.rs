//! Drafters that are not models: heuristics that implement [`DraftModel`](crate::DraftModel).

pub mod ngram;

pub use ngram::NGramDraft;
