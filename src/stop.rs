//! When a generation stops ([`StopRule`]), and the checks every decoder makes on a prompt and
//! on what a model holds of the context.

use crate::error::{Error, Result};
use crate::stats::FinishReason;

/// When a generation ends: after `max_new_tokens`, or right after any of `stop_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopRule {
    /// The most tokens to generate.
    pub max_new_tokens: usize,
    /// Tokens that end the generation (included in the output as its last token).
    pub stop_tokens: Vec<u32>,
}

impl Default for StopRule {
    /// 128 new tokens, no stop token.
    fn default() -> Self {
        Self { max_new_tokens: 128, stop_tokens: Vec::new() }
    }
}

impl StopRule {
    /// Why a generation that has produced `generated` must stop, if it must.
    pub fn finish(&self, generated: &[u32]) -> Option<FinishReason> {
        match generated.last() {
            Some(t) if self.stop_tokens.contains(t) => Some(FinishReason::Stop),
            _ if generated.len() >= self.max_new_tokens => Some(FinishReason::Length),
            _ => None,
        }
    }

    pub(crate) fn check(&self, vocab: usize) -> Result<()> {
        check_tokens(&self.stop_tokens, vocab)
    }
}

/// Checks a prompt against a vocabulary.
pub(crate) fn check_prompt(prompt: &[u32], vocab: usize) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    check_tokens(prompt, vocab)
}

/// Checks tokens against a vocabulary: [`Error::TokenOutOfRange`] for the first outside it.
pub(crate) fn check_tokens(tokens: &[u32], vocab: usize) -> Result<()> {
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(&token) => Err(Error::TokenOutOfRange { token, vocab }),
        None => Ok(()),
    }
}

/// The tokens of `ctx` a model holding `len` of them has not seen yet (at least one).
pub(crate) fn pending<'a>(ctx: &'a [u32], len: usize, model: &'static str) -> Result<&'a [u32]> {
    if len >= ctx.len() {
        return Err(Error::BadModelOutput { model, what: "context tokens", expected: ctx.len() - 1, got: len });
    }
    Ok(&ctx[len..])
}
