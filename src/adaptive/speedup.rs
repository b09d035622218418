//! The arithmetic of choosing k: the expected speedup of a block length under the geometric
//! acceptance model with measured costs, and the best block length. Pure functions of numbers.

use crate::stats::expected_tokens_per_call;

/// Expected speedup over plain decoding of a round drafting `k` tokens:
/// `E[tokens](k, α) · T(1) / (k·draft_secs + T(k + 1))`, where `verify_secs[m − 1]` is T(m).
/// With T(m) = 1 for all m and draft_secs = c this is the seed's S(k, α, c). 0 when
/// `verify_secs` holds no T(k + 1).
pub fn expected_speedup(k: usize, alpha: f64, draft_secs: f64, verify_secs: &[f64]) -> f64 {
    match (verify_secs.first(), verify_secs.get(k)) {
        (Some(&one), Some(&rows)) => {
            let cost = (k as f64 * draft_secs + rows).max(f64::MIN_POSITIVE);
            expected_tokens_per_call(k as f64, alpha) * one / cost
        }
        _ => 0.0,
    }
}

/// The k in `0..verify_secs.len()` with the highest [`expected_speedup`]; the smaller on ties.
pub fn best_k(alpha: f64, draft_secs: f64, verify_secs: &[f64]) -> usize {
    let speedups = (0..verify_secs.len()).map(|k| (k, expected_speedup(k, alpha, draft_secs, verify_secs)));
    let (k, s) = speedups.fold((0, f64::NEG_INFINITY), |best, (k, s)| if s > best.1 { (k, s) } else { best });
    // Speculate only for a clear gain: the estimates are noisy, and a marginal call that
    // loses a little every round is what makes users find speculation slower than plain.
    if s < MIN_GAIN * expected_speedup(0, alpha, draft_secs, verify_secs) {
        0
    } else {
        k
    }
}

/// The expected speedup over plain decoding below which [`best_k`] stays plain.
pub const MIN_GAIN: f64 = 1.03;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::predicted_speedup;

    #[test]
    fn speedup_with_flat_verification_is_the_seed_formula() {
        let flat = [1.0; 9];
        for k in 0..=8 {
            for (alpha, c) in [(0.5, 0.05), (0.8, 0.15), (0.95, 0.3)] {
                let s = expected_speedup(k, alpha, c, &flat);
                assert!((s - predicted_speedup(k as f64, alpha, c)).abs() < 1e-12, "k {k}, α {alpha}, c {c}");
            }
        }
        assert_eq!(expected_speedup(0, 0.3, 5.0, &[2.0, 3.0]), 1.0, "a plain step is the unit");
        assert_eq!(expected_speedup(2, 0.3, 5.0, &[2.0, 3.0]), 0.0, "no T(3), no estimate");
    }

    #[test]
    fn best_k_is_the_interior_optimum() {
        // The seed's Section 3.5 setting: c = 0.15; brute force over the closed form.
        let flat = [1.0; 11];
        for alpha in [0.3, 0.5, 0.7, 0.8, 0.9, 0.97] {
            let brute = (0..=10).max_by(|&a, &b| {
                predicted_speedup(a as f64, alpha, 0.15).total_cmp(&predicted_speedup(b as f64, alpha, 0.15))
            });
            assert_eq!(Some(best_k(alpha, 0.15, &flat)), brute, "α {alpha}");
        }
        assert_eq!(best_k(0.8, 0.15, &flat), 5);
        // Costly verification shortens the block; a poor draft is not worth a call.
        let steep: Vec<f64> = (0..11).map(|i| 1.0 + 0.5 * i as f64).collect();
        assert!(best_k(0.8, 0.15, &steep) < 5);
        assert_eq!(best_k(0.1, 0.3, &flat), 0);
        assert_eq!(best_k(1.0, 0.0, &flat), 10);
    }
}
