//! What a head borrows from its target: the token embedding and the output head.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::{Error, Result};
use crate::loading::{GgufFile, ModelFiles, SafetensorsDir};
use crate::models::tensors::TensorSource;
use crate::models::LlamaConfig;

/// An output head: a dense matrix (differentiable, for training) or a quantized one (for
/// drafting: a Q8_0 copy streams a quarter of the f32 bytes per token).
#[derive(Debug, Clone)]
pub enum OutputHead {
    /// `(vocab, hidden)` f32 weights.
    Dense(Tensor),
    /// Quantized weights.
    Quantized(Arc<QMatMul>),
}

impl OutputHead {
    /// The quantized copy of dense weights.
    ///
    /// # Errors
    /// Backend failures; a width Q8_0 cannot block (not a multiple of 32).
    pub fn quantize(weights: &Tensor) -> Result<Self> {
        let q = QTensor::quantize(weights, GgmlDType::Q8_0)?;
        Ok(Self::Quantized(Arc::new(QMatMul::from_qtensor(q)?)))
    }

    /// Logits `(…, vocab)` of hidden states `(…, hidden)`.
    ///
    /// # Errors
    /// Shape mismatches.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Dense(w) => x.broadcast_matmul(&w.t()?)?,
            Self::Quantized(q) => q.forward(x)?,
        })
    }
}

/// The target's token embedding `(vocab, hidden)` and output head, as a head uses them.
#[derive(Debug, Clone)]
pub struct TargetParts {
    /// The target's shape.
    pub config: LlamaConfig,
    /// The token embedding, f32.
    pub embed: Tensor,
    /// The output head (tied to the embedding or not), f32.
    pub output: Tensor,
}

impl TargetParts {
    /// Reads them from the target's files onto `device`.
    ///
    /// # Errors
    /// Loading failures, [`Error::MissingTensor`].
    pub fn read(files: &ModelFiles, device: &Device) -> Result<Self> {
        let (mut source, config): (Box<dyn TensorSource>, LlamaConfig) = match files {
            ModelFiles::Gguf(path) => {
                let file = GgufFile::open(path)?;
                let config = file.config()?;
                (Box::new(file), config)
            }
            ModelFiles::HfDir(dir) => {
                let dir = SafetensorsDir::open(dir)?;
                let config = dir.config().clone();
                (Box::new(dir), config)
            }
        };
        let tied = !source.has("output.weight");
        let mut read = |name: &str| -> Result<Tensor> { Ok(source.qtensor(name, device)?.dequantize(device)?) };
        let embed = read("token_embd.weight")?;
        let output = if tied { embed.clone() } else { read("output.weight")? };
        for (name, t) in [("token_embd.weight", &embed), ("output.weight", &output)] {
            if t.dims() != [config.vocab_size, config.hidden_size] {
                return Err(Error::Load {
                    path: files.name().into(),
                    reason: format!("{name} has shape {:?}", t.dims()),
                });
            }
        }
        Ok(Self { config, embed, output })
    }
}
