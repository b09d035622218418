//! Loading paths: an HF-layout checkpoint (safetensors + config.json + tokenizer.json) written
//! from the stories260K GGUF, loaded from a folder and from a hub-cache layout, generates what
//! the GGUF does; bad files and mismatched pairs give typed errors, never panics.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Device;
use common::models::{model_path, GEMMA3, QWEN_0_5B, SMOLLM2, STORIES};
use specdec::loading::{hub, safetensors::interleaved_to_hf, GgufFile, TensorSource};
use specdec::{Error, Llama, ModelFiles, PlainDecoder, Result, SamplingConfig, TextStream, WeightFormat};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specdec-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Writes the GGUF model at `gguf` as an HF checkpoint in `dir`.
fn write_hf_checkpoint(gguf: &Path, dir: &Path) -> Result<()> {
    let mut file = GgufFile::open(gguf)?;
    let c = file.config()?;
    let tok = file.tokenizer()?;
    let mut tensors = HashMap::new();
    let mut put = |file: &mut GgufFile, gguf_name: &str, hf_name: String, heads: Option<usize>| -> Result<()> {
        let t = file.qtensor(gguf_name, &Device::Cpu)?.dequantize(&Device::Cpu)?;
        let t = match heads {
            Some(h) => interleaved_to_hf(&t, h)?,
            None => t,
        };
        tensors.insert(hf_name, t);
        Ok(())
    };
    put(&mut file, "token_embd.weight", "model.embed_tokens.weight".into(), None)?;
    put(&mut file, "output_norm.weight", "model.norm.weight".into(), None)?;
    for i in 0..c.num_layers {
        let parts = [
            ("attn_norm", "input_layernorm", None),
            ("ffn_norm", "post_attention_layernorm", None),
            ("attn_q", "self_attn.q_proj", Some(c.num_heads)),
            ("attn_k", "self_attn.k_proj", Some(c.num_kv_heads)),
            ("attn_v", "self_attn.v_proj", None),
            ("attn_output", "self_attn.o_proj", None),
            ("ffn_gate", "mlp.gate_proj", None),
            ("ffn_up", "mlp.up_proj", None),
            ("ffn_down", "mlp.down_proj", None),
        ];
        for (g, h, heads) in parts {
            put(&mut file, &format!("blk.{i}.{g}.weight"), format!("model.layers.{i}.{h}.weight"), heads)?;
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    let config = serde_json::json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_context,
        "tie_word_embeddings": true, "eos_token_id": c.eos_token_ids[0], "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    std::fs::write(dir.join("tokenizer.json"), tok.to_json()?)?;
    Ok(())
}

fn greedy(files: &ModelFiles, prompt: &str) -> Result<Vec<u32>> {
    let (w, tok) = files.load(WeightFormat::F32, &Device::Cpu)?;
    let ids = tok.encode(prompt)?;
    Ok(PlainDecoder::new(Llama::new(w)?, SamplingConfig::greedy()).max_new_tokens(40).generate(&ids)?.tokens)
}

#[test]
fn safetensors_folder_and_hub_cache_generate_what_the_gguf_does() -> Result<()> {
    let Some(gguf) = model_path(STORIES) else { return Ok(()) };
    let expected = greedy(&ModelFiles::Gguf(gguf.clone()), "Once upon a time")?;

    let dir = temp_dir("hf");
    write_hf_checkpoint(&gguf, &dir)?;
    assert_eq!(greedy(&ModelFiles::HfDir(dir.clone()), "Once upon a time")?, expected);
    assert_eq!(greedy(&ModelFiles::resolve(dir.to_str().expect("utf-8 path"))?, "Once upon a time")?, expected);
    // A folder's `tokenizer_config.json` brings its chat template and special tokens.
    let template = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}";
    let config = serde_json::json!({"chat_template": template, "bos_token": {"content": "<s>"}, "eos_token": "</s>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string())?;
    let tok = ModelFiles::HfDir(dir.clone()).tokenizer()?;
    let rendered = tok.chat_template().map(|t| t.render(&[specdec::chat::ChatMessage::new("user", "hi")], false));
    assert_eq!(rendered.transpose()?.as_deref(), Some("<s>[user] hi</s>"));
    std::fs::remove_file(dir.join("tokenizer_config.json"))?;

    // The same files in the hub cache layout: models--org--name/{refs/main, snapshots/<rev>/}.
    let cache = temp_dir("hub");
    let rev = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.join("models--specdec--stories260k");
    std::fs::create_dir_all(repo.join("refs"))?;
    std::fs::write(repo.join("refs/main"), rev)?;
    let snapshot = repo.join("snapshots").join(rev);
    std::fs::create_dir_all(&snapshot)?;
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(dir.join(f), snapshot.join(f))?;
    }
    let fetched = hub::fetch("specdec/stories260k", Some(cache.clone()))?;
    assert_eq!(fetched, snapshot);
    assert_eq!(greedy(&ModelFiles::HfDir(fetched), "Once upon a time")?, expected);
    // A repository that is neither cached nor reachable is a typed error.
    // Only `hf:` reaches the hub: an `org/name` not on disk is a local error that says so.
    let local = ModelFiles::resolve("specdec/not-there");
    assert!(matches!(&local, Err(Error::Load { reason, .. }) if reason.contains("hf:specdec/not-there")), "{local:?}");
    assert!(matches!(ModelFiles::resolve("hf:specdec/not-there"), Err(Error::Hub { .. })));
    // (hf-hub's own error kept as its source.)
    assert!(matches!(hub::fetch("specdec/not-there", Some(cache.clone())), Err(Error::Hub { source: Some(_), .. })));
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(cache);
    Ok(())
}

#[test]
fn tokenizers_rebuilt_from_gguf_round_trip() -> Result<()> {
    for name in [STORIES, SMOLLM2] {
        let Some(path) = model_path(name) else { continue };
        let tok = GgufFile::open(path)?.tokenizer()?;
        let text = "Once upon a time, Lily saw 3 big dogs!\nThey said: \"hello\" – naïve café.";
        let ids = tok.encode(text)?;
        assert_eq!(tok.decode(&ids)?, text, "{name}");
    }
    let Some(path) = model_path(SMOLLM2) else { return Ok(()) };
    let tok = GgufFile::open(path)?.tokenizer()?;
    // Special tokens in the text are single tokens; digits are split one by one (smollm).
    assert_eq!(tok.encode("<|im_start|>user")?[0], 1);
    assert_eq!(tok.encode("2024")?.len(), 4);
    Ok(())
}

#[test]
fn streamed_text_equals_the_whole_decoded_at_once() -> Result<()> {
    // Byte-level BPE (SmolLM2, Qwen), SentencePiece (the stories model, Gemma): accents, CJK and
    // an emoji whose bytes span several tokens, streamed one token at a time and three at a time.
    let text = "Once upon a time, naïve café: 你好世界 👍🏽 done.\n  indented  twice";
    for name in [STORIES, SMOLLM2, GEMMA3, QWEN_0_5B] {
        let Some(path) = model_path(name) else { continue };
        let tok = GgufFile::open(path)?.tokenizer()?;
        let ids = tok.encode(text)?;
        let whole = tok.decode(&ids)?;
        for chunk in [1, 3] {
            let mut stream = TextStream::new();
            let mut streamed = String::new();
            for piece in ids.chunks(chunk) {
                let new = stream.push(&tok, piece)?;
                // (The stories model's 512 tokens cannot spell CJK: its whole text has U+FFFD too.)
                let broken = new.contains('\u{FFFD}') && !whole.contains('\u{FFFD}');
                assert!(!broken, "{name}: a broken character was streamed: {new:?}");
                streamed.push_str(&new);
            }
            assert_eq!(streamed, whole, "{name}, {chunk} at a time");
        }
    }
    Ok(())
}

fn copy_model(tag: &str, edit: impl FnOnce(&mut Vec<u8>)) -> Option<PathBuf> {
    let src = model_path(STORIES)?;
    let mut bytes = std::fs::read(src).expect("read model");
    edit(&mut bytes);
    let path = temp_dir(tag).join("model.gguf");
    std::fs::write(&path, bytes).expect("write copy");
    Some(path)
}

fn load_err(path: &Path) -> Error {
    match ModelFiles::Gguf(path.to_path_buf()).load(WeightFormat::F32, &Device::Cpu) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

#[test]
fn missing_truncated_and_corrupt_files_are_typed_errors() {
    assert!(matches!(load_err(Path::new("/nonexistent/model.gguf")), Error::Load { .. }));
    let Some(len) = model_path(STORIES).map(|p| std::fs::metadata(p).expect("stat").len() as usize) else { return };
    for cut in [0, 3, 100, len / 2, len - 1] {
        let path = copy_model("cut", |b| b.truncate(cut)).expect("model present");
        assert!(matches!(load_err(&path), Error::Load { .. }), "cut at {cut}");
    }
    let path = copy_model("magic", |b| b[0] ^= 0xff).expect("model present");
    let e = load_err(&path);
    assert!(matches!(e, Error::Load { .. }));
    // The parser's own error stays reachable as the source.
    assert!(std::error::Error::source(&e).is_some(), "{e} has no source");
    // Flipping any single byte of the header must never panic: it loads or fails cleanly.
    for i in (0..4096).step_by(7) {
        let path = copy_model("flip", |b| b[i] ^= 0x5a).expect("model present");
        let _ = ModelFiles::Gguf(path).load(WeightFormat::F32, &Device::Cpu);
    }
}

#[test]
fn unknown_architecture_is_a_typed_error() {
    let Some(path) = copy_model("arch", |b| {
        let at = b.windows(5).position(|w| w == b"llama").expect("architecture string");
        b[at..at + 5].copy_from_slice(b"gptxx");
    }) else {
        return;
    };
    assert!(matches!(load_err(&path), Error::UnsupportedArchitecture(a) if a == "gptxx"));
}

#[test]
fn mismatched_tokenizers_are_refused() -> Result<()> {
    let (Some(a), Some(b)) = (model_path(STORIES), model_path(SMOLLM2)) else { return Ok(()) };
    let (ta, tb) = (GgufFile::open(a)?.tokenizer()?, GgufFile::open(b)?.tokenizer()?);
    assert!(matches!(
        specdec::check_compatible(specdec::Pair { target: ("smollm2", &tb), draft: ("stories", &ta) }),
        Err(Error::TokenizerMismatch { .. })
    ));
    assert!(specdec::check_compatible(specdec::Pair { target: ("b", &ta), draft: ("a", &ta) }).is_ok());
    Ok(())
}

#[test]
fn a_prompt_longer_than_the_context_is_a_typed_error() -> Result<()> {
    let Some(path) = model_path(STORIES) else { return Ok(()) };
    let (w, _) = ModelFiles::Gguf(path).load(WeightFormat::F32, &Device::Cpu)?;
    let long = vec![5u32; w.config().max_context + 1];
    let mut plain = PlainDecoder::new(Llama::new(w)?, SamplingConfig::greedy());
    assert!(matches!(plain.generate(&long), Err(Error::ContextTooLong { .. })));
    assert_eq!(plain.generate(&[1, 5])?.tokens.len(), 128);
    Ok(())
}

#[test]
fn cuda_without_the_feature_is_a_typed_error() {
    if cfg!(feature = "cuda") {
        return;
    }
    assert!(matches!(specdec::device("cuda"), Err(Error::DeviceUnavailable { .. })));
    assert!(matches!(specdec::device("tpu"), Err(Error::DeviceUnavailable { .. })));
    assert!(specdec::device("cpu").is_ok());
}

#[test]
fn a_tokenizer_that_cannot_be_read_keeps_the_libraries_error_as_its_source() {
    let dir = temp_dir("bad-tokenizer");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, "{ not json").expect("write");
    match specdec::Tokenizer::from_file(&path) {
        Err(e @ Error::Tokenizer { .. }) => assert!(std::error::Error::source(&e).is_some(), "{e}"),
        other => panic!("expected a tokenizer error, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A tensor of the wrong shape is a load error that names the file it was read from (and the
/// tensor in its reason), not the tensor as if it were a file.
#[test]
fn a_tensor_of_the_wrong_shape_names_its_file() -> Result<()> {
    let Some(gguf) = model_path(STORIES) else { return Ok(()) };
    let dir = temp_dir("wrong-shape");
    write_hf_checkpoint(&gguf, &dir)?;
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?).expect("JSON");
    config["intermediate_size"] = serde_json::json!(config["intermediate_size"].as_u64().unwrap_or(0) + 1);
    std::fs::write(&path, config.to_string())?;
    let err =
        ModelFiles::HfDir(dir.clone()).load(WeightFormat::F32, &Device::Cpu).map(drop).expect_err("a wrong shape");
    match &err {
        Error::Load { path, reason, .. } => {
            assert_eq!(path, &dir, "{err}");
            assert!(reason.contains("mlp") || reason.contains("ffn"), "{err}");
        }
        other => panic!("not a load error: {other}"),
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
