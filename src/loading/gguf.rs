//! GGUF files (v1 to v3): metadata → [`LlamaConfig`] and [`Tokenizer`], tensors as candle
//! `QTensor`s. candle parses the header (with its own bounds checks); this module adds the
//! checks a truncated file needs and turns every failure into a typed error.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::Device;

use crate::error::{Error, Result};
use crate::models::config::LlamaConfig;
use crate::tokenizer::Tokenizer;

/// An open GGUF file.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

impl GgufFile {
    /// Opens and checks the file: header, metadata, and that every tensor lies inside it.
    ///
    /// # Errors
    /// [`Error::Load`] for a missing, truncated or corrupt file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let fail = |reason: String| Error::Load { path: path.clone(), reason };
        let file = File::open(&path).map_err(|e| fail(format!("cannot open: {e}")))?;
        let len = file.metadata()?.len();
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| fail(format!("not a readable GGUF file: {e}")))?;
        for (name, info) in &content.tensor_infos {
            let blocks = info.shape.elem_count() / info.ggml_dtype.block_size();
            let end = (blocks as u64)
                .checked_mul(info.ggml_dtype.type_size() as u64)
                .and_then(|size| size.checked_add(content.tensor_data_offset))
                .and_then(|end| end.checked_add(info.offset));
            if end.is_none_or(|end| end > len) || info.shape.elem_count() % info.ggml_dtype.block_size() != 0 {
                return Err(fail(format!(
                    "truncated or corrupt: tensor `{name}` does not fit in the file's {len} bytes"
                )));
            }
        }
        Ok(Self { path, content, reader })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A metadata value.
    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// True when the file holds a tensor of that name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads a tensor onto `device`.
    ///
    /// # Errors
    /// [`Error::MissingTensor`], or [`Error::Load`] when it cannot be read.
    pub fn tensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(Error::MissingTensor(name.to_string()));
        }
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|e| Error::Load { path: self.path.clone(), reason: format!("tensor `{name}`: {e}") })
    }

    fn get_u32(&self, key: &str) -> Result<u32> {
        let value = self.metadata(key).ok_or_else(|| self.bad(format!("metadata `{key}` is missing")))?;
        value
            .to_u32()
            .or_else(|_| value.to_u64().map(|v| v as u32))
            .map_err(|e| self.bad(format!("metadata `{key}`: {e}")))
    }

    fn get_f32(&self, key: &str) -> Option<f32> {
        self.metadata(key).and_then(|v| v.to_f32().ok())
    }

    fn bad(&self, reason: String) -> Error {
        Error::Load { path: self.path.clone(), reason }
    }

    /// The model's shape from the `llama.*` metadata.
    ///
    /// # Errors
    /// [`Error::UnsupportedArchitecture`] unless `general.architecture` is `llama`;
    /// [`Error::Load`] for missing or malformed metadata.
    pub fn config(&self) -> Result<LlamaConfig> {
        let arch = self.metadata("general.architecture").and_then(|v| v.to_string().ok()).cloned().unwrap_or_default();
        if arch != "llama" {
            return Err(Error::UnsupportedArchitecture(arch));
        }
        let hidden_size = self.get_u32("llama.embedding_length")? as usize;
        let num_heads = self.get_u32("llama.attention.head_count")? as usize;
        let embd_rows = self.content.tensor_infos.get("token_embd.weight").map(|t| t.shape.dims()[0]);
        let vocab_size = match self.metadata("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()) {
            Some(tokens) => tokens.len(),
            None => embd_rows.ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?,
        };
        let eos_token_ids = self.get_u32("tokenizer.ggml.eos_token_id").map(|id| vec![id]).unwrap_or_default();
        let config = LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size: self.get_u32("llama.feed_forward_length")? as usize,
            num_layers: self.get_u32("llama.block_count")? as usize,
            num_heads,
            num_kv_heads: self.get_u32("llama.attention.head_count_kv").map(|v| v as usize).unwrap_or(num_heads),
            head_dim: self
                .get_u32("llama.rope.dimension_count")
                .map(|v| v as usize)
                .unwrap_or(hidden_size / num_heads.max(1)),
            rope_theta: self.get_f32("llama.rope.freq_base").unwrap_or(10_000.0),
            rms_norm_eps: self.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f64,
            max_context: self.get_u32("llama.context_length")? as usize,
            eos_token_ids,
        };
        config.validate()?;
        Ok(config)
    }

    /// The tokenizer stored in the metadata (`tokenizer.ggml.*`).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when it is absent or of a kind this crate does not rebuild.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::from_gguf_metadata(&self.content.metadata)
    }
}
