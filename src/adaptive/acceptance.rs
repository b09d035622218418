//! The acceptance estimate both k policies keep: the single decoder's [`KController`] and the
//! batch's policy, per sequence and pooled.
//!
//! [`KController`]: super::KController

/// An estimate of the chance that a drafted position is accepted, as
/// [`Stats::position_acceptance`](crate::Stats::position_acceptance) counts it: faded counts of
/// accepted and judged positions (a round judges its positions up to the first rejection),
/// starting from a prior worth some positions. Each policy sets how fast the counts fade.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Acceptance {
    accepted: f64,
    judged: f64,
}

impl Acceptance {
    /// An estimate that starts at `alpha`, worth `weight` judged positions.
    pub fn prior(alpha: f64, weight: f64) -> Self {
        Self { accepted: alpha * weight, judged: weight }
    }

    /// The estimate.
    pub fn alpha(&self) -> f64 {
        self.accepted / self.judged
    }

    /// Keeps `keep` of the counts so far, then counts a round that drafted `k` tokens and kept
    /// `accepted` of them (k = 0: a plain round, which only fades the counts).
    pub fn observe(&mut self, k: usize, accepted: usize, keep: f64) {
        let accepted = accepted.min(k);
        self.accepted = keep * self.accepted + accepted as f64;
        self.judged = keep * self.judged + (accepted + 1).min(k) as f64;
    }

    /// Moves the estimate `rate` of the way toward `alpha`, keeping its weight: so that an
    /// estimate a few unlucky rounds pulled down is tried again in time rather than never.
    pub fn relax(&mut self, alpha: f64, rate: f64) {
        self.accepted += rate * (alpha * self.judged - self.accepted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_positions_up_to_the_first_rejection() {
        let mut a = Acceptance::prior(0.5, 2.0);
        a.observe(4, 4, 1.0); // 4 judged, 4 accepted
        a.observe(4, 1, 1.0); // 2 judged, 1 accepted
        a.observe(0, 0, 1.0); // a plain round judges nothing
        assert!((a.alpha() - 6.0 / 8.0).abs() < 1e-12);
        a.observe(0, 0, 0.5); // and fades the counts, not the estimate
        assert!((a.alpha() - 6.0 / 8.0).abs() < 1e-12);
        a.relax(0.0, 0.5);
        assert!((a.alpha() - 3.0 / 8.0).abs() < 1e-12);
    }
}
