//! A target and its draft, named.

/// A target and the draft that proposes for it, named so that the two cannot be passed for
/// each other: both are often of one type (two `Llama`s, two tokenizers), where a pair of
/// positional arguments would compile swapped and only run slowly.
///
/// ```
/// use specdec::{toy::MarkovModel, Pair, SpeculativeDecoder};
/// let target = MarkovModel::random(16, 1, 7);
/// let draft = target.noisy_copy(0.2, 8);
/// let dec = SpeculativeDecoder::builder(Pair { target, draft }).build()?;
/// # Ok::<(), specdec::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pair<T, D> {
    /// The model whose distribution the output follows (or what belongs to it).
    pub target: T,
    /// The model that proposes (or what belongs to it).
    pub draft: D,
}
