//! Finding and reading model files: GGUF, HF safetensors folders, and hub repositories.

pub mod gguf;
pub mod hub;
pub mod safetensors;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::Device;

use crate::error::{Error, Result};
use crate::models::config::LlamaConfig;
use crate::models::engine::Engine;
use crate::models::format::WeightFormat;
use crate::models::llama::LlamaWeights;
use crate::models::tensors::to_interleaved;
pub use crate::models::tensors::TensorSource;
use crate::pair::Pair;
use crate::tokenizer::Tokenizer;

pub use gguf::GgufFile;
pub use safetensors::SafetensorsDir;

impl TensorSource for GgufFile {
    fn has(&self, name: &str) -> bool {
        self.has_tensor(name)
    }

    fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        let t = self.tensor(name, device)?;
        let family = self.family()?;
        if !family.gguf_rows_in_halves() {
            return Ok(t);
        }
        let (heads, kv_heads) = self.head_counts(family)?;
        to_interleaved(name, t, heads, kv_heads, device)
    }
}

/// What marks a model or head spec as a hub repository id: `hf:org/name`.
pub const HUB_PREFIX: &str = "hf:";

/// Where a model lives.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelFiles {
    /// One GGUF file holding weights, config and tokenizer.
    Gguf(PathBuf),
    /// An HF-layout folder: `config.json`, `tokenizer.json`, `*.safetensors`.
    HfDir(PathBuf),
}

impl ModelFiles {
    /// The GGUF file or the folder.
    pub fn path(&self) -> &Path {
        match self {
            Self::Gguf(path) | Self::HfDir(path) => path,
        }
    }

    /// Resolves a model given as a `.gguf` path, an HF-layout folder, or, written
    /// `hf:org/name`, a hub repository (fetched into the hub cache; `HF_HOME` moves the cache).
    /// Only the `hf:` prefix reaches the network: a mistyped local path is an error, not a
    /// download.
    ///
    /// # Errors
    /// [`Error::Load`] when a path does not exist or is neither kind; [`Error::Hub`] when the
    /// download fails.
    pub fn resolve(spec: &str) -> Result<Self> {
        if let Some(repo) = spec.strip_prefix(HUB_PREFIX) {
            return hub::fetch(repo, None).map(Self::HfDir);
        }
        let path = Path::new(spec);
        if path.is_dir() {
            return Ok(Self::HfDir(path.to_path_buf()));
        }
        if path.is_file() || spec.ends_with(".gguf") {
            return Ok(Self::Gguf(path.to_path_buf()));
        }
        let reason = match hub::is_repo_id(spec) {
            true => format!("no such file or folder (a hub model is written {HUB_PREFIX}{spec})"),
            false => "no such file or folder".into(),
        };
        Err(Error::load(path, reason))
    }

    /// A short name for reports.
    pub fn name(&self) -> String {
        let path = match self {
            Self::Gguf(p) | Self::HfDir(p) => p,
        };
        path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
    }

    /// Reads the tokenizer only (no weights).
    ///
    /// # Errors
    /// Missing or corrupt files, unsupported tokenizers.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            Self::Gguf(path) => GgufFile::open(path)?.tokenizer(),
            Self::HfDir(dir) => SafetensorsDir::open(dir)?.tokenizer(),
        }
    }

    /// Reads the config, the tokenizer and the weights in `format` onto `device`.
    ///
    /// # Errors
    /// Missing, truncated or corrupt files, unsupported architectures or tokenizers.
    pub fn load(&self, format: WeightFormat, device: &Device) -> Result<(Arc<LlamaWeights>, Tokenizer)> {
        self.load_with(format, device, Engine::Auto)
    }

    /// Like [`load`](Self::load), for a chosen engine.
    ///
    /// # Errors
    /// As [`load`](Self::load); the native engine off the CPU.
    pub fn load_with(
        &self,
        format: WeightFormat,
        device: &Device,
        engine: Engine,
    ) -> Result<(Arc<LlamaWeights>, Tokenizer)> {
        let (mut source, config, tokenizer): (Box<dyn TensorSource>, LlamaConfig, Tokenizer) = match self {
            Self::Gguf(path) => {
                let file = GgufFile::open(path)?;
                let (config, tokenizer) = (file.config()?, file.tokenizer()?);
                (Box::new(file), config, tokenizer)
            }
            Self::HfDir(dir) => {
                let dir = SafetensorsDir::open(dir)?;
                let (config, tokenizer) = (dir.config().clone(), dir.tokenizer()?);
                (Box::new(dir), config, tokenizer)
            }
        };
        let tokenizer = tokenizer.with_eos(config.eos_token_ids.clone());
        let weights = LlamaWeights::load(source.as_mut(), config, format, device, engine)
            .map_err(|e| e.with_path(self.path()))?;
        Ok((Arc::new(weights), tokenizer))
    }
}

/// Checks that a draft and a target can be paired: the same tokenizer (the same token → id
/// map) and the same vocabulary size; each is named (`("model.gguf", &tokenizer)`).
///
/// # Errors
/// [`Error::TokenizerMismatch`] naming both models.
pub fn check_compatible(pair: Pair<(&str, &Tokenizer), (&str, &Tokenizer)>) -> Result<()> {
    let Pair { target, draft } = pair;
    let (d, t) = (draft.1, target.1);
    let detail = if d.vocab_size() != t.vocab_size() {
        format!("{} vs {} tokens", d.vocab_size(), t.vocab_size())
    } else if d.fingerprint() != t.fingerprint() {
        "same size, different token ids".to_string()
    } else {
        return Ok(());
    };
    Err(Error::TokenizerMismatch { draft: draft.0.to_string(), target: target.0.to_string(), detail })
}

/// The device named `cpu`, `cuda` or `cuda:N`.
///
/// # Errors
/// [`Error::DeviceUnavailable`] when this build has no CUDA support or no GPU answers.
pub fn device(name: &str) -> Result<Device> {
    let unavailable = |reason: String| Error::DeviceUnavailable { device: name.to_string(), reason };
    match name {
        "cpu" => Ok(Device::Cpu),
        _ if name == "cuda" || name.starts_with("cuda:") => {
            let ordinal: usize =
                name.strip_prefix("cuda:").map_or(Ok(0), str::parse).map_err(|_| unavailable("bad ordinal".into()))?;
            if !cfg!(feature = "cuda") {
                return Err(unavailable("this build has no CUDA support (rebuild with `--features cuda`)".into()));
            }
            Device::new_cuda(ordinal).map_err(|e| unavailable(e.to_string()))
        }
        _ => Err(unavailable("expected cpu, cuda or cuda:N".into())),
    }
}
