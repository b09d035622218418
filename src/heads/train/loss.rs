//! The training losses of each head kind, and held-out accuracy.

use candle_core::{DType, Tensor, D};
use rand::rngs::StdRng;
use rand::RngExt;

use crate::error::Result;
use crate::heads::eagle::{EagleHead, EagleVersion};
use crate::heads::medusa::MedusaHead;
use crate::models::Linear;
use crate::sampling::argmax;

use super::{Sample, TrainOptions};

fn cross_entropy(logits: &Tensor, labels: &[u32]) -> Result<Tensor> {
    let target = Tensor::new(labels, logits.device())?;
    Ok(candle_nn::loss::cross_entropy(logits, &target)?)
}

/// Cross-entropy of `logits` against the distributions `softmax(teacher)`, row by row (the
/// teacher carries no gradient).
fn soft_cross_entropy(logits: &Tensor, teacher: &Tensor) -> Result<Tensor> {
    let p = candle_nn::ops::softmax_last_dim(&teacher.detach())?;
    let log_q = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    Ok((p * log_q)?.sum(D::Minus1)?.mean_all()?.neg()?)
}

/// EAGLE's loss on one sample: the cross-entropy of each unrolled depth against the target
/// (EAGLE-1 with `soft`: its next-token distribution, from its recorded state through the
/// head's own output head, which is the target's; else its top-1 `labels`, as indices into the
/// head's softmax), weighted 0.8 per depth and by `ce_weight`, plus for EAGLE-1 the smooth-L1
/// distance of depth 1's states to the target's.
///
/// # Errors
/// Backend failures.
pub fn eagle_loss(head: &EagleHead, s: &Sample, labels: &[u32], o: &TrainOptions, rng: &mut StdRng) -> Result<Tensor> {
    let n = s.tokens.len();
    let a = o.noise as f32;
    let noise: Vec<f32> =
        (0..s.states.elem_count()).map(|_| if a > 0.0 { rng.random_range(-a..a) } else { 0.0 }).collect();
    let noise = Tensor::from_vec(noise, s.states.shape(), s.states.device())?;
    let levels = head.unroll(&s.tokens, &(&s.states + noise)?, o.unroll.min(n - 2).max(1))?;
    let mut loss = match head.version() {
        EagleVersion::One => candle_nn::loss::huber(&levels[0], &s.states.narrow(0, 1, n - 1)?, 1.0)?,
        EagleVersion::Three => Tensor::zeros((), DType::F32, s.states.device())?,
    };
    let one = head.version() == EagleVersion::One;
    let weight = if one { o.ce_weight } else { 1.0 };
    for (d, level) in levels.iter().enumerate() {
        let rows = n - 1 - d;
        let logits = head.draft_logits(&level.narrow(0, 0, rows)?)?;
        // Row j guesses the token after token j + d + 1, which the target's state there scores.
        let ce = match o.soft && one {
            true => soft_cross_entropy(&logits, &head.draft_logits(&s.states.narrow(0, d + 1, rows)?)?)?,
            false => cross_entropy(&logits, &labels[d + 1..])?,
        };
        loss = (loss + (ce * (weight * 0.8f64.powi(d as i32)))?)?;
    }
    Ok(loss)
}

/// Medusa's loss on one sample: head `i` reads the state after token `j` and is scored against
/// the target's next-token distribution after token `j + i + 1` (`teacher`, the target's output
/// head, applied to its state there; with `soft` off, its top-1 `labels`), weighted 0.8 per
/// head.
///
/// # Errors
/// Backend failures.
pub fn medusa_loss(
    head: &MedusaHead,
    teacher: &Linear,
    s: &Sample,
    labels: &[u32],
    o: &TrainOptions,
) -> Result<Tensor> {
    let mut loss = Tensor::zeros((), DType::F32, s.states.device())?;
    for i in 0..head.len() {
        let rows = s.tokens.len().saturating_sub(i + 1);
        if rows > 0 {
            let logits = head.forward(i, &s.states.narrow(0, 0, rows)?)?;
            let ce = match o.soft {
                true => soft_cross_entropy(&logits, &teacher.forward(&s.states.narrow(0, i + 1, rows)?)?)?,
                false => cross_entropy(&logits, &labels[i + 1..])?,
            };
            loss = (loss + (ce * 0.8f64.powi(i as i32))?)?;
        }
    }
    Ok(loss)
}

/// Top-1 agreement with the target at EAGLE drafting depths `1..=depth` over `samples`, on the
/// guesses of tokens after each sample's prompt.
///
/// # Errors
/// Backend failures.
pub fn eagle_accuracy(head: &EagleHead, samples: &[Sample], depth: usize) -> Result<Vec<f64>> {
    let mut counts = vec![(0usize, 0usize); depth];
    for s in samples {
        let levels = head.unroll(&s.tokens, &s.states, depth)?;
        for (d, level) in levels.iter().enumerate() {
            let rows = s.tokens.len().saturating_sub(1 + d);
            if rows > 0 {
                // Row j guesses token j + d + 2.
                let best = head.logits(&level.narrow(0, 0, rows)?)?;
                let skip = s.prompt_len.saturating_sub(d + 2);
                add_hits(&mut counts[d], best.iter().map(|r| argmax(r)).skip(skip), &s.labels[d + 1 + skip..])?;
            }
        }
    }
    Ok(counts.iter().map(|&(h, a)| h as f64 / a.max(1) as f64).collect())
}

/// Top-1 agreement with the target of each Medusa head over `samples`, on the guesses of
/// tokens after each sample's prompt.
///
/// # Errors
/// Backend failures.
pub fn medusa_accuracy(head: &MedusaHead, samples: &[Sample]) -> Result<Vec<f64>> {
    let mut counts = vec![(0usize, 0usize); head.len()];
    for s in samples {
        for (i, c) in counts.iter_mut().enumerate() {
            let rows = s.tokens.len().saturating_sub(i + 1);
            if rows > 0 {
                // Row j guesses token j + i + 2.
                let best = head.logits(i, &s.states.narrow(0, 0, rows)?)?;
                let skip = s.prompt_len.saturating_sub(i + 2);
                add_hits(c, best.iter().map(|r| argmax(r)).skip(skip), &s.labels[i + 1 + skip..])?;
            }
        }
    }
    Ok(counts.iter().map(|&(h, a)| h as f64 / a.max(1) as f64).collect())
}

fn add_hits(count: &mut (usize, usize), best: impl Iterator<Item = Result<u32>>, labels: &[u32]) -> Result<()> {
    for (b, &l) in best.zip(labels) {
        count.0 += usize::from(b? == l);
        count.1 += 1;
    }
    Ok(())
}
