//! How many tokens each sequence of a batch drafts: fixed, or chosen every step to maximize
//! the batch's tokens per second from each sequence's measured acceptance and the measured
//! cost T(m) of scoring m rows in one target pass ([`CostModel`](crate::adaptive::CostModel)).
//!
//! At batch 1, T(m) is nearly flat in m (the pass streams the weights once, whatever the rows),
//! so drafting pays; as the batch grows the pass turns compute-bound, each extra row costs
//! about as much as a sequence's whole step did, and the policy drafts less, then not at all.

use crate::adaptive::{KPolicy, DEFAULT_MAX_K};
use crate::error::Result;

/// How a [`BatchDecoder`](super::BatchDecoder) chooses each sequence's k.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchPolicy {
    /// No drafting: one token per sequence per step (batched plain decoding).
    Plain,
    /// Every sequence drafts k tokens every step (at least 1).
    Fixed(usize),
    /// Each step, the k of every sequence (0 to `max_k`) that maximizes the predicted tokens
    /// per second of the whole batch, from the measured costs (the
    /// [`CostModel`](crate::adaptive::CostModel) the single decoder's adaptive k also decides
    /// from), with each sequence's probes by the single decoder's rules (see
    /// [`KController`](crate::adaptive::KController)). A batch of one thus drafts as
    /// [`SpeculativeDecoder`](crate::SpeculativeDecoder) would on the same measurements.
    Adaptive {
        /// The most tokens a sequence drafts in one step
        /// (1..=[`MAX_K`](crate::adaptive::MAX_K)).
        max_k: usize,
    },
}

impl Default for BatchPolicy {
    /// Adaptive, up to [`DEFAULT_MAX_K`] tokens, as the single decoder's default.
    fn default() -> Self {
        Self::Adaptive { max_k: DEFAULT_MAX_K }
    }
}

impl BatchPolicy {
    /// Checks the setting by the single decoder's rules ([`KPolicy::check`]).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`](crate::Error::InvalidSetting) for a k or `max_k` outside
    /// `1..=`[`MAX_K`](crate::adaptive::MAX_K) (`Plain` decodes without drafts).
    pub fn check(self) -> Result<Self> {
        match self {
            Self::Plain => {}
            Self::Fixed(k) => _ = KPolicy::Fixed(k).check()?,
            Self::Adaptive { max_k } => _ = KPolicy::Adaptive { max: max_k }.check()?,
        }
        Ok(self)
    }

    /// The most a sequence drafts under this policy.
    pub fn max_k(self) -> usize {
        match self {
            Self::Plain => 0,
            Self::Fixed(k) | Self::Adaptive { max_k: k } => k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::MAX_K;

    #[test]
    fn settings_are_checked_as_the_single_decoders() {
        assert!(BatchPolicy::Fixed(0).check().is_err());
        assert!(BatchPolicy::Adaptive { max_k: 0 }.check().is_err());
        assert!(BatchPolicy::Adaptive { max_k: MAX_K + 1 }.check().is_err());
        assert!(BatchPolicy::Adaptive { max_k: MAX_K }.check().is_ok());
        assert!(BatchPolicy::Fixed(MAX_K).check().is_ok());
        assert!(BatchPolicy::Fixed(MAX_K + 1).check().is_err());
        assert!(BatchPolicy::Plain.check().is_ok());
        assert_eq!(BatchPolicy::default().max_k(), DEFAULT_MAX_K);
    }
}
