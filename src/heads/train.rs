//! Training draft heads by self-distillation, with candle's autograd: the target's own states
//! and top-1 predictions along sequences are the data ([`Sample`]), a head's weights are
//! variables under the names its published format uses ([`Trainable`]), and [`fit`] runs AdamW
//! over a loss ([`eagle_loss`], [`medusa_loss`]).
//!
//! The softmax of the losses runs over a [`Vocab`]: the tokens the data holds or the target
//! predicts. For EAGLE-3 that is the head's own draft vocabulary (`d2t`); for EAGLE-1 and
//! Medusa, whose output head is the target's, it only makes training cheaper (drafting uses
//! the whole vocabulary).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Init, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::config::{HeadConfig, HeadFiles};
use super::eagle::{EagleHead, EagleVersion};
use super::features::interleave;
use super::medusa::MedusaHead;
use super::target::{HeadMatrix, TargetParts};
use crate::error::{Error, Result};
use crate::models::{Llama, Tap};
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
        let (logits, states) = target.forward_hidden(tokens, tokens.len(), taps)?;
        let labels = (0..logits.rows()).map(|r| argmax(logits.row(r))).collect::<Result<_>>()?;
        let width = taps.len() * target.config().hidden_size;
        let states = Tensor::from_vec(interleave(&states, tokens.len()), (tokens.len(), width), &Device::Cpu)?;
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

/// What a [`Trainable`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// An EAGLE head of this generation.
    Eagle(EagleVersion),
    /// Medusa-1 heads (this many).
    Medusa(usize),
}

/// A head's weights as trainable variables, named as its published format names them.
pub struct Trainable {
    /// What it is.
    pub kind: HeadKind,
    /// Its `config.json`.
    pub config: HeadConfig,
    vars: VarMap,
    /// Tensors saved but not trained (EAGLE-3's `d2t`).
    fixed: HashMap<String, Tensor>,
    /// The draft vocabulary as `d2t` offsets.
    d2t: Tensor,
}

impl std::fmt::Debug for Trainable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainable").field("kind", &self.kind).field("config", &self.config).finish_non_exhaustive()
    }
}

fn uniform(fan_in: usize) -> Init {
    let bound = (1.0 / fan_in as f64).sqrt();
    Init::Uniform { lo: -bound, up: bound }
}

impl Trainable {
    /// A fresh head of `kind` for `target`. EAGLE-3 heads get `vocab` as their draft
    /// vocabulary, their output head starting from the target's rows for it.
    ///
    /// # Errors
    /// Backend failures; [`Error::InvalidSetting`] for no Medusa heads.
    pub fn new(kind: HeadKind, target: &TargetParts, vocab: &Vocab) -> Result<Self> {
        let t = &target.config;
        let (h, ff) = (t.hidden_size, t.intermediate_size);
        let mut config = HeadConfig {
            hidden_size: h,
            intermediate_size: ff,
            num_attention_heads: t.num_heads,
            num_key_value_heads: Some(t.num_kv_heads),
            head_dim: Some(t.head_dim),
            num_hidden_layers: Some(1),
            rms_norm_eps: t.rms_norm_eps,
            rope_theta: f64::from(t.rope_theta),
            vocab_size: t.vocab_size,
            bias: Some(false),
            ..HeadConfig::default()
        };
        let mut vars = VarMap::new();
        let vb = VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu);
        let mut fixed = HashMap::new();
        let offsets: Vec<i64> = vocab.tokens().iter().enumerate().map(|(i, &t)| i64::from(t) - i as i64).collect();
        let d2t = Tensor::new(&offsets[..], &Device::Cpu)?;
        let (q, kv) = (t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim);
        let layer = |prefix: &str, attn_in: usize| -> Result<()> {
            let shapes = [
                ("self_attn.q_proj", q, attn_in),
                ("self_attn.k_proj", kv, attn_in),
                ("self_attn.v_proj", kv, attn_in),
                ("self_attn.o_proj", h, q),
                ("mlp.gate_proj", ff, h),
                ("mlp.up_proj", ff, h),
                ("mlp.down_proj", h, ff),
            ];
            for (name, out, inp) in shapes {
                vb.get_with_hints((out, inp), &format!("{prefix}.{name}.weight"), uniform(inp))?;
            }
            vb.get_with_hints(h, &format!("{prefix}.post_attention_layernorm.weight"), Init::Const(1.0))?;
            Ok(())
        };
        match kind {
            HeadKind::Eagle(EagleVersion::One) => {
                vb.get_with_hints((h, 2 * h), "fc.weight", uniform(2 * h))?;
                layer("layers.0", h)?;
            }
            HeadKind::Eagle(EagleVersion::Three) => {
                vb.get_with_hints((h, 3 * h), "fc.weight", uniform(3 * h))?;
                layer("midlayer", 2 * h)?;
                for n in ["midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "norm.weight"] {
                    vb.get_with_hints(h, n, Init::Const(1.0))?;
                }
                // The output head starts from the target's own rows for the draft vocabulary.
                let rows = vocab.cut(target)?.output;
                vb.get_with_hints(rows.dims(), "lm_head.weight", Init::Const(0.0))?;
                vars.set_one("lm_head.weight", &rows)?;
                fixed.insert("d2t".to_string(), d2t.clone());
                config.draft_vocab_size = Some(vocab.tokens().len());
            }
            HeadKind::Medusa(count) => {
                if count == 0 {
                    return Err(Error::setting("medusa heads", count, "at least one"));
                }
                for i in 0..count {
                    // Zero blocks start each head as the target's own output head (Medusa's init).
                    vb.get_with_hints((h, h), &format!("{i}.0.linear.weight"), Init::Const(0.0))?;
                    vb.get_with_hints(h, &format!("{i}.0.linear.bias"), Init::Const(0.0))?;
                }
                config.medusa_num_heads = Some(count);
                config.medusa_num_layers = Some(1);
            }
        }
        Ok(Self { kind, config, vars, fixed, d2t })
    }

    /// The head's tensors, as its loader reads them (sharing the variables' storage, so a
    /// head built from them trains).
    pub fn files(&self) -> HeadFiles {
        let mut tensors: HashMap<String, Tensor> = self
            .vars
            .data()
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect())
            .unwrap_or_default();
        tensors.extend(self.fixed.clone());
        HeadFiles { path: "(training)".into(), config: self.config.clone(), tensors }
    }

    /// An EAGLE head over these weights for `target` (`None` for Medusa heads).
    ///
    /// # Errors
    /// As [`EagleHead::load`].
    pub fn eagle(&self, target: &TargetParts) -> Result<Option<EagleHead>> {
        match self.kind {
            HeadKind::Eagle(v) => EagleHead::load(self.files(), v, target, false).map(Some),
            HeadKind::Medusa(_) => Ok(None),
        }
    }

    /// Medusa heads over these weights for `target` (`None` for EAGLE heads).
    ///
    /// # Errors
    /// As [`MedusaHead::load`].
    pub fn medusa(&self, target: &TargetParts) -> Result<Option<MedusaHead>> {
        match self.kind {
            HeadKind::Medusa(_) => MedusaHead::load(self.files(), target, false).map(Some),
            HeadKind::Eagle(_) => Ok(None),
        }
    }

    /// Writes `config.json` and the weights (`model.safetensors`, or
    /// `medusa_lm_head.safetensors` for Medusa) into `dir`; returns the weights' size in bytes.
    /// EAGLE-1 and Medusa heads also get `draft_vocab.safetensors`: their training vocabulary
    /// as `d2t` (EAGLE-3's convention), which this crate's loader uses to cut the output head
    /// to those rows while drafting; other loaders read only the published files.
    ///
    /// # Errors
    /// I/O failures.
    pub fn save(&self, dir: &Path) -> Result<u64> {
        std::fs::create_dir_all(dir)?;
        let file = match self.kind {
            HeadKind::Medusa(_) => "medusa_lm_head.safetensors",
            HeadKind::Eagle(_) => "model.safetensors",
        };
        candle_core::safetensors::save(&self.files().tensors, dir.join(file))?;
        if self.kind != HeadKind::Eagle(EagleVersion::Three) {
            let vocab: HashMap<String, Tensor> = [("d2t".to_string(), self.d2t.clone())].into();
            candle_core::safetensors::save(&vocab, dir.join("draft_vocab.safetensors"))?;
        }
        let mut config =
            serde_json::to_value(&self.config).map_err(|e| Error::setting("head config", e, "serializable"))?;
        config["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
        std::fs::write(dir.join("config.json"), config.to_string())?;
        Ok(std::fs::metadata(dir.join(file))?.len())
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
    teacher: &HeadMatrix,
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
