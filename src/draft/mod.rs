//! Drafters without a model of their own: [`NGramDraft`] (prompt lookup), [`SuffixDraft`]
//! (lookup over this request and earlier ones, in a [`SuffixCache`]) and [`LookupOr`]
//! (lookup where the context has a match, a model elsewhere), and [`CrossVocabDraft`] (a
//! draft model with another tokenizer). `Drafter` (feature `llama`) chooses among every
//! drafter at run time.

pub mod cross;
mod lookup;
pub mod ngram;
mod suffix;
pub mod suffix_cache;

pub use cross::{CrossMethod, CrossVocabDraft, VocabMap, VocabPair};
pub use lookup::LookupOr;
pub use ngram::NGramDraft;
pub use suffix::SuffixDraft;
pub use suffix_cache::SuffixCache;
