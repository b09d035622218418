//! [`HeadDraft`]: an EAGLE or a Medusa drafter, as [`Drafter`](crate::Drafter) holds one.

use std::sync::Arc;

use candle_core::Device;

use super::{EagleDraft, EagleHead, EagleVersion, HeadFiles, MedusaDraft, MedusaHead, TargetParts};
use crate::error::Result;
use crate::model::{DraftModel, Proposal, TokenModel};
use crate::models::{Llama, Tap};
use crate::tree::{ChildPicker, DraftTree, TreeBudget};

/// An EAGLE head's drafter or Medusa heads' drafter.
#[derive(Debug)]
pub enum HeadDraft {
    /// An EAGLE-1/2 or EAGLE-3 head.
    Eagle(EagleDraft),
    /// Medusa heads.
    Medusa(MedusaDraft),
}

impl HeadDraft {
    /// The EAGLE head (`version` 1/2 or 3) in the folder or file `path`, for `target` (whose
    /// loaded embedding and output head it borrows). The target is set to record the hidden states the head reads (see
    /// [`Llama::record_hidden`]), which empties its context.
    ///
    /// # Errors
    /// Loading failures; [`Error::HeadMismatch`](crate::Error::HeadMismatch) for a head made
    /// for another model.
    pub fn eagle(path: &str, version: EagleVersion, target: &mut Llama, device: &Device) -> Result<Self> {
        let parts = TargetParts::from_weights(target.weights(), device)?;
        let head = EagleHead::load(HeadFiles::open(path, device)?, version, &parts, true)?;
        let features = target.record_hidden(head.taps().to_vec())?;
        Ok(Self::Eagle(EagleDraft::new(Arc::new(head), features)?))
    }

    /// Medusa heads in `path`, as [`eagle`](Self::eagle).
    ///
    /// # Errors
    /// As [`eagle`](Self::eagle).
    pub fn medusa(path: &str, target: &mut Llama, device: &Device) -> Result<Self> {
        let parts = TargetParts::from_weights(target.weights(), device)?;
        let head = MedusaHead::load(HeadFiles::open(path, device)?, &parts, true)?;
        Ok(Self::Medusa(MedusaDraft::new(Arc::new(head), target.record_hidden(vec![Tap::Final])?)?))
    }
}

impl TokenModel for HeadDraft {
    fn vocab_size(&self) -> usize {
        match self {
            Self::Eagle(e) => e.vocab_size(),
            Self::Medusa(m) => m.vocab_size(),
        }
    }

    fn context_len(&self) -> usize {
        match self {
            Self::Eagle(e) => e.context_len(),
            Self::Medusa(m) => m.context_len(),
        }
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        match self {
            Self::Eagle(e) => e.truncate(len),
            Self::Medusa(m) => m.truncate(len),
        }
    }
}

impl DraftModel for HeadDraft {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        match self {
            Self::Eagle(e) => e.propose(tokens),
            Self::Medusa(m) => m.propose(tokens),
        }
    }

    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, picker: &mut ChildPicker) -> Result<DraftTree> {
        match self {
            Self::Eagle(e) => e.propose_tree(tokens, budget, picker),
            Self::Medusa(m) => m.propose_tree(tokens, budget, picker),
        }
    }
}
