//! HF-layout checkpoints: `config.json`, `tokenizer.json` and one or more `*.safetensors`,
//! mapped to GGUF tensor names with the query/key rows put in interleaved-RoPE order.

use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::models::config::{HfConfig, LlamaConfig};
use crate::models::tensors::{to_interleaved, TensorSource};
use crate::tokenizer::Tokenizer;

/// An opened HF-layout folder.
pub struct SafetensorsDir {
    dir: PathBuf,
    config: LlamaConfig,
    tied: bool,
    tensors: MmapedSafetensors,
}

/// Reads a folder's `config.json` as `C` and maps its `*.safetensors` files.
///
/// # Errors
/// [`Error::Load`] for a missing or malformed config, no safetensors file (naming
/// `pytorch_model.bin` when that is all there is), or corrupt files.
pub(crate) fn open_folder<C: serde::de::DeserializeOwned>(dir: &Path) -> Result<(C, MmapedSafetensors)> {
    let fail = |reason: String| Error::Load { path: dir.to_path_buf(), reason };
    let text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| fail(format!("config.json: {e}")))?;
    let config: C = serde_json::from_str(&text).map_err(|e| fail(format!("config.json: {e}")))?;
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
    // SAFETY: the files are memory-mapped read-only; like every mmap-based loader this assumes
    // nobody truncates them while they are being read.
    let tensors = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| fail(format!("safetensors: {e}")))?;
    Ok((config, tensors))
}

impl SafetensorsDir {
    /// Opens `dir`, reading `config.json` and mapping every `*.safetensors` file.
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
        Tokenizer::from_file(self.dir.join("tokenizer.json"))
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
        self.hf_name(name).is_some_and(|hf| self.tensors.get(&hf).is_ok())
    }

    fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        let hf = self
            .hf_name(name)
            .filter(|hf| self.tensors.get(hf).is_ok())
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
