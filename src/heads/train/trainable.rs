//! A head's weights as trainable variables under their published names.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::error::{Error, Result};
use crate::heads::config::{HeadConfig, HeadFiles};
use crate::heads::eagle::{EagleHead, EagleVersion};
use crate::heads::medusa::MedusaHead;
use crate::heads::target::TargetParts;

use super::Vocab;

/// What a [`Trainable`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
    pub(super) vars: VarMap,
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

/// A (rows, cols) matrix drawn uniformly from ±1/√cols (the usual initialization), from
/// `rng`: seeded, so that a head trained twice on the same data comes out the same (candle's
/// own random initialization cannot be seeded on the CPU).
fn uniform(rows: usize, cols: usize, rng: &mut StdRng) -> Result<Tensor> {
    let bound = (1.0 / cols as f32).sqrt();
    let values: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-bound..bound)).collect();
    Ok(Tensor::from_vec(values, (rows, cols), &Device::Cpu)?)
}

/// The seed of every head's initialization.
const INIT_SEED: u64 = 17;

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
        // The matrices that start random, drawn after the others from one seeded generator.
        let mut random: Vec<(String, usize, usize)> = Vec::new();
        let layer = |prefix: &str, attn_in: usize, random: &mut Vec<(String, usize, usize)>| -> Result<()> {
            let shapes = [
                ("self_attn.q_proj", q, attn_in),
                ("self_attn.k_proj", kv, attn_in),
                ("self_attn.v_proj", kv, attn_in),
                ("self_attn.o_proj", h, q),
                ("mlp.gate_proj", ff, h),
                ("mlp.up_proj", ff, h),
                ("mlp.down_proj", h, ff),
            ];
            random.extend(shapes.map(|(name, out, inp)| (format!("{prefix}.{name}.weight"), out, inp)));
            vb.get_with_hints(h, &format!("{prefix}.post_attention_layernorm.weight"), Init::Const(1.0))?;
            Ok(())
        };
        match kind {
            HeadKind::Eagle(EagleVersion::One) => {
                random.push(("fc.weight".into(), h, 2 * h));
                layer("layers.0", h, &mut random)?;
            }
            HeadKind::Eagle(EagleVersion::Three) => {
                random.push(("fc.weight".into(), h, 3 * h));
                layer("midlayer", 2 * h, &mut random)?;
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
        let mut rng = StdRng::seed_from_u64(INIT_SEED);
        for (name, rows, cols) in random {
            vb.get_with_hints((rows, cols), &name, Init::Const(0.0))?;
            vars.set_one(&name, &uniform(rows, cols, &mut rng)?)?;
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
