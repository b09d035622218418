//! Inputs that crashed the file readers under fuzzing (`scripts/fuzz.sh`, `fuzz/`), or that
//! would have, kept as cases that must end in a typed error, never a panic, an abort or a huge
//! allocation. Each hand-built GGUF header names the guard it tests.

use candle_core::Device;
use specdec::loading::GgufFile;
use specdec::{Error, Result};

// GGUF metadata value types.
const U8: u32 = 0;
const I8: u32 = 1;
const U32: u32 = 4;
const F32_VALUE: u32 = 6;
const STRING: u32 = 8;
const ARRAY: u32 = 9;
const U64: u32 = 10;
// GGML tensor type.
const F32: u32 = 0;

fn string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

/// A GGUF v3 file: metadata (key, value type, value bytes), tensor infos (name, dims, GGML
/// type, offset), 32-byte padding, then `data`.
fn gguf(meta: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32, u64)], data: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (key, kind, value) in meta {
        b.extend(string(key));
        b.extend(kind.to_le_bytes());
        b.extend(value);
    }
    for (name, dims, kind, offset) in tensors {
        b.extend(string(name));
        b.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(kind.to_le_bytes());
        b.extend(offset.to_le_bytes());
    }
    b.resize(b.len().next_multiple_of(32), 0);
    b.extend(data);
    b
}

/// The `llama.*` entries a config needs, for a model of width 8, two heads and one layer.
fn llama_meta() -> Vec<(&'static str, u32, Vec<u8>)> {
    let mut meta = vec![("general.architecture", STRING, string("llama"))];
    let sizes = [
        ("llama.embedding_length", 8u32),
        ("llama.feed_forward_length", 8),
        ("llama.attention.head_count", 2),
        ("llama.block_count", 1),
        ("llama.context_length", 8),
    ];
    meta.extend(sizes.map(|(key, v)| (key, U32, v.to_le_bytes().to_vec())));
    meta
}

/// What the `gguf` fuzz target does: open, config, read every tensor it names.
fn load_gguf(bytes: &[u8], tensors: &[&str]) -> Result<()> {
    let mut file = GgufFile::from_bytes(bytes)?;
    file.config()?;
    for name in tensors {
        file.tensor(name, &Device::Cpu)?.dequantize(&Device::Cpu)?;
    }
    Ok(())
}

fn load_reason(r: Result<impl Sized>) -> String {
    match r {
        Err(Error::Load { reason, .. }) => reason,
        Err(e) => panic!("expected Error::Load, got {e}"),
        Ok(_) => panic!("expected Error::Load, got Ok"),
    }
}

#[test]
fn the_hand_built_header_loads() -> Result<()> {
    // The header the other cases corrupt must read back as written, or they test nothing.
    let data: Vec<u8> = (0..8).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
    let bytes = gguf(&llama_meta(), &[("token_embd.weight", &[8], F32, 0)], &data);
    load_gguf(&bytes, &["token_embd.weight"])?;
    let mut file = GgufFile::from_bytes(bytes)?;
    let c = file.config()?;
    let sizes = (c.hidden_size, c.intermediate_size, c.num_heads, c.num_layers, c.max_context);
    assert_eq!(sizes, (8, 8, 2, 1, 8));
    assert_eq!(c.head_dim, 4);
    let values = file.tensor("token_embd.weight", &Device::Cpu)?.dequantize(&Device::Cpu)?.to_vec1::<f32>()?;
    assert_eq!(values, (0..8).map(|i| i as f32 * 0.5).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn zero_alignment_is_an_error_not_a_division_by_zero() {
    // candle's parser divides the header's end by `general.alignment`.
    for (kind, value) in [(U32, 0u32.to_le_bytes().to_vec()), (I8, vec![0]), (U8, vec![0])] {
        let bytes = gguf(&[("general.alignment", kind, value)], &[], &[]);
        assert!(load_reason(GgufFile::from_bytes(bytes)).contains("alignment"));
    }
    // A key written with trailing NULs is the same key to candle.
    let bytes = gguf(&[("general.alignment\0\0", U32, vec![0; 4])], &[], &[]);
    assert!(load_reason(GgufFile::from_bytes(bytes)).contains("alignment"));
}

#[test]
fn tensor_sizes_that_overflow_or_are_empty_are_errors() {
    for dims in [&[1 << 40, 1 << 40][..], &[u64::MAX, 2], &[0, 8], &[8, 0, 8]] {
        let bytes = gguf(&[], &[("t", dims, F32, 0)], &[0; 64]);
        assert!(load_reason(GgufFile::from_bytes(bytes)).contains("does not fit"), "{dims:?}");
    }
}

#[test]
fn a_scalar_token_embd_is_an_error_in_config() {
    // No `tokenizer.ggml.tokens`: the vocabulary size comes from token_embd's rows, and a
    // 0-dimensional tensor has none.
    let bytes = gguf(&llama_meta(), &[("token_embd.weight", &[], F32, 0)], &[0; 4]);
    assert!(matches!(GgufFile::from_bytes(bytes).and_then(|f| f.config()), Err(Error::MissingTensor(_))));
}

#[test]
fn u64_metadata_past_u32_is_an_error_not_a_truncation() {
    let mut meta = llama_meta();
    meta[1] = ("llama.embedding_length", U64, ((1u64 << 32) + 8).to_le_bytes().to_vec());
    let bytes = gguf(&meta, &[], &[]);
    assert!(load_reason(GgufFile::from_bytes(bytes).and_then(|f| f.config())).contains("out of range"));
}

#[test]
fn metadata_arrays_are_capped_in_all() {
    let n = specdec::loading::gguf::MAX_ARRAY_ELEMENTS / 2 + 1;
    let array = |n: u64| [U8.to_le_bytes().to_vec(), n.to_le_bytes().to_vec(), vec![0; n as usize]].concat();
    let bytes = gguf(&[("a", ARRAY, array(n)), ("b", ARRAY, array(n))], &[], &[]);
    assert!(load_reason(GgufFile::from_bytes(bytes)).contains("array elements"));
    // Nested 65 deep: candle's own limit, met by the walk first.
    let mut value = [U8.to_le_bytes().to_vec(), 0u64.to_le_bytes().to_vec()].concat();
    for _ in 0..65 {
        value = [ARRAY.to_le_bytes().to_vec(), 1u64.to_le_bytes().to_vec(), value].concat();
    }
    let bytes = gguf(&[("deep", ARRAY, value)], &[], &[]);
    assert!(load_reason(GgufFile::from_bytes(bytes)).contains("nested"));
}

fn array(kind: u32, items: &[Vec<u8>]) -> Vec<u8> {
    [kind.to_le_bytes().to_vec(), (items.len() as u64).to_le_bytes().to_vec(), items.concat()].concat()
}

#[test]
fn a_megabyte_token_does_not_stall_the_sentencepiece_rebuild() -> Result<()> {
    // Every split of every token used to be a hash lookup of both halves: quadratic in a
    // token's length: 84 s for this one token of a MiB, hours for a few MiB.
    let long = "a".repeat(1 << 20);
    let tokens = ["<unk>", "<s>", "</s>", "▁", "a", "aa", "aaa", long.as_str()];
    let meta = [
        ("tokenizer.ggml.model", STRING, string("llama")),
        ("tokenizer.ggml.tokens", ARRAY, array(STRING, &tokens.map(string))),
        ("tokenizer.ggml.scores", ARRAY, array(F32_VALUE, &tokens.map(|_| 0f32.to_le_bytes().to_vec()))),
    ];
    let tok = GgufFile::from_bytes(gguf(&meta, &[], &[]))?.tokenizer()?;
    assert_eq!(tok.decode(&tok.encode("aaaa")?)?, "aaaa");
    Ok(())
}

/// What the `hf_dir` fuzz target does: a folder with `config.json` and a safetensors file
/// holding one `[rows, 16]` f32 query weight, then that weight read back.
fn load_hf_dir(tag: &str, config: &str, rows: usize) -> Result<()> {
    use specdec::loading::{SafetensorsDir, TensorSource};
    let dir = std::env::temp_dir().join(format!("specdec-fuzz-regression-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let data = vec![0u8; rows * 16 * 4];
    let header = format!(
        r#"{{"model.layers.0.self_attn.q_proj.weight":{{"dtype":"F32","shape":[{rows},16],"data_offsets":[0,{}]}}}}"#,
        data.len()
    );
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header.as_bytes());
    file.extend(&data);
    std::fs::write(dir.join("config.json"), config)?;
    std::fs::write(dir.join("model.safetensors"), file)?;
    let read = SafetensorsDir::open(&dir).and_then(|mut st| st.qtensor("blk.0.attn_q.weight", &Device::Cpu).map(drop));
    std::fs::remove_dir_all(&dir)?;
    read
}

fn hf_config(heads: usize) -> String {
    format!(
        r#"{{"model_type":"llama","vocab_size":32,"hidden_size":16,"intermediate_size":24,
        "num_hidden_layers":1,"num_attention_heads":{heads},"num_key_value_heads":1,"head_dim":8}}"#
    )
}

#[test]
fn zero_attention_heads_is_an_error_not_a_division_by_zero() -> Result<()> {
    // Found by the `hf_dir` target: `num_attention_heads: 0` passed the config checks, then the
    // query weight's head reordering divided by it.
    load_hf_dir("heads1", &hf_config(1), 8)?;
    match load_hf_dir("heads0", &hf_config(0), 8) {
        Err(Error::InvalidSetting { name, .. }) => assert_eq!(name, "num_heads"),
        other => panic!("expected InvalidSetting(num_heads), got {other:?}"),
    }
    Ok(())
}
