//! How many tokens each sequence of a batch drafts: fixed, or chosen every step to maximize
//! the batch's tokens per second from each sequence's measured acceptance and the measured
//! cost T(m) of scoring m rows in one target pass ([`CostModel`](crate::adaptive::CostModel)).
//!
//! At batch 1, T(m) is nearly flat in m (the pass streams the weights once, whatever the rows),
//! so drafting pays; as the batch grows the pass turns compute-bound, each extra row costs
//! about as much as a sequence's whole step did, and the policy drafts less, then not at all.

use crate::error::{Error, Result};

/// How a [`BatchDecoder`](super::BatchDecoder) chooses each sequence's k.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchPolicy {
    /// No drafting: one token per sequence per step (batched plain decoding).
    Plain,
    /// Every sequence drafts k tokens every step.
    Fixed(usize),
    /// Each step, the k of every sequence (0 to `max_k`) that maximizes the predicted tokens
    /// per second of the whole batch, from the measured costs (the [`CostModel`](crate::adaptive::CostModel) the single
    /// decoder's adaptive k also decides from).
    Adaptive {
        /// The most tokens a sequence drafts in one step.
        max_k: usize,
    },
}

impl Default for BatchPolicy {
    /// Adaptive, up to 6 tokens.
    fn default() -> Self {
        Self::Adaptive { max_k: 6 }
    }
}

impl BatchPolicy {
    /// Checks the setting.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for k or `max_k` above 32.
    pub fn check(self) -> Result<Self> {
        match self {
            Self::Fixed(k) | Self::Adaptive { max_k: k } if k > MAX_K => {
                Err(Error::setting("batch k", k, "at most 32"))
            }
            _ => Ok(self),
        }
    }

    /// The most a sequence drafts under this policy.
    pub fn max_k(self) -> usize {
        match self {
            Self::Plain => 0,
            Self::Fixed(k) | Self::Adaptive { max_k: k } => k,
        }
    }
}

/// The largest k a batch policy takes.
const MAX_K: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(BatchPolicy::Fixed(33).check().is_err());
        assert!(BatchPolicy::Adaptive { max_k: 4 }.check().is_ok());
        assert_eq!(BatchPolicy::default().max_k(), 6);
    }
}
