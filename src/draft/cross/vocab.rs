//! The map between two vocabularies' shared token strings ([`VocabMap`]), and the text of a
//! stretch of tokens.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::model::Vocabulary;
use crate::pair::Pair;

/// The text of `ids[from..to]` as it reads inside `ids`: decoded with a few tokens before it,
/// whose own text is then cut off, so that word-start rules (a SentencePiece decoder dropping
/// a leading space) cancel out. `None` when the cut or the end falls inside a character (a
/// byte token of a character that other tokens complete).
pub(crate) fn text_within<V: Vocabulary + ?Sized>(
    vocab: &V,
    ids: &[u32],
    from: usize,
    to: usize,
) -> Result<Option<String>> {
    let before = from.saturating_sub(3);
    let head = vocab.text(&ids[before..from])?;
    let all = vocab.text(&ids[before..to])?;
    if head.ends_with('\u{FFFD}') || all.ends_with('\u{FFFD}') {
        return Ok(None);
    }
    Ok(all.strip_prefix(head.as_str()).map(str::to_string))
}

/// The text of token `id` alone, unless it is empty or only part of a character.
fn token_string<V: Vocabulary + ?Sized>(vocab: &V, id: u32) -> Result<Option<String>> {
    let s = vocab.text(&[id])?;
    Ok((!s.is_empty() && !s.contains('\u{FFFD}')).then_some(s))
}

/// Which draft ids have a target id of the same string: the vocabularies' intersection, built
/// once per pair with one hash map (no per-token string search).
#[derive(Debug, Clone, PartialEq)]
pub struct VocabMap {
    /// The target id of each draft id's string, or [`VocabMap::NONE`].
    to_target: Vec<u32>,
    /// How many draft ids have one.
    shared: usize,
}

impl VocabMap {
    /// The mark of a draft id whose string the target lacks.
    pub const NONE: u32 = u32::MAX;

    /// Maps every draft token to the target token of the same string. A token's string is its
    /// text alone; tokens of no whole character (byte pieces) and empty strings stay unmapped,
    /// and where a vocabulary has a string twice, its first id counts.
    ///
    /// # Errors
    /// Decoder failures; [`Error::InvalidSetting`] when no token is shared.
    pub fn new<T: Vocabulary + ?Sized, D: Vocabulary + ?Sized>(vocabs: Pair<&T, &D>) -> Result<Self> {
        let Pair { target, draft } = vocabs;
        let mut by_string: HashMap<String, u32> = HashMap::with_capacity(target.len());
        for id in 0..target.len() as u32 {
            if let Some(s) = token_string(target, id)? {
                by_string.entry(s).or_insert(id);
            }
        }
        let mut to_target = vec![Self::NONE; draft.len()];
        for (id, slot) in to_target.iter_mut().enumerate() {
            if let Some(s) = token_string(draft, id as u32)? {
                *slot = by_string.get(&s).copied().unwrap_or(Self::NONE);
            }
        }
        let shared = to_target.iter().filter(|&&t| t != Self::NONE).count();
        if shared == 0 {
            return Err(Error::setting("vocabularies", "no shared token", "at least one token string in both"));
        }
        Ok(Self { to_target, shared })
    }

    /// The target id of draft id `id`'s string, if the target has it.
    pub fn target_of(&self, id: u32) -> Option<u32> {
        self.to_target.get(id as usize).copied().filter(|&t| t != Self::NONE)
    }

    /// How many draft tokens have a target token of the same string.
    pub fn shared(&self) -> usize {
        self.shared
    }

    /// A draft logits row as a target row of `target_len` logits: each shared string's logit at
    /// its target id, `-inf` elsewhere. Sampled with any settings, it is the draft's
    /// distribution restricted to the shared strings and renormalized.
    pub fn target_row(&self, draft_row: &[f32], target_len: usize) -> Vec<f32> {
        let mut row = vec![f32::NEG_INFINITY; target_len];
        for (&t, &logit) in self.to_target.iter().zip(draft_row) {
            if let Some(slot) = row.get_mut(t as usize) {
                *slot = logit;
            }
        }
        row
    }
}
