//! HF-layout checkpoints: `config.json`, `tokenizer.json` and one or more `*.safetensors`,
//! mapped to GGUF tensor names with the query/key rows put in interleaved-RoPE order.

use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::safetensors::BufferedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::models::config::{HfConfig, LlamaConfig};
use crate::models::tensors::{to_interleaved, TensorSource};
use crate::tokenizer::Tokenizer;

/// An opened HF-layout folder.
pub struct SafetensorsDir {
    dir: PathBuf,
    config: LlamaConfig,
    tied: bool,
    tensors: Tensors,
}

/// The tensors of a folder's `*.safetensors` files, read into memory. (Mapping the files would
/// save the copy, but a mapped file that another process truncates is undefined behaviour
/// behind a safe call; candle makes mapping `unsafe` for that reason.)
pub(crate) struct Tensors(Vec<BufferedSafetensors>);

impl Tensors {
    /// Reads `files`.
    fn read(files: &[PathBuf]) -> Result<Self> {
        let read = |f: &PathBuf| {
            let bytes = std::fs::read(f).map_err(|e| Error::load_from(f, "cannot read", e))?;
            BufferedSafetensors::new(bytes).map_err(|e| Error::load_from(f, "not a safetensors file", e))
        };
        files.iter().map(read).collect::<Result<_>>().map(Self)
    }

    /// Whether a file holds tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|f| f.get(name).is_ok())
    }

    /// Tensor `name` on `device`, in its stored type.
    pub fn load(&self, name: &str, device: &Device) -> Result<Tensor> {
        let file = self.0.iter().find(|f| f.get(name).is_ok()).ok_or_else(|| Error::MissingTensor(name.into()))?;
        Ok(file.load(name, device)?)
    }

    /// Every tensor's name and view, file by file.
    #[cfg_attr(not(feature = "heads"), allow(dead_code))] // used by the draft heads
    pub fn views(&self) -> impl Iterator<Item = (String, safetensors::tensor::TensorView<'_>)> {
        self.0.iter().flat_map(|f| f.tensors())
    }
}

/// Reads a folder's `config.json` as `C` and its `*.safetensors` files.
///
/// # Errors
/// [`Error::Load`] for a missing or malformed config, no safetensors file (naming
/// `pytorch_model.bin` when that is all there is), or corrupt files.
pub(crate) fn open_folder<C: serde::de::DeserializeOwned>(dir: &Path) -> Result<(C, Tensors)> {
    let fail = |reason: String| Error::load(dir.to_path_buf(), reason);
    let text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| Error::load_from(dir, "config.json", e))?;
    let config: C = serde_json::from_str(&text).map_err(|e| Error::load_from(dir, "config.json", e))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        let reason = match dir.join("pytorch_model.bin").exists() {
            true => "only pytorch_model.bin: convert it to model.safetensors (this crate reads safetensors only)",
            false => "no *.safetensors file",
        };
        return Err(fail(reason.into()));
    }
    Ok((config, Tensors::read(&files)?))
}

impl SafetensorsDir {
    /// Opens `dir`, reading `config.json` and every `*.safetensors` file.
    ///
    /// # Errors
    /// [`Error::Load`] for missing or corrupt files; [`Error::UnsupportedArchitecture`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let (hf, tensors): (HfConfig, _) = open_folder(&dir)?;
        let config = hf.to_llama()?;
        Ok(Self { dir, tied: hf.tied(), config, tensors })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The folder's `tokenizer.json`.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when it is missing or unreadable.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let tok = Tokenizer::from_file(self.dir.join("tokenizer.json"))?;
        Ok(match chat_template(&self.dir.join("tokenizer_config.json"))? {
            Some(template) => tok.with_chat_template(template),
            None => tok,
        })
    }

    fn hf_name(&self, name: &str) -> Option<String> {
        if name == "output.weight" {
            return (!self.tied).then(|| "lm_head.weight".to_string());
        }
        let fixed = [("token_embd.weight", "model.embed_tokens.weight"), ("output_norm.weight", "model.norm.weight")];
        if let Some((_, hf)) = fixed.iter().find(|(g, _)| *g == name) {
            return Some(hf.to_string());
        }
        let rest = name.strip_prefix("blk.")?;
        let (layer, part) = rest.split_once('.')?;
        let (part, kind) = part.rsplit_once('.')?;
        let gemma = self.config.family.gemma();
        let part = match part {
            "attn_norm" => "input_layernorm",
            "ffn_norm" if gemma => "pre_feedforward_layernorm",
            "ffn_norm" => "post_attention_layernorm",
            "post_attention_norm" => "post_attention_layernorm",
            "post_ffw_norm" => "post_feedforward_layernorm",
            "attn_q" => "self_attn.q_proj",
            "attn_k" => "self_attn.k_proj",
            "attn_v" => "self_attn.v_proj",
            "attn_output" => "self_attn.o_proj",
            "attn_q_norm" => "self_attn.q_norm",
            "attn_k_norm" => "self_attn.k_norm",
            "ffn_gate" => "mlp.gate_proj",
            "ffn_up" => "mlp.up_proj",
            "ffn_down" => "mlp.down_proj",
            _ => return None,
        };
        Some(format!("model.layers.{layer}.{part}.{kind}"))
    }
}

impl TensorSource for SafetensorsDir {
    fn has(&self, name: &str) -> bool {
        self.hf_name(name).is_some_and(|hf| self.tensors.contains(&hf))
    }

    fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        let hf = self
            .hf_name(name)
            .filter(|hf| self.tensors.contains(hf))
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        let mut t = self.tensors.load(&hf, device)?.to_dtype(DType::F32)?;
        // Gemma's RMSNorm scales by (1 + w); GGUF files and this crate's engines take the sum.
        if self.config.family.gemma() && name.ends_with("norm.weight") {
            t = (t + 1.0)?;
        }
        let t = QTensor::quantize(&t, GgmlDType::F32)?;
        to_interleaved(name, t, self.config.num_heads, self.config.num_kv_heads, device)
    }
}

/// Query/key weight rows from the interleaved order GGUF llama files and this crate's RoPE use
/// into HF's halves order (each head's first rotary elements, then its second ones), for
/// writing HF checkpoints from GGUF weights.
///
/// # Errors
/// Shape errors.
pub fn interleaved_to_hf(w: &Tensor, heads: usize) -> Result<Tensor> {
    let (out, inp) = w.dims2()?;
    Ok(w.reshape((heads, out / heads / 2, 2, inp))?.transpose(1, 2)?.contiguous()?.reshape((out, inp))?)
}

/// The chat template of a folder's `tokenizer_config.json` (`chat_template`: a string, or a list
/// of named templates whose `default` is taken), with its `bos_token` and `eos_token` (strings,
/// or objects with a `content`). None without the file or the key.
fn chat_template(path: &Path) -> Result<Option<ChatTemplate>> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(None) };
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::load_from(path, "not JSON", e))?;
    let source = match &config["chat_template"] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(list) => {
            let named = |n: &serde_json::Value| n["name"] == "default";
            match list.iter().find(|n| named(n)).and_then(|n| n["template"].as_str()) {
                Some(s) => s.to_string(),
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let token = |key: &str| match &config[key] {
        serde_json::Value::String(s) => s.clone(),
        v => v["content"].as_str().unwrap_or_default().to_string(),
    };
    Ok(Some(ChatTemplate::new(source, token("bos_token"), token("eos_token"))))
}
