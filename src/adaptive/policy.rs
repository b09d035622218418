//! [`KPolicy`], the setting that says how k is chosen, and its text form (`4`, `auto`,
//! `auto:MAX`, `grow`, `grow:MAX`).

use super::MAX_K;
use crate::error::{Error, Result};

/// How k is chosen each round, for every decoder: the single one, the batch (for each of its
/// sequences) and the plain one (`Plain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KPolicy {
    /// No drafting: one token per target call (plain decoding, batched in a batch).
    Plain,
    /// Always draft this many tokens (at least 1).
    Fixed(usize),
    /// Each round, the k in `0..=max` with the best expected speedup, from the measured
    /// acceptance and call times (see [`KController`](super::KController)); the default. As k
    /// then depends on timings, sampled outputs are not reproducible from the seed alone;
    /// greedy outputs are.
    Adaptive {
        /// The largest k to consider (1..=[`MAX_K`](super::MAX_K)).
        max: usize,
    },
    /// The common schedule: start at `start`, one more after a fully accepted block (up to
    /// `max`), one fewer after a rejection (down to 1).
    GrowShrink {
        /// The first k (1..=max).
        start: usize,
        /// The largest k.
        max: usize,
    },
}

impl KPolicy {
    /// Checks the setting.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for a fixed k or an adaptive `max` outside `1..=`[`MAX_K`],
    /// or a grow/shrink `start` outside `1..=max` with `max` at most [`MAX_K`].
    pub fn check(self) -> Result<Self> {
        match self {
            KPolicy::Fixed(k) if k == 0 || k > MAX_K => {
                Err(Error::setting("k", k, "between 1 and MAX_K (64) drafted tokens per round"))
            }
            KPolicy::Adaptive { max } | KPolicy::GrowShrink { max, .. } if max == 0 || max > MAX_K => {
                Err(Error::setting("k_policy max", max, "between 1 and MAX_K (64)"))
            }
            KPolicy::GrowShrink { start, max } if start == 0 || start > max => {
                Err(Error::setting("k_policy start", start, "between 1 and max"))
            }
            _ => Ok(self),
        }
    }

    /// The longest block the policy allows: a fixed k, or the `max` of the others (0 for
    /// plain decoding).
    pub fn max(self) -> usize {
        match self {
            KPolicy::Plain => 0,
            KPolicy::Fixed(k) => k,
            KPolicy::Adaptive { max } | KPolicy::GrowShrink { max, .. } => max,
        }
    }
}

impl Default for KPolicy {
    /// `Adaptive { max: 8 }`: a fixed k is a slowdown wherever the draft turns out costly
    /// (a draft costing a few target steps loses at any k), while the adaptive policy falls
    /// back to plain decoding there and drafts long blocks where drafting pays. Blocks longer
    /// than 8 seldom pay (α^9 is small for most pairs, and verifying more rows costs more).
    fn default() -> Self {
        KPolicy::Adaptive { max: DEFAULT_MAX_K }
    }
}

impl std::str::FromStr for KPolicy {
    type Err = Error;

    /// `N` (fixed; `0` or `plain` for plain decoding), `auto` or `auto:MAX` (adaptive, max 8
    /// by default), `grow` or `grow:MAX` (grow/shrink from 2).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::setting("k", s, "N, plain, auto, auto:MAX, grow or grow:MAX");
        let (kind, max) = s.split_once(':').map_or((s, None), |(k, m)| (k, Some(m)));
        let max = max.map(|m| m.parse::<usize>().map_err(|_| bad())).transpose()?.unwrap_or(DEFAULT_MAX_K);
        match kind {
            "auto" => Ok(KPolicy::Adaptive { max }),
            "grow" => Ok(KPolicy::GrowShrink { start: 2.min(max), max }),
            "plain" | "0" => Ok(KPolicy::Plain),
            n => n.parse().map(KPolicy::Fixed).map_err(|_| bad()),
        }
    }
}

impl std::fmt::Display for KPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KPolicy::Plain => write!(f, "plain"),
            KPolicy::Fixed(k) => write!(f, "{k}"),
            KPolicy::Adaptive { max } => write!(f, "auto:{max}"),
            KPolicy::GrowShrink { max, .. } => write!(f, "grow:{max}"),
        }
    }
}

/// The `max` of [`KPolicy::Adaptive`] by default, and of `auto` and `grow` without one.
pub const DEFAULT_MAX_K: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_parse_and_auto_is_the_default() -> Result<()> {
        assert_eq!("auto".parse::<KPolicy>()?, KPolicy::default());
        assert_eq!(KPolicy::default(), KPolicy::Adaptive { max: 8 });
        assert_eq!("4".parse::<KPolicy>()?, KPolicy::Fixed(4));
        assert_eq!("plain".parse::<KPolicy>()?, KPolicy::Plain);
        assert_eq!(KPolicy::Plain.to_string().parse::<KPolicy>()?, KPolicy::Plain);
        assert!(KPolicy::Plain.check().is_ok());
        assert_eq!("auto:3".parse::<KPolicy>()?, KPolicy::Adaptive { max: 3 });
        assert_eq!("grow".parse::<KPolicy>()?, KPolicy::GrowShrink { start: 2, max: 8 });
        assert_eq!(KPolicy::default().to_string().parse::<KPolicy>()?, KPolicy::default());
        for bad in ["", "auto:", "auto:x", "fast", "-1"] {
            assert!(matches!(bad.parse::<KPolicy>(), Err(Error::InvalidSetting { name: "k", .. })), "{bad:?}");
        }
        Ok(())
    }
}
