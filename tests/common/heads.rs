//! Draft-head checkpoints the tests write themselves, in the published formats, with random
//! weights: EAGLE-1 (`fc`, `layers.0.*`), EAGLE-3 (`midlayer.*`, `norm`, `lm_head`, `d2t`,
//! boolean `t2d`) and Medusa-1 (`{i}.{j}.linear.*`, `{i}.{n}.weight`).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::StandardNormal;
use serde_json::json;
use specdec::LlamaConfig;

/// A fresh folder under the target dir's tmp.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

thread_local! {
    /// Tensors drawn so far on this thread: the seed of the next (each test runs on a thread
    /// of its own, so its heads are the same on every run).
    static DRAWN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Seeded normal weights scaled by `scale / √fan_in`.
fn rand(shape: &[usize], scale: f32) -> Tensor {
    let seed = DRAWN.with(|n| n.replace(n.get() + 1));
    let mut rng = StdRng::seed_from_u64(seed);
    let std = scale / (*shape.last().unwrap_or(&1) as f32).sqrt();
    let values: Vec<f32> = (0..shape.iter().product()).map(|_| rng.sample::<f32, _>(StandardNormal) * std).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).expect("tensor")
}

fn ones(n: usize) -> Tensor {
    Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).expect("ones")
}

/// The llama-style head config for target `c` (plus `extra` fields).
fn config(c: &LlamaConfig, extra: serde_json::Value) -> serde_json::Value {
    let mut cfg = json!({
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "vocab_size": c.vocab_size,
    });
    if let (Some(o), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    cfg
}

fn layer(prefix: &str, c: &LlamaConfig, attn_in: usize, t: &mut HashMap<String, Tensor>) {
    let (h, ff) = (c.hidden_size, c.intermediate_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    for (name, out, inp) in [
        ("self_attn.q_proj", q, attn_in),
        ("self_attn.k_proj", kv, attn_in),
        ("self_attn.v_proj", kv, attn_in),
        ("self_attn.o_proj", h, q),
        ("mlp.gate_proj", ff, h),
        ("mlp.up_proj", ff, h),
        ("mlp.down_proj", h, ff),
    ] {
        t.insert(format!("{prefix}.{name}.weight"), rand(&[out, inp], 1.0));
    }
    t.insert(format!("{prefix}.post_attention_layernorm.weight"), ones(h));
}

fn write(dir: &Path, file: &str, cfg: &serde_json::Value, tensors: &HashMap<String, Tensor>) {
    std::fs::write(dir.join("config.json"), cfg.to_string()).expect("config");
    candle_core::safetensors::save(tensors, dir.join(file)).expect("safetensors");
}

/// An EAGLE-1 head for target `c` in `dir` (with `fc.bias` when `bias`).
pub fn write_eagle1(dir: &Path, c: &LlamaConfig, bias: bool) {
    let h = c.hidden_size;
    let mut t = HashMap::new();
    t.insert("fc.weight".to_string(), rand(&[h, 2 * h], 1.0));
    if bias {
        t.insert("fc.bias".to_string(), rand(&[h], 0.1));
    }
    layer("layers.0", c, h, &mut t);
    write(dir, "model.safetensors", &config(c, json!({})), &t);
}

/// An EAGLE-3 head for target `c` in `dir` over a draft vocabulary of the `draft_vocab`
/// tokens `used` (ascending), with `d2t` and a boolean `t2d`.
pub fn write_eagle3(dir: &Path, c: &LlamaConfig, used: &[u32]) {
    let h = c.hidden_size;
    let mut t = HashMap::new();
    t.insert("fc.weight".to_string(), rand(&[h, 3 * h], 1.0));
    layer("midlayer", c, 2 * h, &mut t);
    for n in ["midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "norm.weight"] {
        t.insert(n.to_string(), ones(h));
    }
    t.insert("lm_head.weight".to_string(), rand(&[used.len(), h], 4.0));
    let d2t: Vec<i64> = used.iter().enumerate().map(|(i, &u)| i64::from(u) - i as i64).collect();
    t.insert("d2t".to_string(), Tensor::new(&d2t[..], &Device::Cpu).expect("d2t"));
    write(dir, "model.safetensors", &config(c, json!({ "draft_vocab_size": used.len() })), &t);
    // A boolean `t2d`, as EAGLE-3's trainer writes it, in a file of its own.
    let mask: Vec<u8> = (0..c.vocab_size as u32).map(|i| u8::from(used.contains(&i))).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BOOL, vec![mask.len()], &mask).expect("view");
    safetensors::serialize_to_file([("t2d", view)], None, &dir.join("t2d.safetensors")).expect("t2d");
}

/// Medusa-1 heads for target `c` in `dir`: `heads` heads of one residual block, each with
/// its own output head when `own_output`.
pub fn write_medusa(dir: &Path, c: &LlamaConfig, heads: usize, own_output: bool) {
    let h = c.hidden_size;
    let mut t = HashMap::new();
    for i in 0..heads {
        t.insert(format!("{i}.0.linear.weight"), rand(&[h, h], 1.0));
        t.insert(format!("{i}.0.linear.bias"), rand(&[h], 0.1));
        if own_output {
            t.insert(format!("{i}.1.weight"), rand(&[c.vocab_size, h], 4.0));
        }
    }
    let cfg = json!({ "medusa_num_heads": heads, "medusa_num_layers": 1, "base_model_name_or_path": "test" });
    write(dir, "medusa_lm_head.safetensors", &cfg, &t);
}

/// Heads trained here on the target's own samples (`sequences` of 48 tokens at temperature
/// 1): EAGLE-1, EAGLE-3 and Medusa, written to folders under `tag`. Returned as drafter specs.
pub fn trained_heads(
    files: &specdec::ModelFiles,
    tag: &str,
    sequences: usize,
) -> specdec::Result<Vec<specdec::DrafterSpec>> {
    use specdec::heads::train::{self, HeadKind, Sample, TrainOptions, Trainable, Vocab};
    use specdec::heads::{EagleVersion, TargetParts};
    use specdec::models::Tap;
    use specdec::{DrafterSpec, Llama, PlainDecoder, SamplingConfig, WeightFormat};
    let (w, _) = files.load(WeightFormat::F32, &Device::Cpu)?;
    let parts = TargetParts::from_weights(&w, &Device::Cpu)?;
    let l = w.config().num_layers;
    let taps =
        [vec![Tap::Final], vec![Tap::Residual(2.min(l)), Tap::Residual(l / 2), Tap::Residual(l.saturating_sub(3))]];
    let mut gen = PlainDecoder::new(Llama::new(w.clone())?, SamplingConfig::new(1.0)?.with_seed(11)).max_new_tokens(48);
    let mut teacher = Llama::new(w.clone())?;
    let mut data = [Vec::new(), Vec::new()];
    for i in 0..sequences {
        let out = gen.generate(&[1, 1 + (i as u32 * 37) % 500])?;
        let tokens = [vec![1, 1 + (i as u32 * 37) % 500], out.tokens].concat();
        for (set, t) in data.iter_mut().zip(&taps) {
            set.push(Sample::record(&mut teacher, &tokens, t)?);
        }
    }
    let vocab = Vocab::of(&data[0]);
    let o = TrainOptions { epochs: 3, lr: 3e-3, ..TrainOptions::default() };
    let mut specs = Vec::new();
    for kind in [HeadKind::Eagle(EagleVersion::One), HeadKind::Eagle(EagleVersion::Three), HeadKind::Medusa(3)] {
        let head = Trainable::new(kind, &parts, &vocab)?;
        let set = &data[usize::from(kind == HeadKind::Eagle(EagleVersion::Three))];
        let labels: Vec<Vec<u32>> = set.iter().map(|s| vocab.remap(&s.labels)).collect();
        let cut = if kind == HeadKind::Eagle(EagleVersion::Three) { parts.clone() } else { vocab.cut(&parts)? };
        if let Some(e) = head.eagle(&cut)? {
            train::fit(
                &head,
                set.len(),
                &o,
                |i, rng| train::eagle_loss(&e, &set[i], &labels[i], &o, rng),
                |_, _| Ok(()),
            )?;
        } else if let Some(m) = head.medusa(&cut)? {
            let teacher = specdec::models::Linear::from_f32(cut.output(), None)?;
            train::fit(
                &head,
                set.len(),
                &o,
                |i, _| train::medusa_loss(&m, &teacher, &set[i], &labels[i], &o),
                |_, _| Ok(()),
            )?;
        }
        let dir = temp_dir(&format!("{tag}-{kind:?}"));
        head.save(&dir)?;
        let p = dir.to_string_lossy().into_owned();
        specs.push(match kind {
            HeadKind::Eagle(EagleVersion::One) => DrafterSpec::Eagle(p),
            HeadKind::Eagle(EagleVersion::Three) => DrafterSpec::Eagle3(p),
            HeadKind::Medusa(_) => DrafterSpec::Medusa(p),
            other => panic!("no drafter for {other:?}"),
        });
    }
    Ok(specs)
}
