//! The acceptance estimate the k chooser keeps per sequence (and pooled, where a new sequence
//! starts), in the decoders and in a [`KController`] alike: one prior and one fading rule.
//!
//! [`KController`]: super::KController

/// Where an estimate without evidence starts, worth [`PRIOR_WEIGHT`] judged positions:
/// optimistic enough that a fresh policy drafts, and so measures, before it settles; light
/// enough that three rounds rejected at their first position bring it below one half, and
/// that one block of 3 accepted whole lifts it past 0.9 (worth 4 positions, the prior held a
/// fresh decoder's k below the best fixed k for most of a 64-token generation of a draft
/// accepted 98 % of the time: docs/perf/batch.md).
pub(crate) const PRIOR_ALPHA: f64 = 0.8;
const PRIOR_WEIGHT: f64 = 2.0;
/// The share of the counts a drafting round keeps (a window of about 25 rounds), so that the
/// estimate follows the text as it changes;
const KEEP: f64 = 0.96;
/// and the share a round without drafts keeps: the evidence fades slowly while decoding
/// plainly, so that the latest probes weigh most.
const KEEP_PLAIN: f64 = 0.995;

/// An estimate of the chance that a drafted position is accepted, as
/// [`Stats::position_acceptance`](crate::Stats::position_acceptance) counts it: faded counts of
/// accepted and judged positions (a round judges its positions up to the first rejection),
/// starting from a prior worth some positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Acceptance {
    accepted: f64,
    judged: f64,
}

impl Acceptance {
    /// An estimate that starts at [`PRIOR_ALPHA`].
    pub fn new() -> Self {
        Self { accepted: PRIOR_ALPHA * PRIOR_WEIGHT, judged: PRIOR_WEIGHT }
    }

    /// The estimate.
    pub fn alpha(&self) -> f64 {
        self.accepted / self.judged
    }

    /// Counts a round that drafted `k` tokens and kept `accepted` of them (k = 0: a plain
    /// round, which only fades the counts).
    pub fn observe(&mut self, k: usize, accepted: usize) {
        self.observe_keeping(k, accepted, if k > 0 { KEEP } else { KEEP_PLAIN });
    }

    /// Keeps `keep` of the counts so far, then counts the round.
    fn observe_keeping(&mut self, k: usize, accepted: usize, keep: f64) {
        let accepted = accepted.min(k);
        self.accepted = keep * self.accepted + accepted as f64;
        self.judged = keep * self.judged + (accepted + 1).min(k) as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_positions_up_to_the_first_rejection() {
        let mut a = Acceptance { accepted: 1.0, judged: 2.0 };
        a.observe_keeping(4, 4, 1.0); // 4 judged, 4 accepted
        a.observe_keeping(4, 1, 1.0); // 2 judged, 1 accepted
        a.observe_keeping(0, 0, 1.0); // a plain round judges nothing
        assert!((a.alpha() - 6.0 / 8.0).abs() < 1e-12);
        a.observe_keeping(0, 0, 0.5); // and fades the counts, not the estimate
        assert!((a.alpha() - 6.0 / 8.0).abs() < 1e-12);
    }

    #[test]
    fn the_prior_drafts_at_first_and_three_first_position_rejections_bring_it_below_half() {
        let mut a = Acceptance::new();
        assert_eq!(a.alpha(), PRIOR_ALPHA);
        for _ in 0..3 {
            a.observe(6, 0);
        }
        assert!(a.alpha() < 0.5, "{}", a.alpha());
        a.observe(0, 0);
        assert!(a.alpha() < 0.5, "a plain round does not move it");
    }
}
