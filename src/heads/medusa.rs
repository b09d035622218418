//! Medusa heads (Cai et al. 2024): K small heads on the target's last hidden state, head `i`
//! guessing the token `i + 2` places on (one past the target's own next token). Their rows do
//! not depend on the tokens drafted before them, so a tree takes each level's children from
//! one head.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::config::HeadFiles;
use super::target::{cut_rows, draft_vocab, head_matrix, widen, Proj, TargetParts};
use crate::error::{Error, Result};
use crate::model::grow;
use crate::model::{DraftModel, Proposal, TokenModel};
use crate::models::{Features, Linear};
use crate::stop::check_tokens;
use crate::tree::{ChildPicker, DraftTree, TreeBudget};

/// One Medusa head: residual blocks `x + SiLU(W x + b)`, then an output head (its own, or the
/// target's in heads saved without one).
#[derive(Debug, Clone)]
struct Head {
    blocks: Vec<Proj>,
    output: Linear,
}

/// Medusa heads with the target's output head.
#[derive(Debug, Clone)]
pub struct MedusaHead {
    heads: Vec<Head>,
    hidden: usize,
    vocab: usize,
    /// A draft vocabulary the output heads are cut to, if the heads carry one (`d2t`).
    d2t: Option<Vec<u32>>,
    device: Device,
}

impl MedusaHead {
    /// Builds the heads from their files (`medusa_num_heads`, `medusa_num_layers`, tensors
    /// `{i}.{j}.linear.weight|bias` and `{i}.{layers}.weight`) for `target`; with `quantize`,
    /// output heads are held as Q8_0.
    ///
    /// # Errors
    /// [`Error::MissingTensor`], [`Error::HeadMismatch`] for shapes that do not fit the target,
    /// [`Error::InvalidSetting`] for no heads.
    pub fn load(mut files: HeadFiles, target: &TargetParts, quantize: bool) -> Result<Self> {
        let (h, vocab) = (target.config.hidden_size, target.config.vocab_size);
        let count = files.config.medusa_num_heads.unwrap_or(0);
        let layers = files.config.medusa_num_layers.unwrap_or(1);
        if count == 0 {
            return Err(Error::setting("medusa_num_heads", count, "at least one head"));
        }
        let d2t = files.tensors.remove("d2t").map(|d| draft_vocab(&d, None, vocab)).transpose()?;
        let hold = |w: &Tensor| -> Result<Linear> { head_matrix(&cut_rows(w, d2t.as_deref())?, quantize) };
        let shared = hold(&target.output)?;
        let heads = (0..count)
            .map(|i| {
                let blocks = (0..layers)
                    .map(|j| {
                        let w = files.take(&format!("{i}.{j}.linear.weight"), &[h, h])?;
                        let b = files.take_opt(&format!("{i}.{j}.linear.bias"), &[h])?;
                        Proj::new(w, b, quantize)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let output = match files.take_opt(&format!("{i}.{layers}.weight"), &[vocab, h])? {
                    Some(w) => hold(&w)?,
                    None => shared.clone(),
                };
                Ok(Head { blocks, output })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { heads, hidden: h, vocab, d2t, device: target.embed.device().clone() })
    }

    /// The number of heads.
    pub fn len(&self) -> usize {
        self.heads.len()
    }

    /// Whether there are no heads (never, once loaded).
    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    /// Head `i`'s logits over the target's vocabulary, a row per state `(rows, hidden)`
    /// (−∞ outside a draft vocabulary).
    ///
    /// # Errors
    /// Backend failures; [`Error::InvalidSetting`] for a head that does not exist.
    pub fn logits(&self, i: usize, x: &Tensor) -> Result<Vec<Vec<f32>>> {
        Ok(widen(self.forward(i, x)?.to_vec2::<f32>()?, self.d2t.as_deref(), self.vocab))
    }

    /// Head `i`'s logits `(…, draft vocab)` of target states `(…, hidden)`.
    ///
    /// # Errors
    /// Backend failures; [`Error::InvalidSetting`] for a head that does not exist.
    pub fn forward(&self, i: usize, x: &Tensor) -> Result<Tensor> {
        let head = self.heads.get(i).ok_or_else(|| Error::setting("medusa head", i, "below the number of heads"))?;
        let mut x = x.clone();
        for b in &head.blocks {
            x = (&x + candle_nn::ops::silu(&b.forward(&x)?)?)?;
        }
        head.output.forward(&x)
    }
}

/// Medusa heads drafting for the target whose final hidden states `features` records.
#[derive(Debug)]
pub struct MedusaDraft {
    head: Arc<MedusaHead>,
    features: Features,
    held: usize,
}

impl MedusaDraft {
    /// A drafter over `head` reading `features` (from
    /// [`Llama::record_hidden`](crate::Llama::record_hidden) with [`Tap::Final`](crate::models::Tap::Final)).
    ///
    /// # Errors
    /// [`Error::HeadMismatch`] when the recorded rows are not the hidden size wide.
    pub fn new(head: Arc<MedusaHead>, features: Features) -> Result<Self> {
        if features.width() != head.hidden {
            return Err(Error::HeadMismatch {
                what: "recorded hidden-state width".into(),
                head: head.hidden.to_string(),
                target: features.width().to_string(),
            });
        }
        Ok(Self { head, features, held: 0 })
    }

    /// The state the next token is guessed from and the head that guesses it: head `i` reads
    /// the state after token `b` and guesses token `b + i + 2`.
    fn source(&self) -> Option<(usize, usize)> {
        let b = self.held.checked_sub(2)?.min(self.features.len().checked_sub(1)?);
        let i = self.held - 2 - b;
        (i < self.head.len()).then_some((b, i))
    }

    /// Row of head `i` from the state after token `b`.
    fn row(&self, b: usize, i: usize) -> Result<Vec<f32>> {
        let x = Tensor::from_vec(self.features.rows(b, b + 1)?, (1, self.head.hidden), &self.head.device)?;
        Ok(self.head.logits(i, &x)?.swap_remove(0))
    }

    fn absorb(&mut self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        check_tokens(tokens, self.head.vocab)?;
        self.held += tokens.len();
        Ok(())
    }
}

impl TokenModel for MedusaDraft {
    fn vocab_size(&self) -> usize {
        self.head.vocab
    }

    fn context_len(&self) -> usize {
        self.held
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.held {
            return Err(Error::BadTruncate { len: self.held, to: len });
        }
        self.held = len;
        Ok(())
    }
}

impl DraftModel for MedusaDraft {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        self.absorb(tokens)?;
        match self.source() {
            Some((b, i)) => Ok(Proposal::Logits(self.row(b, i)?)),
            None => Ok(Proposal::Nothing),
        }
    }

    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, picker: &mut ChildPicker) -> Result<DraftTree> {
        self.absorb(tokens)?;
        let Some((b, first)) = self.source() else { return Ok(DraftTree::new()) };
        let budget = budget.at_most_deep(self.head.len() - first);
        let mut rows: Vec<Option<Vec<f32>>> = vec![None; budget.depth() + 1];
        let (tree, _) = grow(budget, picker, self.row(b, first)?, |all, frontier| {
            frontier
                .iter()
                .map(|&n| {
                    // The frontier node's children are one level below it.
                    let depth = all.depth(n) + 1;
                    if rows[depth].is_none() {
                        rows[depth] = Some(self.row(b, first + depth)?);
                    }
                    Ok(rows[depth].clone().unwrap_or_default())
                })
                .collect()
        })?;
        Ok(tree)
    }
}
