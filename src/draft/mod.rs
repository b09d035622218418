//! Drafters: heuristics that implement [`DraftModel`] without a model, and
//! [`Drafter`], the run-time choice between a model draft and the n-gram drafter.

mod expand;
pub mod ngram;
pub mod tree;

use std::str::FromStr;
use std::sync::Arc;

use candle_core::Device;

pub use expand::expand_tree;
pub use ngram::NGramDraft;
pub use tree::{Child, ChildPicker, DraftTree, TreeBudget};

use crate::error::{Error, Result};
use crate::loading::{check_compatible, ModelFiles};
use crate::model::{DraftModel, Proposal};
use crate::models::{Llama, LlamaWeights, WeightFormat};
use crate::tokenizer::Tokenizer;

/// Which drafter to build, as written on a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrafterSpec {
    /// `model` or `model:PATH_OR_HUB_ID`: a separate model (default: the target's file with its
    /// weights as stored, e.g. the Q4_1 weights of a Q4_1 GGUF).
    Model(Option<String>),
    /// `ngram`: prompt lookup, no model.
    NGram,
    /// `layerskip:N`: the target's first N blocks, sharing its weights.
    LayerSkip(usize),
    /// `quant:TYPE`: the target's weights re-quantized at load (`q8_0`, `q4_0`, `q4k`, …).
    Quant(WeightFormat),
}

impl FromStr for DrafterSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let (kind, arg) = s.split_once(':').map_or((s, None), |(k, a)| (k, Some(a)));
        match (kind, arg) {
            ("model", a) => Ok(Self::Model(a.map(str::to_string))),
            ("ngram", None) => Ok(Self::NGram),
            ("layerskip", Some(n)) => n
                .parse()
                .map(Self::LayerSkip)
                .map_err(|_| Error::setting("drafter", s, "layerskip:N with N a number of blocks")),
            ("quant", Some(t)) => Ok(Self::Quant(t.parse()?)),
            _ => Err(Error::setting("drafter", s, "model[:PATH], ngram, layerskip:N or quant:TYPE")),
        }
    }
}

impl std::fmt::Display for DrafterSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Model(None) => write!(f, "model"),
            Self::Model(Some(p)) => write!(f, "model:{p}"),
            Self::NGram => write!(f, "ngram"),
            Self::LayerSkip(n) => write!(f, "layerskip:{n}"),
            Self::Quant(q) => write!(f, "quant:{q}"),
        }
    }
}

/// A drafter chosen at run time.
// One value per model, built once: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Drafter {
    /// A model (separate, re-quantized or layer-skip).
    Model(Llama),
    /// Prompt lookup.
    NGram(NGramDraft),
}

impl Drafter {
    /// Builds the drafter `spec` for the target loaded from `files` as `target` with `tokenizer`.
    ///
    /// # Errors
    /// Loading failures; [`Error::TokenizerMismatch`] for a separate model with another tokenizer.
    pub fn build(
        spec: &DrafterSpec,
        files: &ModelFiles,
        target: &Arc<LlamaWeights>,
        tokenizer: &Tokenizer,
        device: &Device,
    ) -> Result<Self> {
        Ok(match spec {
            DrafterSpec::NGram => Self::NGram(NGramDraft::new(target.config().vocab_size)?),
            DrafterSpec::LayerSkip(n) => Self::Model(Llama::with_layers(target.clone(), (0..*n).collect())?),
            DrafterSpec::Quant(format) => Self::Model(Llama::new(files.load(*format, device)?.0)?),
            DrafterSpec::Model(None) => Self::Model(Llama::new(files.load(WeightFormat::Stored, device)?.0)?),
            DrafterSpec::Model(Some(path)) => {
                let draft_files = ModelFiles::resolve(path)?;
                let (weights, draft_tok) = draft_files.load(WeightFormat::Stored, device)?;
                check_compatible((&draft_files.name(), &draft_tok), (&files.name(), tokenizer))?;
                Self::Model(Llama::new(weights)?)
            }
        })
    }
}

impl DraftModel for Drafter {
    fn vocab_size(&self) -> usize {
        match self {
            Self::Model(m) => DraftModel::vocab_size(m),
            Self::NGram(n) => n.vocab_size(),
        }
    }

    fn context_len(&self) -> usize {
        match self {
            Self::Model(m) => m.context_len(),
            Self::NGram(n) => DraftModel::context_len(n),
        }
    }

    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        match self {
            Self::Model(m) => m.propose(tokens),
            Self::NGram(n) => n.propose(tokens),
        }
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        match self {
            Self::Model(m) => m.truncate(len),
            Self::NGram(n) => DraftModel::truncate(n, len),
        }
    }

    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, picker: &mut ChildPicker) -> Result<DraftTree> {
        match self {
            Self::Model(m) => m.propose_tree(tokens, budget, picker),
            Self::NGram(n) => n.propose_tree(tokens, budget, picker),
        }
    }
}
