//! Coupled sampling: every token drawn from noise fixed by the seed and the token's position,
//! so that speculative decoding emits the very tokens plain decoding would, whatever the draft.
//!
//! At each position of a generation, token `t` gets a uniform `U_t` that depends only on the
//! key (the seed and the generation's index) and the position. The token sampled from a row
//! `p` is the winner of an *exponential race*: the `t` that minimises `E_t / p(t)` with
//! `E_t = −ln U_t`. `E_t / p(t)` is exponential with rate `p(t)`, and the smallest of
//! independent exponentials is the one of rate `p(t)` with probability `p(t) / Σp`: the race
//! samples `p` exactly. (It is the Gumbel-max trick, `argmax ln p(t) − ln E_t`, without a
//! second logarithm.)
//!
//! A draft proposes the winner of the race on its own row `q` with the *same* noise; the
//! target's winner on `p` at that position is what plain decoding emits there. A drafted token
//! stands while it equals the target's winner; at the first difference the target's winner is
//! emitted and the block ends; after a fully accepted block the bonus is the target's winner at
//! the next position. So the emitted tokens are, by construction, those of plain decoding with
//! the same key, for any draft, k, or batch: the verification is [`verify_greedy`] with the
//! race in place of the argmax. The price is acceptance: the draft and the target agree under
//! shared noise with probability at least `(1 − TV)/(1 + TV)` (TV their total variation
//! distance) where `min(1, p/q)` accepts with probability `1 − TV`.
//!
//! [`verify_greedy`]: crate::kernel::verify_greedy

use crate::error::{Error, Result};

/// The splitmix64 output function (Steele, Lea and Flood 2014): a bijection of `u64` whose
/// outputs on consecutive counters pass BigCrush.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The golden-ratio increment of splitmix64.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The uniform in (0, 1) of `token` in a position's `stream`: splitmix64's output number
/// `token + 1` from that key.
fn uniform(stream: u64, token: u32) -> f64 {
    let bits = mix(stream.wrapping_add((u64::from(token) + 1).wrapping_mul(GAMMA))) >> 11;
    (bits as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

/// The noise of one generation: a counter-based generator, so a token's uniform depends on
/// (seed, generation, position, token) alone and never on how many draws were made before it.
/// (`rand`'s generators are streams; this needs random access, which a keyed hash gives.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Noise {
    key: u64,
}

impl Noise {
    /// The noise of generation number `generation` (counted from 0) of a decoder seeded with
    /// `seed`.
    pub fn new(seed: u64, generation: u64) -> Self {
        Self { key: mix(mix(seed ^ GAMMA).wrapping_add(generation.wrapping_mul(GAMMA))) }
    }

    /// The uniform in (0, 1) of `token` at `position` (the token's index in the context).
    pub fn uniform(&self, position: u64, token: u32) -> f64 {
        uniform(self.stream(position), token)
    }

    /// The key of one position's uniforms.
    fn stream(&self, position: u64) -> u64 {
        mix(self.key ^ mix(position.wrapping_add(GAMMA)))
    }

    /// The winner of the exponential race on `probs` (unnormalized, `>= 0`) at `position`.
    ///
    /// The most likely token runs first, so that most others are ruled out by a comparison:
    /// `t` beats the best score `s` iff `U_t > exp(−p(t)·s)`, and `exp(−x) >= 1 − x`, so
    /// `U_t <= 1 − p(t)·s` rules `t` out without a logarithm. Ties in score (probability zero
    /// for distinct uniforms) go to the token that ran first.
    ///
    /// # Errors
    /// [`Error::EmptyDistribution`] when no entry is positive; [`Error::NonFiniteLogits`] for a
    /// NaN or infinite entry.
    pub fn pick(&self, probs: &[f32], position: u64) -> Result<u32> {
        if let Some((index, &value)) = probs.iter().enumerate().find(|(_, p)| !p.is_finite()) {
            return Err(Error::NonFiniteLogits { index, value });
        }
        let first = (0..probs.len()).max_by(|&a, &b| probs[a].total_cmp(&probs[b]).then(b.cmp(&a)));
        let first = match first {
            Some(t) if probs[t] > 0.0 => t,
            _ => return Err(Error::EmptyDistribution),
        };
        let stream = self.stream(position);
        let score = |t: usize| -uniform(stream, t as u32).ln() / f64::from(probs[t]);
        let (mut best, mut best_score) = (first, score(first));
        for (t, &p) in probs.iter().enumerate() {
            if p <= 0.0 || t == first {
                continue;
            }
            let bound = 1.0 - f64::from(p) * best_score;
            if uniform(stream, t as u32) <= bound {
                continue;
            }
            let s = score(t);
            if s < best_score {
                (best, best_score) = (t, s);
            }
        }
        Ok(best as u32)
    }

    /// The `width` best runners of the race on `probs` at `position`, best first: the first is
    /// [`pick`](Self::pick)'s winner. A coupled draft proposes these as a tree node's children,
    /// the draft's likeliest matches for the target's winner under the same noise. Tokens
    /// ruled out by the same bound as in `pick`, against the worst score kept.
    ///
    /// # Errors
    /// As [`pick`](Self::pick).
    pub fn top(&self, probs: &[f32], position: u64, width: usize) -> Result<Vec<u32>> {
        let first = self.pick(probs, position)? as usize;
        if width <= 1 {
            return Ok(vec![first as u32]);
        }
        let stream = self.stream(position);
        let score = |t: usize| -uniform(stream, t as u32).ln() / f64::from(probs[t]);
        let mut kept: Vec<(f64, usize)> = vec![(score(first), first)];
        for (t, &p) in probs.iter().enumerate() {
            if p <= 0.0 || t == first {
                continue;
            }
            let full = kept.len() == width;
            let worst = kept.last().map_or(f64::INFINITY, |k| k.0);
            if full && uniform(stream, t as u32) <= 1.0 - f64::from(p) * worst {
                continue;
            }
            let s = score(t);
            if full && s >= worst {
                continue;
            }
            // After equal scores: ties go to the token that ran first, as in `pick`.
            let at = kept.partition_point(|k| k.0 <= s).max(1);
            kept.insert(at, (s, t));
            kept.truncate(width);
        }
        Ok(kept.into_iter().map(|(_, t)| t as u32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_depends_on_every_part_of_its_address() {
        let a = Noise::new(7, 0);
        let u = a.uniform(3, 5);
        assert!(u > 0.0 && u < 1.0);
        assert_eq!(u, Noise::new(7, 0).uniform(3, 5));
        for other in [Noise::new(8, 0).uniform(3, 5), Noise::new(7, 1).uniform(3, 5), a.uniform(4, 5), a.uniform(3, 6)]
        {
            assert_ne!(u, other);
        }
    }

    #[test]
    fn pick_matches_the_full_race() {
        // The shortcut must pick exactly what the race over every token picks.
        let probs: Vec<f32> = (0..500).map(|i| ((i * 7919 % 101) as f32 / 100.0).powi(3)).collect();
        let noise = Noise::new(3, 1);
        for position in 0..200 {
            let full = (0..probs.len())
                .filter(|&t| probs[t] > 0.0)
                .min_by(|&a, &b| {
                    let s = |t: usize| -noise.uniform(position, t as u32).ln() / f64::from(probs[t]);
                    s(a).total_cmp(&s(b))
                })
                .map(|t| t as u32);
            assert_eq!(noise.pick(&probs, position).ok(), full);
        }
    }

    #[test]
    fn top_runners_are_the_race_order() {
        let probs: Vec<f32> = (0..300).map(|i| ((i * 7919 % 101) as f32 / 100.0).powi(3)).collect();
        let noise = Noise::new(5, 2);
        for position in 0..100 {
            let mut all: Vec<usize> = (0..probs.len()).filter(|&t| probs[t] > 0.0).collect();
            let s = |t: usize| -noise.uniform(position, t as u32).ln() / f64::from(probs[t]);
            all.sort_by(|&a, &b| s(a).total_cmp(&s(b)));
            let want: Vec<u32> = all.iter().take(4).map(|&t| t as u32).collect();
            let top = noise.top(&probs, position, 4).ok();
            assert_eq!(top.as_deref(), Some(&want[..]));
            assert_eq!(noise.top(&probs, position, 1).ok(), Some(vec![noise.pick(&probs, position).ok().unwrap_or(0)]));
        }
    }

    #[test]
    fn point_masses_and_bad_rows() {
        let noise = Noise::new(0, 0);
        assert_eq!(noise.pick(&[0.0, 0.0, 2.0], 9).ok(), Some(2));
        assert!(matches!(noise.pick(&[0.0, 0.0], 0), Err(Error::EmptyDistribution)));
        assert!(matches!(noise.pick(&[], 0), Err(Error::EmptyDistribution)));
        assert!(matches!(noise.pick(&[0.5, f32::NAN], 0), Err(Error::NonFiniteLogits { .. })));
    }
}
