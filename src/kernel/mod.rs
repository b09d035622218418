//! The accept/reject rule of speculative decoding, on probability rows.
//!
//! A drafted token `t ~ q` is accepted with probability `min(1, p(t)/q(t))`; at the first
//! rejection a replacement is drawn from the residual `max(0, p - q) / Σ`; when all drafted
//! tokens pass, one bonus token is drawn from the target's next row. The emitted token at each
//! position is then distributed exactly as `p` (Leviathan et al. 2023, Chen et al. 2023):
//! `P(emit t) = min(p(t), q(t)) + max(0, p(t) - q(t)) = p(t)`.
//!
//! [`verify_tree`] applies the same rule to a tree of drafts (see the `tree` module's proof).
//! [`Noise`](crate::sampling::Noise) is the coupled alternative: every draw fixed by the seed
//! and the position, so that speculative output equals plain output token for token.
//!
//! Everything here is pure: slices in, a decision out, the random number generator passed in.
//! Rows need not be normalized: `p` and `q` are divided by their own sums (taken in f64), so the
//! identity above holds to f64 rounding whatever the f32 rows sum to.

use rand::{Rng, RngExt};

use crate::error::{Error, Result};
use crate::sampling::sample_weighted;

mod tree;

pub use tree::{children, tree_emission_probabilities, verify_tree, verify_tree_greedy, TreeNode, TreeVerdict};

/// The draft's distribution at one position.
#[derive(Debug, Clone, Copy)]
pub enum DraftRow<'a> {
    /// A full probability row `q`, from which the drafted token was sampled.
    Dense(&'a [f32]),
    /// A deterministic proposal (n-gram lookup, greedy draft): `q` is a point mass on the
    /// drafted token. It is accepted with probability `p(t)`; the residual is `p` without `t`.
    Point,
}

impl DraftRow<'_> {
    /// `q(i)` normalized, for a drafted `token`.
    fn prob(&self, i: usize, token: usize, q_total: f64) -> f64 {
        match self {
            DraftRow::Dense(q) => q[i] as f64 / q_total,
            DraftRow::Point => f64::from(u8::from(i == token)),
        }
    }

    fn total(&self) -> f64 {
        match self {
            DraftRow::Dense(q) => q.iter().map(|&x| x as f64).sum(),
            DraftRow::Point => 1.0,
        }
    }
}

/// The outcome at one drafted position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// The drafted token stands.
    Accept,
    /// The drafted token is replaced by this one, drawn from the residual; the block ends here.
    Reject(u32),
}

/// The outcome of verifying a block: `tokens` is the accepted prefix of the draft followed by one
/// more token (the residual draw at the first rejection, or the bonus token after a full accept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// How many drafted tokens were accepted.
    pub accepted: usize,
    /// The tokens to emit: `accepted + 1` of them.
    pub tokens: Vec<u32>,
}

/// `min(1, p(t)/q(t))` with both rows normalized by their f64 sums.
///
/// A token the target gives zero probability is never accepted; a token with `q(t) = 0` (which a
/// correct drafter cannot produce) is accepted iff `p(t) > 0`.
pub fn accept_probability(p: &[f32], q: DraftRow, token: u32) -> f64 {
    Totals::of(p, q).accept(p, q, token as usize)
}

/// The residual weights `max(0, p - q)` (not normalized), with both rows normalized first.
/// When they sum to zero (p and q agree), the target row `p` itself is the fallback.
pub fn residual_weights(p: &[f32], q: DraftRow, token: u32) -> Vec<f64> {
    let totals = Totals::of(p, q);
    let weights: Vec<f64> = (0..p.len()).map(|i| totals.residual(p, q, i, token as usize)).collect();
    if weights.iter().sum::<f64>() > 0.0 {
        weights
    } else {
        p.iter().map(|&x| x as f64 / totals.p).collect()
    }
}

/// The sums that normalize a pair of rows, computed once per judged position.
#[derive(Clone, Copy)]
struct Totals {
    p: f64,
    q: f64,
}

impl Totals {
    fn of(p: &[f32], q: DraftRow) -> Self {
        Self { p: row_total(p), q: q.total() }
    }

    fn accept(&self, p: &[f32], q: DraftRow, t: usize) -> f64 {
        let p_t = p[t] as f64 / self.p;
        let q_t = q.prob(t, t, self.q);
        if q_t <= 0.0 {
            return if p_t > 0.0 { 1.0 } else { 0.0 };
        }
        (p_t / q_t).min(1.0)
    }

    fn residual(&self, p: &[f32], q: DraftRow, i: usize, token: usize) -> f64 {
        (p[i] as f64 / self.p - q.prob(i, token, self.q)).max(0.0)
    }
}

/// Judges one drafted `token` against the target row `p` and the draft row `q`.
///
/// # Errors
/// [`Error::TokenOutOfRange`] when the token or the rows do not fit together;
/// [`Error::EmptyDistribution`] when `p` has no mass.
pub fn judge<R: Rng + ?Sized>(p: &[f32], q: DraftRow, token: u32, rng: &mut R) -> Result<Judgement> {
    check_rows(p, q, token)?;
    let (totals, t) = (Totals::of(p, q), token as usize);
    if rng.random::<f64>() < totals.accept(p, q, t) {
        return Ok(Judgement::Accept);
    }
    // Draw from the residual in two passes over the rows, without materializing it.
    let mass: f64 = (0..p.len()).map(|i| totals.residual(p, q, i, t)).sum();
    if mass > 0.0 {
        return Ok(Judgement::Reject(sample_weighted((0..p.len()).map(|i| totals.residual(p, q, i, t)), mass, rng)));
    }
    Ok(Judgement::Reject(sample_weighted(p.iter().map(|&x| x as f64), totals.p, rng)))
}

/// Verifies `drafted` (sampled from the rows `q`) against the target's rows.
///
/// `target_row(i, buf)` writes the target's probability row for position `i` (0..=drafted.len())
/// into `buf`; it is called only for the positions that are reached, so a caller can compute rows
/// lazily. Row `drafted.len()` is the bonus row.
///
/// # Errors
/// Whatever `target_row` returns, and the errors of [`judge`].
pub fn verify_block<R, F>(drafted: &[u32], q: &[DraftRow], mut target_row: F, rng: &mut R) -> Result<Verdict>
where
    R: Rng + ?Sized,
    F: FnMut(usize, &mut Vec<f32>) -> Result<()>,
{
    if q.len() != drafted.len() {
        return Err(Error::BadModelOutput { model: "draft", what: "rows", expected: drafted.len(), got: q.len() });
    }
    let mut p = Vec::new();
    let mut tokens = Vec::with_capacity(drafted.len() + 1);
    for (i, (&t, &q_i)) in drafted.iter().zip(q).enumerate() {
        target_row(i, &mut p)?;
        match judge(&p, q_i, t, rng)? {
            Judgement::Accept => tokens.push(t),
            Judgement::Reject(r) => {
                tokens.push(r);
                return Ok(Verdict { accepted: i, tokens });
            }
        }
    }
    target_row(drafted.len(), &mut p)?;
    tokens.push(crate::sampling::sample(&p, rng)?);
    Ok(Verdict { accepted: drafted.len(), tokens })
}

/// Greedy verification: a drafted token stands iff it is the target's argmax at its position; at
/// the first mismatch (or after the last drafted token) the target's argmax is emitted.
/// `target_argmax(i)` gives the argmax of row `i` and is called only for the positions reached.
///
/// # Errors
/// Whatever `target_argmax` returns.
pub fn verify_greedy<F>(drafted: &[u32], mut target_argmax: F) -> Result<Verdict>
where
    F: FnMut(usize) -> Result<u32>,
{
    let mut tokens = Vec::with_capacity(drafted.len() + 1);
    for (i, &t) in drafted.iter().enumerate() {
        let best = target_argmax(i)?;
        tokens.push(best);
        if best != t {
            return Ok(Verdict { accepted: i, tokens });
        }
    }
    tokens.push(target_argmax(drafted.len())?);
    Ok(Verdict { accepted: drafted.len(), tokens })
}

fn row_total(p: &[f32]) -> f64 {
    crate::math::sum(p)
}

fn check_rows(p: &[f32], q: DraftRow, token: u32) -> Result<()> {
    if let DraftRow::Dense(q) = q {
        if q.len() != p.len() {
            return Err(Error::BadModelOutput { model: "draft", what: "row length", expected: p.len(), got: q.len() });
        }
    }
    if token as usize >= p.len() {
        return Err(Error::TokenOutOfRange { token, vocab: p.len() });
    }
    let total = row_total(p);
    if total.is_nan() || total <= 0.0 {
        return Err(Error::EmptyDistribution);
    }
    Ok(())
}

/// The probability that `judge` emits each token, computed analytically:
/// `q(t)·a(t) + P(reject)·residual(t)`. Equal to `p` (normalized) by the theorem; exposed so that
/// tests can check the identity on arbitrary rows.
pub fn emission_probabilities(p: &[f32], q: DraftRow, drafted: u32) -> Vec<f64> {
    let mut out = vec![0.0; p.len()];
    let candidates: Vec<u32> = match q {
        DraftRow::Dense(_) => (0..p.len() as u32).collect(),
        DraftRow::Point => vec![drafted],
    };
    let q_total = q.total();
    for t in candidates {
        let q_t = q.prob(t as usize, drafted as usize, q_total);
        if q_t == 0.0 {
            continue;
        }
        let a = accept_probability(p, q, t);
        out[t as usize] += q_t * a;
        let weights = residual_weights(p, q, t);
        let total: f64 = weights.iter().sum();
        for (o, w) in out.iter_mut().zip(&weights) {
            *o += q_t * (1.0 - a) * w / total;
        }
    }
    out
}

/// The probability that a token drafted from `q` is accepted: `Σ min(p, q)` (normalized rows).
pub fn acceptance_rate(p: &[f32], q: &[f32]) -> f64 {
    let (pt, qt) = (row_total(p), row_total(q));
    p.iter().zip(q).map(|(&a, &b)| (a as f64 / pt).min(b as f64 / qt)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn point_mass_accepts_with_p_and_residual_drops_the_token() {
        let p = [0.5f32, 0.3, 0.2];
        assert!((accept_probability(&p, DraftRow::Point, 1) - 0.3).abs() < 1e-7);
        let r = residual_weights(&p, DraftRow::Point, 1);
        assert_eq!(r[1], 0.0);
        assert!((r[0] - 0.5).abs() < 1e-7 && (r[2] - 0.2).abs() < 1e-7);
    }

    #[test]
    fn equal_rows_always_accept_and_residual_falls_back_to_p() {
        let p = [0.25f32, 0.75];
        assert_eq!(accept_probability(&p, DraftRow::Dense(&p), 0), 1.0);
        let r = residual_weights(&p, DraftRow::Dense(&p), 0);
        assert!((r[1] - 0.75).abs() < 1e-12);
    }

    #[test]
    fn zero_target_probability_is_never_accepted() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..1000 {
            assert_eq!(judge(&[0.0, 1.0], DraftRow::Dense(&[1.0, 0.0]), 0, &mut rng).unwrap(), Judgement::Reject(1));
        }
    }

    #[test]
    fn greedy_stops_at_first_mismatch() {
        let argmax = [3u32, 1, 4, 1];
        let v = verify_greedy(&[3, 1, 5], |i| Ok(argmax[i])).unwrap();
        assert_eq!(v, Verdict { accepted: 2, tokens: vec![3, 1, 4] });
        let v = verify_greedy(&[3, 1, 4], |i| Ok(argmax[i])).unwrap();
        assert_eq!(v, Verdict { accepted: 3, tokens: vec![3, 1, 4, 1] });
    }

    #[test]
    fn misfit_rows_are_errors() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert!(matches!(judge(&[1.0], DraftRow::Point, 3, &mut rng), Err(Error::TokenOutOfRange { .. })));
        assert!(matches!(judge(&[1.0, 0.0], DraftRow::Dense(&[1.0]), 0, &mut rng), Err(Error::BadModelOutput { .. })));
        assert!(matches!(judge(&[0.0, 0.0], DraftRow::Point, 0, &mut rng), Err(Error::EmptyDistribution)));
    }
}
