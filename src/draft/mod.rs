//! Drafters without a model of their own: [`NGramDraft`] (prompt lookup) and [`LookupOr`]
//! (lookup where the context has a match, a model elsewhere). [`Drafter`](crate::Drafter)
//! chooses among every drafter at run time.

mod lookup;
pub mod ngram;

pub use lookup::LookupOr;
pub use ngram::NGramDraft;
