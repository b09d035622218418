//! How many tokens each sequence of a batch drafts: fixed, or chosen every step to maximize
//! the batch's tokens per second from each sequence's measured acceptance and the measured
//! cost T(m) of scoring m rows in one target pass.
//!
//! At batch 1, T(m) is nearly flat in m (the pass streams the weights once, whatever the rows),
//! so drafting pays; as the batch grows the pass turns compute-bound, each extra row costs
//! about as much as a sequence's whole step did, and the policy drafts less, then not at all.

use crate::error::{Error, Result};
use crate::stats::expected_tokens_per_call;

/// How a [`BatchDecoder`](super::BatchDecoder) chooses each sequence's k.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchPolicy {
    /// No drafting: one token per sequence per step (batched plain decoding).
    Plain,
    /// Every sequence drafts k tokens every step.
    Fixed(usize),
    /// Each step, the k of every sequence (0 to `max_k`) that maximizes the predicted tokens
    /// per second of the whole batch, from the measured costs ([`BatchCosts`]).
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

/// Weight of a new measurement in the running averages.
const NEW: f64 = 0.2;

/// Measured costs: the seconds of a target pass by its number of rows, T(m), and of a batched
/// draft step by its number of sequences, D(b). Unmeasured sizes are read off the straight
/// line through the nearest measured ones.
#[derive(Debug, Clone, Default)]
pub struct BatchCosts {
    target: Vec<Option<f64>>,
    draft: Vec<Option<f64>>,
}

impl BatchCosts {
    /// Records a target pass of `rows` rows that took `secs`.
    pub fn observe_target(&mut self, rows: usize, secs: f64) {
        observe(&mut self.target, rows, secs);
    }

    /// Records a draft step for `seqs` sequences that took `secs`.
    pub fn observe_draft(&mut self, seqs: usize, secs: f64) {
        observe(&mut self.draft, seqs, secs);
    }

    /// True once a target pass of `rows` rows was measured.
    pub fn has_target(&self, rows: usize) -> bool {
        self.target.get(rows).is_some_and(Option::is_some)
    }

    /// T(m): the seconds of a target pass of `rows` rows (`None` before any measurement).
    pub fn target_secs(&self, rows: usize) -> Option<f64> {
        estimate(&self.target, rows)
    }

    /// D(b): the seconds of a draft step for `seqs` sequences (0 before any measurement, so
    /// that the policy tries drafting once and learns what it costs).
    pub fn draft_secs(&self, seqs: usize) -> f64 {
        if seqs == 0 {
            return 0.0;
        }
        estimate(&self.draft, seqs).unwrap_or(0.0)
    }

    /// The predicted tokens per second of one step in which sequence i, whose acceptance per
    /// position is `alpha[i]`, drafts `ks[i]` tokens (`None` before T is measured).
    pub fn throughput(&self, alpha: &[f64], ks: &[usize]) -> Option<f64> {
        let tokens: f64 = alpha.iter().zip(ks).map(|(&a, &k)| expected_tokens_per_call(k as f64, a)).sum();
        let rows: usize = ks.iter().map(|k| k + 1).sum();
        let depth = ks.iter().copied().max().unwrap_or(0);
        let drafting: f64 = (0..depth).map(|j| self.draft_secs(ks.iter().filter(|&&k| k > j).count())).sum();
        let secs = self.target_secs(rows)? + drafting;
        Some(tokens / secs.max(1e-12))
    }

    /// The k of each sequence (at most `limits[i]`) with the highest predicted throughput:
    /// the best common k, then, sequence by sequence from the least accepting, any lower k
    /// that raises the prediction. All zeros before T is measured.
    pub fn choose(&self, alpha: &[f64], limits: &[usize]) -> Vec<usize> {
        let Some(max) = limits.iter().copied().max() else { return Vec::new() };
        let score = |ks: &[usize]| self.throughput(alpha, ks).unwrap_or(0.0);
        let common = |k: usize| -> Vec<usize> { limits.iter().map(|&l| k.min(l)).collect() };
        let mut best = common(0);
        for k in 1..=max {
            let trial = common(k);
            if score(&trial) > score(&best) {
                best = trial;
            }
        }
        let mut order: Vec<usize> = (0..alpha.len()).collect();
        order.sort_by(|&a, &b| alpha[a].total_cmp(&alpha[b]));
        for i in order {
            for k in 0..best[i] {
                let mut trial = best.clone();
                trial[i] = k;
                if score(&trial) > score(&best) {
                    best = trial;
                    break;
                }
            }
        }
        best
    }
}

fn observe(table: &mut Vec<Option<f64>>, size: usize, secs: f64) {
    if table.len() <= size {
        table.resize(size + 1, None);
    }
    let slot = &mut table[size];
    *slot = Some(slot.map_or(secs, |old| (1.0 - NEW) * old + NEW * secs));
}

/// The measured value at `size`, or the line through the nearest measured sizes around it (or
/// the two nearest on one side; a single measurement scales in proportion).
fn estimate(table: &[Option<f64>], size: usize) -> Option<f64> {
    if let Some(Some(v)) = table.get(size) {
        return Some(*v);
    }
    let known: Vec<(f64, f64)> = table.iter().enumerate().filter_map(|(m, v)| v.map(|v| (m as f64, v))).collect();
    let x = size as f64;
    let below = known.iter().rev().find(|p| p.0 < x);
    let above = known.iter().find(|p| p.0 > x);
    let (a, b) = match (below, above) {
        (Some(&a), Some(&b)) => (a, b),
        (Some(_), None) if known.len() >= 2 => (known[known.len() - 2], known[known.len() - 1]),
        (None, Some(_)) if known.len() >= 2 => (known[0], known[1]),
        _ => {
            let &(m, v) = below.or(above)?;
            return Some(v * x / m.max(1.0));
        }
    };
    let slope = ((b.1 - a.1) / (b.0 - a.0)).max(0.0);
    Some((a.1 + slope * (x - a.0)).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T(m) of a pass that streams its weights in 10 ms, then turns compute-bound at 4 rows.
    fn costs(draft_ms: f64) -> BatchCosts {
        let mut c = BatchCosts::default();
        for m in [1, 2, 4, 8, 16, 32, 64, 128] {
            c.observe_target(m, 0.010f64.max(0.0025 * m as f64));
        }
        for b in [1, 8] {
            c.observe_draft(b, draft_ms / 1000.0 * (1.0 + 0.1 * b as f64));
        }
        c
    }

    #[test]
    fn estimates_follow_the_measured_points() {
        let c = costs(1.0);
        assert_eq!(c.target_secs(8), Some(0.02));
        assert!((c.target_secs(12).unwrap_or(0.0) - 0.03).abs() < 1e-12);
        assert!((c.target_secs(256).unwrap_or(0.0) - 0.64).abs() < 1e-9);
        assert_eq!(BatchCosts::default().target_secs(3), None);
        assert_eq!(BatchCosts::default().draft_secs(3), 0.0);
    }

    #[test]
    fn speculation_shrinks_as_the_batch_grows() {
        let c = costs(1.0);
        let ks = |b: usize| c.choose(&vec![0.8; b], &vec![8; b]);
        let one: usize = ks(1).iter().sum();
        let sixteen = ks(16);
        assert!(one >= 3, "batch 1 drafts {one}");
        assert!(sixteen.iter().all(|&k| k == 0), "batch 16 drafts {sixteen:?}");
    }

    #[test]
    fn sequences_that_reject_draft_less() {
        let c = costs(1.0);
        let ks = c.choose(&[0.95, 0.1], &[8, 8]);
        assert!(ks[0] > ks[1], "{ks:?}");
        // Limits hold, and nothing is drafted before T is measured.
        assert!(c.choose(&[0.9, 0.9], &[1, 0]).iter().zip([1, 0]).all(|(k, l)| *k <= l));
        assert_eq!(BatchCosts::default().choose(&[0.9], &[4]), vec![0]);
    }

    #[test]
    fn settings_are_checked() {
        assert!(BatchPolicy::Fixed(33).check().is_err());
        assert!(BatchPolicy::Adaptive { max_k: 4 }.check().is_ok());
        assert_eq!(BatchPolicy::default().max_k(), 6);
    }
}
