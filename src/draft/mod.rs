//! Drafters without a model of their own: [`NGramDraft`] (prompt lookup) and [`LookupOr`]
//! (lookup where the context has a match, a model elsewhere), and [`CrossVocabDraft`] (a
//! draft model with another tokenizer). `Drafter` (feature `llama`) chooses among every
//! drafter at run time.

pub mod cross;
mod lookup;
pub mod ngram;

pub use cross::{CrossMethod, CrossVocabDraft, VocabMap, VocabPair};
pub use lookup::LookupOr;
pub use ngram::NGramDraft;
