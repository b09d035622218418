//! Writes the seed corpora under `fuzz/corpus/` from the real model files (see
//! `scripts/fetch-models.sh`): `make_seeds MODELS_DIR CORPUS_DIR`.
//!
//! - `gguf`: the stories260K file whole, SmolLM2's header up to its tensor data, and tiny
//!   two-layer models holding one tensor of each GGML type, with a SentencePiece (stories) and
//!   a byte-level BPE (SmolLM2's first tokens) vocabulary, as GGUF v2 and v3;
//! - `gguf_tokenizer`: the same vocabularies as metadata-only files (no tensors), SmolLM2's whole;
//! - `hf_dir`: `u16 LE length ‖ config.json ‖ model.safetensors` for the tiny model in f32 and in
//!   f16/bf16, and for stories260K.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use specdec::loading::safetensors::interleaved_to_hf;
use specdec::loading::{GgufFile, TensorSource};

type Res<T> = Result<T, Box<dyn std::error::Error>>;
type Meta = Vec<(String, Value)>;

const PARTS: [(&str, &str); 9] = [
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let (models, corpus) = match args.as_slice() {
        [_, m, c] => (Path::new(m), Path::new(c)),
        _ => return Err("usage: make_seeds MODELS_DIR CORPUS_DIR".into()),
    };
    for t in ["gguf", "gguf_tokenizer", "hf_dir"] {
        std::fs::create_dir_all(corpus.join(t))?;
    }
    let stories = models.join("tinyllamas-stories-260k-f32.gguf");
    let smollm = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::copy(&stories, corpus.join("gguf/stories260k.gguf"))?;

    let (smol_header, smol_meta) = header(&smollm)?;
    std::fs::write(corpus.join("gguf/smollm2-header.gguf"), smol_header)?;
    let (_, stories_meta) = header(&stories)?;
    let small_bpe = shrink_bpe(&smol_meta, 400);

    write_gguf(&corpus.join("gguf_tokenizer/stories260k-meta.gguf"), &stories_meta, &[], 2)?;
    write_gguf(&corpus.join("gguf_tokenizer/smollm2-meta.gguf"), &smol_meta, &[], 3)?;
    write_gguf(&corpus.join("gguf_tokenizer/smollm2-400-meta.gguf"), &small_bpe, &[], 3)?;

    for (name, meta) in [("spm", &stories_meta), ("bpe", &small_bpe)] {
        let vocab = match meta.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
            Some((_, Value::Array(t))) => t.len(),
            _ => return Err("no tokens".into()),
        };
        let (meta, tensors) = tiny_model(meta, vocab)?;
        write_gguf(&corpus.join(format!("gguf/tiny-{name}-v2.gguf")), &meta, &tensors, 2)?;
        write_gguf(&corpus.join(format!("gguf/tiny-{name}-v3.gguf")), &meta, &tensors, 3)?;
    }

    let tiny = tiny_hf_tensors()?;
    hf_seed(&corpus.join("hf_dir/tiny-f32"), &tiny_config(), &tiny, None)?;
    hf_seed(&corpus.join("hf_dir/tiny-f16"), &tiny_config(), &tiny, Some(DType::F16))?;
    hf_seed(&corpus.join("hf_dir/tiny-bf16"), &tiny_config(), &tiny, Some(DType::BF16))?;
    let (config, tensors) = stories_hf(&stories)?;
    hf_seed(&corpus.join("hf_dir/stories260k"), &config, &tensors, None)?;
    Ok(())
}

/// The file's bytes up to its tensor data, and its metadata.
fn header(path: &Path) -> Res<(Vec<u8>, Meta)> {
    let mut reader = BufReader::new(File::open(path)?);
    let content = Content::read(&mut reader)?;
    reader.seek(SeekFrom::Start(0))?;
    let mut bytes = vec![0; content.tensor_data_offset as usize];
    reader.read_exact(&mut bytes)?;
    let mut meta: Meta = content.metadata.into_iter().collect();
    meta.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((bytes, meta))
}

/// A byte-level BPE vocabulary cut to its first `n` tokens and the merges among them.
fn shrink_bpe(meta: &Meta, n: usize) -> Meta {
    let strings = |v: &Value| match v {
        Value::Array(a) => a.iter().filter_map(|s| s.to_string().ok().cloned()).collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let get = |key: &str| meta.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let tokens: Vec<String> = get("tokenizer.ggml.tokens").map(|v| strings(&v)).unwrap_or_default();
    let kept: HashSet<&str> = tokens.iter().take(n).map(String::as_str).collect();
    let merges: Vec<Value> = get("tokenizer.ggml.merges")
        .map(|v| strings(&v))
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m.split_once(' ')
                .is_some_and(|(a, b)| kept.contains(a) && kept.contains(b) && kept.contains(format!("{a}{b}").as_str()))
        })
        .map(Value::String)
        .collect();
    meta.iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("tokenizer.ggml.merges", _) => Value::Array(merges.clone()),
                ("tokenizer.ggml.tokens" | "tokenizer.ggml.token_type" | "tokenizer.ggml.scores", Value::Array(a)) => {
                    Value::Array(a.iter().take(n).cloned().collect())
                }
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

fn write_gguf(path: &Path, meta: &Meta, tensors: &[(String, QTensor)], version: u32) -> Res<()> {
    let mut buf = Cursor::new(Vec::new());
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut buf, &meta, &tensors)?;
    let mut bytes = buf.into_inner();
    bytes[4..8].copy_from_slice(&version.to_le_bytes()); // v3 has v2's layout
    std::fs::write(path, bytes)?;
    Ok(())
}

fn values(n: usize, seed: f64) -> Res<Tensor> {
    Ok(Tensor::arange(0f32, n as f32, &Device::Cpu)?.affine(0.37, seed)?.sin()?)
}

/// A two-layer model with `vocab` tokens and width 32; each tensor in another GGML type.
fn tiny_model(meta: &Meta, vocab: usize) -> Res<(Meta, Vec<(String, QTensor)>)> {
    let shape = [
        ("llama.embedding_length", 32),
        ("llama.feed_forward_length", 32),
        ("llama.block_count", 2),
        ("llama.attention.head_count", 2),
        ("llama.attention.head_count_kv", 1),
        ("llama.rope.dimension_count", 16),
        ("llama.context_length", 64),
    ];
    let mut meta: Meta = meta.iter().filter(|(k, _)| !shape.iter().any(|(s, _)| s == k)).cloned().collect();
    meta.extend(shape.iter().map(|&(k, v)| (k.to_string(), Value::U32(v))));
    meta.push(("general.architecture".into(), Value::String("llama".into())));
    let q = |dims: &[usize], dtype: GgmlDType, seed: f64| -> Res<QTensor> {
        Ok(QTensor::quantize(&values(dims.iter().product(), seed)?.reshape(dims)?, dtype)?)
    };
    use GgmlDType::*;
    let mut tensors = vec![
        ("token_embd.weight".to_string(), q(&[vocab, 32], Q8_0, 0.0)?),
        ("output_norm.weight".into(), q(&[32], F32, 1.0)?),
        ("output.weight".into(), q(&[2, 256], Q5K, 2.0)?),
    ];
    let types = [[F32, F16, F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1], [BF16, F32, Q8_0, Q2K, Q3K, Q4K, Q6K, F16, F32]];
    for (layer, types) in types.iter().enumerate() {
        for (i, ((part, _), &dtype)) in PARTS.iter().zip(types).enumerate() {
            let dims: &[usize] = match (i, dtype.block_size()) {
                (0 | 1, _) => &[32],
                (_, 256) => &[1, 256],
                _ => &[32, 32],
            };
            tensors.push((format!("blk.{layer}.{part}.weight"), q(dims, dtype, (layer * 10 + i) as f64)?));
        }
    }
    Ok((meta, tensors))
}

fn tiny_config() -> serde_json::Value {
    serde_json::json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 128,
        "tie_word_embeddings": false, "eos_token_id": [2, 3], "torch_dtype": "float32"
    })
}

fn tiny_hf_tensors() -> Res<HashMap<String, Tensor>> {
    let mut t = HashMap::new();
    t.insert("model.embed_tokens.weight".to_string(), values(64 * 32, 0.5)?.reshape((64, 32))?);
    t.insert("model.norm.weight".into(), values(32, 0.6)?);
    t.insert("lm_head.weight".into(), values(64 * 32, 0.7)?.reshape((64, 32))?);
    for layer in 0..2 {
        for (i, (_, hf)) in PARTS.iter().enumerate() {
            let dims: &[usize] = match i {
                0 | 1 => &[32],
                3 => &[16, 32],
                6 | 7 => &[48, 32],
                8 => &[32, 48],
                _ => &[32, 32],
            };
            let w = values(dims.iter().product(), (layer * 10 + i) as f64)?.reshape(dims)?;
            t.insert(format!("model.layers.{layer}.{hf}.weight"), w);
        }
    }
    Ok(t)
}

/// stories260K as an HF checkpoint, as `tests/loading.rs` writes it.
fn stories_hf(path: &Path) -> Res<(serde_json::Value, HashMap<String, Tensor>)> {
    let mut file = GgufFile::open(path)?;
    let c = file.config()?;
    let mut tensors = HashMap::new();
    let cpu = Device::Cpu;
    for (g, hf) in [("token_embd.weight", "model.embed_tokens.weight"), ("output_norm.weight", "model.norm.weight")] {
        tensors.insert(hf.to_string(), file.qtensor(g, &cpu)?.dequantize(&cpu)?);
    }
    for i in 0..c.num_layers {
        for (j, (g, hf)) in PARTS.iter().enumerate() {
            let t = file.qtensor(&format!("blk.{i}.{g}.weight"), &cpu)?.dequantize(&cpu)?;
            let t = match j {
                2 => interleaved_to_hf(&t, c.num_heads)?,
                3 => interleaved_to_hf(&t, c.num_kv_heads)?,
                _ => t,
            };
            tensors.insert(format!("model.layers.{i}.{hf}.weight"), t);
        }
    }
    let config = serde_json::json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_context,
        "tie_word_embeddings": true, "eos_token_id": c.eos_token_ids.first(), "torch_dtype": "float32"
    });
    Ok((config, tensors))
}

/// `u16 LE length ‖ config.json ‖ model.safetensors`, the layout the `hf_dir` target splits.
fn hf_seed(path: &Path, config: &serde_json::Value, tensors: &HashMap<String, Tensor>, half: Option<DType>) -> Res<()> {
    let mut tensors = tensors.clone();
    if let Some(dtype) = half {
        // Alternate f32 and the half type, so both conversions are seen.
        let mut names: Vec<String> = tensors.keys().cloned().collect();
        names.sort();
        for name in names.iter().step_by(2) {
            let t = tensors[name].to_dtype(dtype)?;
            tensors.insert(name.clone(), t);
        }
    }
    let scratch = std::env::temp_dir().join(format!("make-seeds-{}.safetensors", std::process::id()));
    candle_core::safetensors::save(&tensors, &scratch)?;
    let st = std::fs::read(&scratch)?;
    std::fs::remove_file(&scratch)?;
    let config = config.to_string().into_bytes();
    let mut bytes = u16::try_from(config.len())?.to_le_bytes().to_vec();
    bytes.extend(config);
    bytes.extend(st);
    std::fs::write(path, bytes)?;
    Ok(())
}
