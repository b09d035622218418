//! What tool-call speculation saved, and the seed's closed form for what it should save.
//!
//! With T_spec the cost of emitting the speculative call, T_gen the agent's generation time and
//! T_tool the tool's latency, a turn costs T_gen + T_tool serially and, with a hit rate α,
//! E\[T\] = T_spec + T_gen + T_tool − α·min(T_gen, T_tool) with speculation. With ρ = T_tool/T_gen
//! and σ = T_spec/T_gen the speedup is S = (1 + ρ) / (1 + ρ + σ − α·min(1, ρ)).

use rand::{Rng, RngExt};
use serde::Serialize;

use crate::error::{Error, Result};

/// The seed's speedup S(α, ρ, σ) = (1 + ρ) / (1 + ρ + σ − α·min(1, ρ)).
///
/// # Errors
/// [`Error::InvalidSetting`] unless α ∈ [0, 1] and ρ, σ are finite and ≥ 0.
///
/// # Example
/// ```
/// use specdec::tools::speedup;
/// let s = speedup(0.441, 1.0, 0.05)?;
/// assert!((100.0 * (1.0 - 1.0 / s) - 19.6).abs() < 0.05); // the seed's table
/// # Ok::<(), specdec::Error>(())
/// ```
pub fn speedup(alpha: f64, rho: f64, sigma: f64) -> Result<f64> {
    check(alpha, rho, sigma)?;
    Ok(closed_form(alpha, rho, sigma))
}

/// The wall-clock reduction 1 − 1/S at (α, ρ, σ), the figure the seed tabulates.
///
/// # Errors
/// As [`speedup`].
pub fn wall_clock_reduction(alpha: f64, rho: f64, sigma: f64) -> Result<f64> {
    Ok(1.0 - 1.0 / speedup(alpha, rho, sigma)?)
}

/// Monte Carlo estimate of S over `turns` simulated turns (the seed's check): each turn costs
/// σ + max(1, ρ) on a hit (probability α) and σ + 1 + ρ on a miss, in units of T_gen.
///
/// # Errors
/// As [`speedup`], and [`Error::InvalidSetting`] when `turns` is 0.
pub fn simulate_speedup<R: Rng + ?Sized>(alpha: f64, rho: f64, sigma: f64, turns: usize, rng: &mut R) -> Result<f64> {
    check(alpha, rho, sigma)?;
    if turns == 0 {
        return Err(Error::setting("turns", turns, "at least 1"));
    }
    let total: f64 =
        (0..turns).map(|_| sigma + if rng.random::<f64>() < alpha { rho.max(1.0) } else { 1.0 + rho }).sum();
    Ok((1.0 + rho) * turns as f64 / total)
}

fn check(alpha: f64, rho: f64, sigma: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&alpha) {
        return Err(Error::setting("alpha", alpha, "a hit rate in [0, 1]"));
    }
    if !(rho.is_finite() && rho >= 0.0) {
        return Err(Error::setting("rho", rho, "a finite ratio T_tool / T_gen >= 0"));
    }
    if !(sigma.is_finite() && sigma >= 0.0) {
        return Err(Error::setting("sigma", sigma, "a finite ratio T_spec / T_gen >= 0"));
    }
    Ok(())
}

// The denominator is at least 1 for valid inputs, since α·min(1, ρ) ≤ ρ.
fn closed_form(alpha: f64, rho: f64, sigma: f64) -> f64 {
    (1.0 + rho) / (1.0 + rho + sigma - alpha * rho.min(1.0))
}

/// Counters and timings of an agent loop run through an
/// [`Executor`](crate::tools::Executor). Times are in seconds, summed over turns.
///
/// A turn runs from its start (the speculation, or `start_turn`) to the end of `execute`:
/// `spec_secs` up to the dispatch of the speculative call, `gen_secs` from there to `execute`
/// (the agent generating), `wait_secs` inside `execute`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ToolStats {
    /// Calls executed (one per turn).
    pub turns: usize,
    /// Turns with a predicted call.
    pub predictions: usize,
    /// Turns whose predicted call equalled the actual call (Hit@1), run or not.
    pub matches: usize,
    /// Turns served from a speculative result.
    pub hits: usize,
    /// Speculative runs discarded because the actual call differed.
    pub misses: usize,
    /// Predictions not run: the tool is side-effecting or unknown (or no worker could start).
    pub blocked: usize,
    /// Speculative runs started (a worker thread each), counted when they start.
    pub launched: usize,
    /// Matching speculative runs that failed, panicked or timed out (the real call ran).
    pub failed: usize,
    /// Seconds spent predicting and dispatching.
    pub spec_secs: f64,
    /// Seconds between the dispatch and the actual call (the agent's generation).
    pub gen_secs: f64,
    /// Seconds the actual calls' tools took to run (on a hit, the speculative run's time).
    pub tool_secs: f64,
    /// Seconds spent inside `execute`, waiting for a speculative result or running the call.
    pub wait_secs: f64,
}

impl ToolStats {
    /// α_tool: the fraction of turns served from a speculative result. Side-effecting calls
    /// and failed runs lower it, as the seed notes.
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits as f64, self.turns as f64)
    }

    /// Hit@1: the fraction of turns whose prediction was right, whether or not it could run.
    pub fn prediction_accuracy(&self) -> f64 {
        ratio(self.matches as f64, self.turns as f64)
    }

    /// ρ = T_tool / T_gen, measured.
    pub fn rho(&self) -> f64 {
        ratio(self.tool_secs, self.gen_secs)
    }

    /// σ = T_spec / T_gen, measured.
    pub fn sigma(&self) -> f64 {
        ratio(self.spec_secs, self.gen_secs)
    }

    /// What the turns would have taken without speculation: T_gen + T_tool each.
    pub fn serial_secs(&self) -> f64 {
        self.gen_secs + self.tool_secs
    }

    /// What the turns took: T_spec + T_gen + the wait in `execute`.
    pub fn actual_secs(&self) -> f64 {
        self.spec_secs + self.gen_secs + self.wait_secs
    }

    /// Net seconds saved: serial minus actual (negative when speculation cost more than it hid).
    pub fn saved_secs(&self) -> f64 {
        self.serial_secs() - self.actual_secs()
    }

    /// Measured speedup: serial time over actual time (0 before any turn).
    pub fn measured_speedup(&self) -> f64 {
        ratio(self.serial_secs(), self.actual_secs())
    }

    /// The closed form at the measured α, ρ and σ (0 before any turn with generation time).
    pub fn predicted_speedup(&self) -> f64 {
        if self.gen_secs > 0.0 {
            closed_form(self.hit_rate(), self.rho(), self.sigma())
        } else {
            0.0
        }
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn seed_table_values() {
        let pct = |a, r| 100.0 * wall_clock_reduction(a, r, 0.05).unwrap();
        for (a, r, want) in [(0.441, 1.0, 19.6), (0.663, 1.0, 30.7), (0.612, 0.25, 8.2), (0.489, 4.0, 8.8)] {
            assert!((pct(a, r) - want).abs() < 0.05, "α={a} ρ={r}: {} vs {want}", pct(a, r));
        }
        assert!((speedup(0.612, 2.0, 0.05).unwrap() - 1.2305).abs() < 1e-4);
        assert!(speedup(1.1, 1.0, 0.0).is_err() && speedup(0.5, -1.0, 0.0).is_err());
        assert!(speedup(0.5, 1.0, f64::NAN).is_err());
    }

    #[test]
    fn measured_figures_follow_the_counters() {
        let s = ToolStats {
            turns: 4,
            hits: 2,
            gen_secs: 4.0,
            tool_secs: 4.0,
            spec_secs: 0.2,
            wait_secs: 2.0,
            ..Default::default()
        };
        assert_eq!(s.hit_rate(), 0.5);
        assert!((s.measured_speedup() - 8.0 / 6.2).abs() < 1e-12);
        assert!((s.predicted_speedup() - 2.0 / 1.55).abs() < 1e-12);
        assert!((s.saved_secs() - 1.8).abs() < 1e-12);
        assert_eq!(ToolStats::default().measured_speedup(), 0.0);
        let mc = simulate_speedup(0.5, 1.0, 0.05, 10_000, &mut StdRng::seed_from_u64(1)).unwrap();
        assert!((mc - speedup(0.5, 1.0, 0.05).unwrap()).abs() < 0.02);
    }
}
