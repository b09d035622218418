//! Training draft heads by self-distillation, with candle's autograd: the target's own states
//! and top-1 predictions along sequences are the data ([`Sample`]), a head's weights are
//! variables under the names its published format uses ([`Trainable`]), and [`fit`] runs AdamW
//! over a loss ([`eagle_loss`], [`medusa_loss`]).
//!
//! The softmax of the losses runs over a [`Vocab`]: the tokens the data holds or the target
//! predicts. For EAGLE-3 that is the head's own draft vocabulary (`d2t`); for EAGLE-1 and
//! Medusa, whose output head is the target's, it only makes training cheaper (drafting uses
//! the whole vocabulary).

mod loss;
mod trainable;

pub use loss::{eagle_accuracy, eagle_loss, medusa_accuracy, medusa_loss};
pub use trainable::{HeadKind, Trainable};

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::error::{Error, Result};
use crate::heads::target::TargetParts;
use crate::model::TokenModel;
use crate::models::features::interleave;
use crate::models::{Llama, Tap, TappedPass};
use crate::sampling::argmax;

/// One training sequence: its tokens, the target's states after each `(n, width)`, and the
/// target's top-1 prediction after each.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The tokens.
    pub tokens: Vec<u32>,
    /// The target's states at the head's taps, concatenated per token.
    pub states: Tensor,
    /// The target's most likely next token after each token.
    pub labels: Vec<u32>,
    /// How many leading tokens are the prompt (0 when unknown): accuracy counts guesses of the
    /// target's own tokens after it, not of a chat template a head learns by heart.
    pub prompt_len: usize,
}

impl Sample {
    /// Runs `target` over `tokens` from an empty context and records its states at `taps`
    /// and its top-1 predictions.
    ///
    /// # Errors
    /// Model failures; [`Error::InvalidSetting`] for fewer than three tokens.
    pub fn record(target: &mut Llama, tokens: &[u32], taps: &[Tap]) -> Result<Self> {
        if tokens.len() < 3 {
            return Err(Error::setting("training sequence", tokens.len(), "three tokens or more"));
        }
        target.truncate(0)?;
        let TappedPass { logits, hidden: states } = target.forward_hidden(tokens, tokens.len(), taps)?;
        let labels = (0..logits.rows()).map(|r| argmax(logits.row(r))).collect::<Result<_>>()?;
        let width = taps.len() * target.config().hidden_size;
        let states = Tensor::from_vec(interleave(states, tokens.len()), (tokens.len(), width), &Device::Cpu)?;
        target.truncate(0)?;
        Ok(Self { tokens: tokens.to_vec(), states, labels, prompt_len: 0 })
    }
}

/// The tokens a training softmax runs over (ascending), and each token's index among them.
#[derive(Debug, Clone)]
pub struct Vocab {
    tokens: Vec<u32>,
    index: HashMap<u32, u32>,
}

impl Vocab {
    /// The tokens `samples` hold or predict.
    pub fn of(samples: &[Sample]) -> Self {
        let mut tokens: Vec<u32> = samples.iter().flat_map(|s| s.tokens.iter().chain(&s.labels).copied()).collect();
        tokens.sort_unstable();
        tokens.dedup();
        let index = tokens.iter().enumerate().map(|(i, &t)| (t, i as u32)).collect();
        Self { tokens, index }
    }

    /// The tokens, ascending.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// `labels` as indices into the vocabulary (tokens outside it map to 0).
    pub fn remap(&self, labels: &[u32]) -> Vec<u32> {
        labels.iter().map(|t| self.index.get(t).copied().unwrap_or(0)).collect()
    }

    /// The target's parts with the output head cut to these tokens' rows.
    ///
    /// # Errors
    /// Backend failures.
    pub fn cut(&self, parts: &TargetParts) -> Result<TargetParts> {
        let rows = Tensor::new(&self.tokens[..], parts.output.device())?;
        Ok(TargetParts { output: parts.output.index_select(&rows, 0)?, ..parts.clone() })
    }
}

/// How [`fit`] trains.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainOptions {
    /// Passes over the samples.
    pub epochs: usize,
    /// Peak learning rate (linear warm-up over 5 % of the steps, then linear decay to 10 %).
    pub lr: f64,
    /// Drafting depths an EAGLE loss unrolls.
    pub unroll: usize,
    /// Weight of the cross-entropy beside EAGLE-1's feature regression (EAGLE uses 0.1).
    pub ce_weight: f64,
    /// Half-width of the uniform noise on the target states an EAGLE head reads.
    pub noise: f64,
    /// Score EAGLE-1 and Medusa heads against the target's whole next-token distribution
    /// (computed from its recorded states) rather than its top-1 alone: more to learn from
    /// per token.
    pub soft: bool,
    /// Seed of the shuffling and the noise.
    pub seed: u64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self { epochs: 4, lr: 1e-3, unroll: 2, ce_weight: 0.1, noise: 0.05, soft: true, seed: 7 }
    }
}

/// Trains `head` with AdamW on `samples` in shuffled order, `loss` scoring one sample (given
/// its index); calls `on_epoch(epoch, mean loss)` after each pass.
///
/// # Errors
/// Backend failures, and whatever `on_epoch` returns.
pub fn fit(
    head: &Trainable,
    samples: usize,
    o: &TrainOptions,
    mut loss: impl FnMut(usize, &mut StdRng) -> Result<Tensor>,
    mut on_epoch: impl FnMut(usize, f64) -> Result<()>,
) -> Result<()> {
    let params = ParamsAdamW { lr: o.lr, beta1: 0.9, beta2: 0.95, weight_decay: 0.0, ..ParamsAdamW::default() };
    let mut opt = AdamW::new(head.vars.all_vars(), params)?;
    let mut rng = StdRng::seed_from_u64(o.seed);
    let total = (o.epochs * samples).max(1);
    let warm = (total / 20).max(1);
    for epoch in 0..o.epochs {
        let mut order: Vec<usize> = (0..samples).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let mut sum = 0.0;
        for (n, &i) in order.iter().enumerate() {
            let step = epoch * samples + n;
            let lr = if step < warm {
                o.lr * (step + 1) as f64 / warm as f64
            } else {
                o.lr * (1.0 - 0.9 * (step - warm) as f64 / (total - warm).max(1) as f64)
            };
            opt.set_learning_rate(lr);
            let l = loss(i, &mut rng)?;
            sum += f64::from(l.to_scalar::<f32>()?);
            opt.backward_step(&l)?;
        }
        on_epoch(epoch, sum / samples.max(1) as f64)?;
    }
    Ok(())
}
