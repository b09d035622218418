//! Model families beside llama, tested against an independent implementation: the tests write
//! tiny random-weight checkpoints with the real tensor names and metadata keys (GGUF as
//! llama.cpp writes Qwen2/Qwen3 files: query/key rows in halves order; an HF folder for Qwen2)
//! and compare our logits, on both engines, with candle-transformers' own Qwen2 and Qwen3
//! models (`quantized_qwen2`, `quantized_qwen3`, `quantized_phi3`, `qwen2`, `qwen3`, `gemma3`, `mistral`) to 1e-4
//! relative: after a
//! prompt, and after single steps; multi-token forwards equal sequential ones and roll-back
//! equals a fresh run. Gemma 3's sliding window is checked on its own.

use specdec::TokenModel;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use candle_transformers::models::{gemma3, mistral, quantized_phi3, quantized_qwen2, quantized_qwen3, qwen2, qwen3};
use specdec::loading::{GgufFile, SafetensorsDir, TensorSource};
use specdec::models::Family;
use specdec::tree::TreeShape;
use specdec::{Engine, Llama, LlamaConfig, LlamaWeights, Result, TargetModel, WeightFormat};

const VOCAB: usize = 64;
const HIDDEN: usize = 32;
const FF: usize = 48;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const LAYERS: usize = 2;
const PROMPT: [u32; 6] = [3, 17, 42, 5, 60, 9];
/// Gemma 3's and Mistral's sliding window here: longer than the prompt, so that
/// candle-transformers (whose masks keep one position more than HF's and llama.cpp's) agrees;
/// the window itself is tested on its own.
const WINDOW: usize = 16;

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("specdec-families-{}-{name}", std::process::id()))
}

/// A random tensor of `shape`, scaled so activations stay in a sensible range.
fn random(shape: &[usize], scale: f64, seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    // A small deterministic generator: the values only need to be fixed and varied.
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let data: Vec<f32> = (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (((state >> 40) as f64 / (1u64 << 24) as f64 - 0.5) * 2.0 * scale) as f32
        })
        .collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// The tensors of a tiny model in GGUF naming, HF row order (as both Qwen and Gemma file kinds
/// hold them), norm weights as GGUF stores them (near 1; Gemma's HF files store them minus 1).
fn tensors(family: Family) -> Result<Vec<(String, Tensor)>> {
    let (q_out, kv_out) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut t = vec![
        ("token_embd.weight".to_string(), random(&[VOCAB, HIDDEN], 1.0, 1)?),
        ("output_norm.weight".to_string(), (random(&[HIDDEN], 0.2, 2)? + 1.0)?),
    ];
    if matches!(family, Family::Qwen2 | Family::Mistral | Family::Phi3) {
        t.push(("output.weight".to_string(), random(&[VOCAB, HIDDEN], 0.3, 3)?));
    }
    for i in 0..LAYERS {
        let s = 100 * (i as u64 + 1);
        let mut add = |name: &str, shape: &[usize], scale: f64, seed: u64| -> Result<()> {
            t.push((format!("blk.{i}.{name}"), random(shape, scale, s + seed)?));
            Ok(())
        };
        add("attn_q.weight", &[q_out, HIDDEN], 0.3, 1)?;
        add("attn_k.weight", &[kv_out, HIDDEN], 0.3, 2)?;
        add("attn_v.weight", &[kv_out, HIDDEN], 0.3, 3)?;
        add("attn_output.weight", &[HIDDEN, q_out], 0.3, 4)?;
        add("ffn_gate.weight", &[FF, HIDDEN], 0.3, 5)?;
        add("ffn_up.weight", &[FF, HIDDEN], 0.3, 6)?;
        add("ffn_down.weight", &[HIDDEN, FF], 0.3, 7)?;
        add("attn_norm.weight", &[HIDDEN], 0.2, 8)?;
        add("ffn_norm.weight", &[HIDDEN], 0.2, 9)?;
        if family == Family::Qwen2 {
            add("attn_q.bias", &[q_out], 0.5, 10)?;
            add("attn_k.bias", &[kv_out], 0.5, 11)?;
            add("attn_v.bias", &[kv_out], 0.5, 12)?;
        }
        if matches!(family, Family::Qwen3 | Family::Gemma3) {
            add("attn_q_norm.weight", &[HEAD_DIM], 0.3, 13)?;
            add("attn_k_norm.weight", &[HEAD_DIM], 0.3, 14)?;
        }
        if family == Family::Gemma3 {
            add("post_attention_norm.weight", &[HIDDEN], 0.2, 15)?;
            add("post_ffw_norm.weight", &[HIDDEN], 0.2, 16)?;
        }
    }
    if family == Family::Phi3 {
        t = fuse(t, ["attn_q.weight", "attn_k.weight", "attn_v.weight"], "attn_qkv.weight")?;
        t = fuse(t, ["ffn_gate.weight", "ffn_up.weight"], "ffn_up.weight")?;
    }
    // Norm weights near 1.
    for (name, w) in &mut t {
        if name.ends_with("norm.weight") && !name.starts_with("output") {
            *w = (&*w + 1.0)?;
        }
    }
    Ok(t)
}

/// Phi-3's layout: the tensors named `parts` of each block stacked by rows into one, `into`.
fn fuse<const N: usize>(t: Vec<(String, Tensor)>, parts: [&str; N], into: &str) -> Result<Vec<(String, Tensor)>> {
    let mut out: Vec<(String, Tensor)> =
        t.iter().filter(|(n, _)| !parts.iter().any(|p| n.ends_with(p))).cloned().collect();
    for i in 0..LAYERS {
        let stack: Vec<&Tensor> =
            parts.iter().filter_map(|p| t.iter().find(|(n, _)| *n == format!("blk.{i}.{p}")).map(|(_, w)| w)).collect();
        out.push((format!("blk.{i}.{into}"), Tensor::cat(&stack, 0)?));
    }
    Ok(out)
}

/// Writes a GGUF file as llama.cpp writes a Qwen2/Qwen3 model.
fn write_gguf(family: Family, path: &Path) -> Result<()> {
    let arch = family.gguf_name();
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), Value::U32(LAYERS as u32)),
        (format!("{arch}.context_length"), Value::U32(256)),
        (format!("{arch}.embedding_length"), Value::U32(HIDDEN as u32)),
        (format!("{arch}.feed_forward_length"), Value::U32(FF as u32)),
        (format!("{arch}.attention.head_count"), Value::U32(HEADS as u32)),
        (format!("{arch}.attention.head_count_kv"), Value::U32(KV_HEADS as u32)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        // candle-transformers' Phi-3 rotates with base 10,000 whatever the file says.
        (format!("{arch}.rope.freq_base"), Value::F32(if family == Family::Phi3 { 10_000.0 } else { 1_000_000.0 })),
    ];
    if family == Family::Gemma3 {
        meta.push((format!("{arch}.attention.key_length"), Value::U32(HEAD_DIM as u32)));
        meta.push((format!("{arch}.attention.sliding_window"), Value::U32(WINDOW as u32)));
        meta.push((format!("{arch}.attention.sliding_window_pattern"), Value::U32(2)));
        meta.push((format!("{arch}.rope.local_freq_base"), Value::F32(10_000.0)));
    }
    if family == Family::Phi3 {
        meta.push((format!("{arch}.rope.dimension_count"), Value::U32(HEAD_DIM as u32)));
    }
    if family == Family::Qwen3 {
        meta.push((format!("{arch}.attention.key_length"), Value::U32(HEAD_DIM as u32)));
        // candle's Qwen3 builds its RoPE tables in this dtype (f16 without the key).
        meta.push(("general.dtype".into(), Value::U32(0)));
    }
    let tensors: Vec<(String, QTensor)> = tensors(family)?
        .into_iter()
        .map(|(n, t)| Ok((n, QTensor::quantize(&t, GgmlDType::F32)?)))
        .collect::<Result<_>>()?;
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path)?;
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
    Ok(())
}

/// candle-transformers' logits for the last position after `tokens`, from a fresh model.
fn reference(family: Family, path: &Path, tokens: &[u32]) -> Result<Vec<f32>> {
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let input = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
    let logits = match family {
        Family::Qwen2 => {
            quantized_qwen2::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?.forward(&input, 0)?
        }
        Family::Qwen3 => {
            quantized_qwen3::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?.forward(&input, 0)?
        }
        Family::Phi3 => {
            quantized_phi3::ModelWeights::from_gguf(false, content, &mut file, &Device::Cpu)?.forward(&input, 0)?
        }
        other => unreachable!("{other:?} has no quantized reference here"),
    };
    Ok(logits.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?)
}

/// max |a − b| / max |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn load(source: &mut dyn TensorSource, config: LlamaConfig, engine: Engine) -> Result<Llama> {
    Llama::new(LlamaWeights::load(source, config, WeightFormat::F32, &Device::Cpu, engine)?.into())
}

/// Our logits along the prompt (one multi-token call, then single steps) against fresh
/// reference runs on each prefix; multi-token equals sequential; roll-back equals fresh.
fn check_against_reference(what: &str, mut model: Llama, reference: impl Fn(&[u32]) -> Result<Vec<f32>>) -> Result<()> {
    let (head, steps) = PROMPT.split_at(3);
    let first = model.forward(head, 1)?;
    let d = rel_diff(first.row(0), &reference(head)?);
    assert!(d <= 1e-4, "{what}: after the first {} tokens, relative difference {d}", head.len());
    for (i, &t) in steps.iter().enumerate() {
        let row = model.forward(&[t], 1)?;
        let d = rel_diff(row.row(0), &reference(&PROMPT[..4 + i])?);
        assert!(d <= 1e-4, "{what}: after single step {i}, relative difference {d}");
    }
    // One multi-token call gives the same rows as the steps; rolling back and going again too.
    model.truncate(0)?;
    let all = model.forward(&PROMPT, PROMPT.len())?;
    model.truncate(2)?;
    let again = model.forward(&PROMPT[2..], PROMPT.len() - 2)?;
    for i in 2..PROMPT.len() {
        let want = reference(&PROMPT[..=i])?;
        assert!(rel_diff(all.row(i), &want) <= 1e-4, "{what}: multi-token row {i}");
        assert!(rel_diff(again.row(i - 2), &want) <= 1e-4, "{what}: after roll-back, row {i}");
    }
    Ok(())
}

#[test]
fn qwen2_qwen3_and_phi3_gguf_match_candle_transformers_on_both_engines() -> Result<()> {
    for family in [Family::Qwen2, Family::Qwen3, Family::Phi3] {
        let path = temp_path(&format!("{}.gguf", family.gguf_name()));
        write_gguf(family, &path)?;
        for engine in [Engine::Native, Engine::Candle] {
            let mut file = GgufFile::open(&path)?;
            let config = file.config()?;
            assert_eq!(config.family, family);
            assert_eq!(config.head_dim, HEAD_DIM);
            let model = load(&mut file, config, engine)?;
            check_against_reference(&format!("{family:?} GGUF, {engine:?}"), model, |t| reference(family, &path, t))?;
        }
        std::fs::remove_file(&path)?;
    }
    Ok(())
}

/// Writes an HF folder (config.json + model.safetensors) with the same weights.
fn write_hf(family: Family, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let gemma = family == Family::Gemma3;
    let hf_name = |n: &str| -> String {
        let fixed = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
        ];
        if let Some((_, hf)) = fixed.iter().find(|(g, _)| *g == n) {
            return hf.to_string();
        }
        let ffn_norm = if gemma { "pre_feedforward_layernorm." } else { "post_attention_layernorm." };
        let parts = [
            ("attn_norm.", "input_layernorm."),
            ("post_attention_norm.", "post_attention_layernorm."),
            ("post_ffw_norm.", "post_feedforward_layernorm."),
            ("ffn_norm.", ffn_norm),
            ("attn_q_norm.", "self_attn.q_norm."),
            ("attn_k_norm.", "self_attn.k_norm."),
            ("attn_q.", "self_attn.q_proj."),
            ("attn_k.", "self_attn.k_proj."),
            ("attn_v.", "self_attn.v_proj."),
            ("attn_output.", "self_attn.o_proj."),
            ("ffn_gate.", "mlp.gate_proj."),
            ("ffn_up.", "mlp.up_proj."),
            ("ffn_down.", "mlp.down_proj."),
        ];
        let n = n.replacen("blk.", "model.layers.", 1);
        parts.iter().fold(n, |n, (g, hf)| n.replacen(g, hf, 1))
    };
    let mut hf = std::collections::HashMap::new();
    for (n, t) in tensors(family)? {
        // Gemma's HF files hold w where the norm scales by 1 + w.
        let t = if gemma && n.ends_with("norm.weight") { (t - 1.0)? } else { t };
        hf.insert(hf_name(&n), t);
    }
    candle_core::safetensors::save(&hf, dir.join("model.safetensors"))?;
    let common = serde_json::json!({
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FF, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
    });
    let extra = match family {
        Family::Gemma3 => serde_json::json!({
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": HEAD_DIM,
            "attention_bias": false, "hidden_activation": "gelu_pytorch_tanh", "rope_local_base_freq": 10_000.0,
            "final_logit_softcapping": null, "attn_logit_softcapping": null, "query_pre_attn_scalar": HEAD_DIM,
            "sliding_window": WINDOW, "sliding_window_pattern": 2,
        }),
        Family::Qwen3 => serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": HEAD_DIM,
            "attention_bias": false, "sliding_window": null, "max_window_layers": LAYERS,
            "tie_word_embeddings": true, "use_sliding_window": false, "hidden_act": "silu",
        }),
        Family::Mistral => serde_json::json!({
            "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": WINDOW,
            "tie_word_embeddings": false, "hidden_act": "silu",
        }),
        _ => serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "sliding_window": 256,
            "max_window_layers": LAYERS, "tie_word_embeddings": false, "use_sliding_window": false,
            "hidden_act": "silu",
        }),
    };
    let mut config = common;
    config.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
    std::fs::write(dir.join("config.json"), config.to_string())?;
    Ok(())
}

fn json_error(dir: &Path, e: serde_json::Error) -> specdec::Error {
    specdec::Error::load_from(dir, "config.json", e)
}

/// candle-transformers' safetensors model of `family`, fresh per call: last-position logits.
fn reference_hf(family: Family, dir: &Path, tokens: &[u32]) -> Result<Vec<f32>> {
    let text = std::fs::read_to_string(dir.join("config.json"))?;
    // SAFETY: the test's own file, not modified while mapped.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &Device::Cpu)?
    };
    let input = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
    let logits = match family {
        Family::Gemma3 => {
            // Its attention appends a transposed (non-contiguous) value tensor to the KV cache,
            // which candle refuses for more than one token at a time: feed them one by one.
            let config: gemma3::Config = serde_json::from_str(&text).map_err(|e| json_error(dir, e))?;
            let mut model = gemma3::Model::new(false, &config, vb)?;
            let mut last = None;
            for (i, &t) in tokens.iter().enumerate() {
                last = Some(model.forward(&Tensor::new(&[t], &Device::Cpu)?.unsqueeze(0)?, i)?);
            }
            last.ok_or(specdec::Error::EmptyPrompt)?
        }
        Family::Qwen3 => {
            let config: qwen3::Config = serde_json::from_str(&text).map_err(|e| json_error(dir, e))?;
            qwen3::ModelForCausalLM::new(&config, vb)?.forward(&input, 0)?
        }
        Family::Mistral => {
            let config: mistral::Config = serde_json::from_str(&text).map_err(|e| json_error(dir, e))?;
            mistral::Model::new(&config, vb)?.forward(&input, 0)?
        }
        _ => {
            let config: qwen2::Config = serde_json::from_str(&text).map_err(|e| json_error(dir, e))?;
            qwen2::ModelForCausalLM::new(&config, vb)?.forward(&input, 0)?
        }
    };
    Ok(logits.flatten_all()?.to_vec1()?)
}

#[test]
fn hf_folders_match_candle_transformers_on_both_engines() -> Result<()> {
    for family in [Family::Qwen2, Family::Qwen3, Family::Gemma3, Family::Mistral] {
        let dir = temp_path(&format!("{}-hf", family.gguf_name()));
        write_hf(family, &dir)?;
        for engine in [Engine::Native, Engine::Candle] {
            let mut st = SafetensorsDir::open(&dir)?;
            let config = st.config().clone();
            assert_eq!(config.family, family);
            let model = load(&mut st, config, engine)?;
            check_against_reference(&format!("{family:?} HF folder, {engine:?}"), model, |t| {
                reference_hf(family, &dir, t)
            })?;
        }
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}

#[test]
fn gemma3_gguf_matches_the_hf_reference_on_both_engines() -> Result<()> {
    // candle-transformers' `quantized_gemma3` gates with SiLU where Gemma 3 uses GELU-tanh, so
    // the GGUF file (norms stored as 1 + w) is checked against the safetensors model instead.
    let (path, dir) = (temp_path("gemma3.gguf"), temp_path("gemma3-ref"));
    write_gguf(Family::Gemma3, &path)?;
    write_hf(Family::Gemma3, &dir)?;
    for engine in [Engine::Native, Engine::Candle] {
        let mut file = GgufFile::open(&path)?;
        let config = file.config()?;
        assert_eq!((config.family, config.sliding_window, config.sliding_pattern), (Family::Gemma3, Some(WINDOW), 2));
        let model = load(&mut file, config, engine)?;
        check_against_reference(&format!("Gemma3 GGUF, {engine:?}"), model, |t| reference_hf(Family::Gemma3, &dir, t))?;
    }
    std::fs::remove_file(&path)?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn a_sliding_window_layer_sees_exactly_its_last_window_positions() -> Result<()> {
    // One sliding layer with a window of 3: the last row depends on the last 3 tokens only.
    let dir = temp_path("gemma3-window");
    write_hf(Family::Gemma3, &dir)?;
    for engine in [Engine::Native, Engine::Candle] {
        let mut st = SafetensorsDir::open(&dir)?;
        let mut config = st.config().clone();
        (config.num_layers, config.sliding_window) = (1, Some(3));
        let mut model = load(&mut st, config, engine)?;
        let mut last = |tokens: &[u32]| -> Result<Vec<f32>> {
            model.truncate(0)?;
            Ok(model.forward(tokens, 1)?.into_last_row())
        };
        let base = last(&PROMPT)?;
        let mut outside = PROMPT;
        outside[2] = 1; // position 2: outside the window of position 5 (3, 4, 5)
        let mut inside = PROMPT;
        inside[3] = 1;
        assert!(rel_diff(&last(&outside)?, &base) <= 1e-6, "{engine:?}: a token outside the window mattered");
        assert!(rel_diff(&last(&inside)?, &base) > 1e-3, "{engine:?}: a token inside the window did not matter");
        // A tree as deep as the window would need its own ancestors masked: refused.
        model.truncate(2)?;
        assert!(model.forward_tree(&[1, 2, 3], &TreeShape::new(&[0, 0])?).is_ok());
        model.truncate(2)?;
        let deep = model.forward_tree(&[1, 2, 3, 4], &TreeShape::new(&[0, 1, 2])?);
        assert!(matches!(deep, Err(specdec::Error::InvalidSetting { .. })), "{engine:?}");
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
