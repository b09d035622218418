//! `config.json` of a draft head and the files it comes with.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::loading::safetensors::open_folder;
use crate::models::block::{BlockShape, RopeLayout};

/// The fields of a head's `config.json` this crate reads (EAGLE-1, EAGLE-3 and Medusa
/// heads write llama-style configs; Medusa adds its own two fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeadConfig {
    /// Width of the head's layer (the target's hidden size).
    #[serde(default)]
    pub hidden_size: usize,
    /// Feed-forward width.
    #[serde(default)]
    pub intermediate_size: usize,
    /// Query heads.
    #[serde(default)]
    pub num_attention_heads: usize,
    /// Key/value heads (default: the query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Width of one attention head (default: hidden / heads).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Layers of the head (EAGLE: 1).
    #[serde(default)]
    pub num_hidden_layers: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// The target's vocabulary size.
    #[serde(default)]
    pub vocab_size: usize,
    /// EAGLE-1: whether `fc` has a bias (absent: look for `fc.bias`).
    #[serde(default)]
    pub bias: Option<bool>,
    /// EAGLE-3: the draft vocabulary's size.
    #[serde(default)]
    pub draft_vocab_size: Option<usize>,
    /// EAGLE-3: the target's hidden size when it differs from the head's.
    #[serde(default)]
    pub target_hidden_size: Option<usize>,
    /// Medusa: the number of heads.
    #[serde(default)]
    pub medusa_num_heads: Option<usize>,
    /// Medusa: residual blocks per head.
    #[serde(default)]
    pub medusa_num_layers: Option<usize>,
}

fn default_eps() -> f64 {
    1e-5
}

fn default_theta() -> f64 {
    10_000.0
}

impl HeadConfig {
    /// The decoder layer's shape (HF's RoPE layout, as head checkpoints store their rows).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for zero sizes or heads that do not divide.
    pub(crate) fn block_shape(&self) -> Result<BlockShape> {
        let heads = self.num_attention_heads;
        let kv_heads = self.num_key_value_heads.unwrap_or(heads);
        if self.hidden_size == 0 || self.intermediate_size == 0 || heads == 0 || kv_heads == 0 {
            return Err(Error::setting("head config", "a zero size", "non-zero hidden, intermediate and head counts"));
        }
        if !heads.is_multiple_of(kv_heads) {
            return Err(Error::setting(
                "head config",
                format!("{heads} heads, {kv_heads} kv heads"),
                "kv heads dividing heads",
            ));
        }
        let head_dim = self.head_dim.unwrap_or(self.hidden_size / heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(Error::setting("head_dim", head_dim, "an even, non-zero width"));
        }
        Ok(BlockShape {
            heads,
            kv_heads,
            head_dim,
            eps: self.rms_norm_eps as f32,
            rope: RopeLayout::Halves,
            gelu: false,
        })
    }
}

/// A head's files: its config and its tensors (f32, on the device).
#[derive(Debug)]
pub struct HeadFiles {
    /// Where they came from, for messages.
    pub path: PathBuf,
    /// `config.json`.
    pub config: HeadConfig,
    /// Every tensor of the head's safetensors files.
    pub tensors: HashMap<String, Tensor>,
}

impl HeadFiles {
    /// Reads a head from a folder (`config.json` and `*.safetensors`) or, written
    /// `hf:org/name`, a hub repository (fetched into the hub cache). Heads published as
    /// `pytorch_model.bin` only must be converted to safetensors first.
    ///
    /// # Errors
    /// [`Error::Load`] for missing or corrupt files, [`Error::Hub`] for failed downloads.
    pub fn open(spec: &str, device: &Device) -> Result<Self> {
        let path = Path::new(spec);
        let dir = if let Some(repo) = spec.strip_prefix(crate::loading::HUB_PREFIX) {
            crate::loading::hub::fetch_head(repo, None)?
        } else if path.is_dir() {
            path.to_path_buf()
        } else {
            return Err(Error::load(
                path,
                "not a folder with config.json and *.safetensors (a hub head is written hf:org/name)",
            ));
        };
        let (config, st): (HeadConfig, _) = open_folder(&dir)?;
        let mut tensors = HashMap::new();
        for (name, view) in st.views() {
            // EAGLE-3's `t2d` is a boolean mask only training uses (and candle has no bool type).
            if view.dtype() == safetensors::Dtype::BOOL {
                continue;
            }
            let t = st.load(&name, device).map_err(|e| Error::load_from(&dir, &name, e))?;
            tensors.insert(name, f32_on(t, device)?);
        }
        Ok(Self { path: dir, config, tensors })
    }

    /// Takes the tensor `name`, checking its shape.
    ///
    /// # Errors
    /// [`Error::MissingTensor`]; [`Error::HeadMismatch`] for another shape.
    pub fn take(&mut self, name: &str, dims: &[usize]) -> Result<Tensor> {
        let t = self.tensors.remove(name).ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        check_dims(name, &t, dims)?;
        Ok(t)
    }

    /// Takes the tensor `name` when it is there.
    ///
    /// # Errors
    /// [`Error::HeadMismatch`] for another shape.
    pub fn take_opt(&mut self, name: &str, dims: &[usize]) -> Result<Option<Tensor>> {
        match self.tensors.contains_key(name) {
            true => self.take(name, dims).map(Some),
            false => Ok(None),
        }
    }
}

/// Checks a tensor's shape.
///
/// # Errors
/// [`Error::HeadMismatch`] naming the tensor.
pub(crate) fn check_dims(name: &str, t: &Tensor, dims: &[usize]) -> Result<()> {
    if t.dims() != dims {
        return Err(Error::HeadMismatch {
            what: format!("tensor `{name}`"),
            head: format!("{:?}", t.dims()),
            target: format!("{dims:?}"),
        });
    }
    Ok(())
}

/// A tensor as f32 on `device`.
fn f32_on(t: Tensor, device: &Device) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.to_device(device)?)
}
