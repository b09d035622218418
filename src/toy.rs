//! Toy categorical models for tests, docs and simulation: fixed transition tables as in the
//! seed's Section 3.3. The next-token distribution depends on the last `order` tokens, so exact
//! sequence probabilities are at hand. They stand in for nothing in the product.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::error::{Error, Result};
use crate::model::{DraftModel, Logits, Proposal, TargetModel, TokenModel, Vocabulary};

/// A Markov model over `vocab` tokens whose next-token row depends on the last `order` tokens
/// (missing positions at the start of a context count as token 0).
#[derive(Debug, Clone)]
pub struct MarkovModel {
    vocab: usize,
    order: usize,
    table: Vec<f32>,
    ctx: Vec<u32>,
}

/// A target and its draft ([`MarkovModel::pair`]).
pub type ToyPair = crate::pair::Pair<MarkovModel, MarkovModel>;

impl MarkovModel {
    /// A model from its table: `vocab^order` rows of `vocab` probabilities, row-major.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for a zero vocabulary or order, a table of the wrong size, or a
    /// row with negative, non-finite or no mass.
    pub fn new(vocab: usize, order: usize, table: Vec<f32>) -> Result<Self> {
        let rows = vocab.checked_pow(order as u32).filter(|_| vocab > 0 && order > 0);
        if rows.and_then(|r| r.checked_mul(vocab)) != Some(table.len()) {
            return Err(Error::setting("table", table.len(), "vocab^order rows of vocab values (vocab, order >= 1)"));
        }
        let bad_row = table
            .chunks(vocab)
            .any(|r| r.iter().any(|&x| !(x >= 0.0 && x.is_finite())) || r.iter().sum::<f32>() <= 0.0);
        if bad_row {
            return Err(Error::setting("table", "a row", "non-negative finite values with a positive sum"));
        }
        Ok(Self { vocab, order, table, ctx: Vec::new() })
    }

    /// A random model with peaky rows: uniform draws cubed, then normalized (the seed's recipe).
    pub fn random(vocab: usize, order: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut table: Vec<f32> =
            (0..vocab.pow(order as u32) * vocab).map(|_| rng.random::<f32>().powi(3) + 1e-6).collect();
        normalize_rows(&mut table, vocab);
        Self { vocab, order, table, ctx: Vec::new() }
    }

    /// A draft for this model: `(1 − noise)·self + noise·random`, renormalized row by row.
    pub fn noisy_copy(&self, noise: f32, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut table: Vec<f32> = self.table.iter().map(|&p| (1.0 - noise) * p + noise * rng.random::<f32>()).collect();
        normalize_rows(&mut table, self.vocab);
        Self { table, ctx: Vec::new(), ..self.clone() }
    }

    /// A target and its draft, first-order models as in the seed's `make_models`.
    pub fn pair(vocab: usize, noise: f32, seed: u64) -> ToyPair {
        let target = Self::random(vocab, 1, seed);
        let draft = target.noisy_copy(noise, seed.wrapping_add(1));
        ToyPair { target, draft }
    }

    /// The vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The next-token probabilities after `context`.
    pub fn next_probs(&self, context: &[u32]) -> &[f32] {
        let state = (0..self.order).fold(0, |s, back| {
            let token = context.len().checked_sub(self.order - back).map_or(0, |i| context[i] as usize);
            s * self.vocab + token
        });
        &self.table[state * self.vocab..(state + 1) * self.vocab]
    }

    /// The tokens in the model's context.
    pub fn context(&self) -> &[u32] {
        &self.ctx
    }
}

fn normalize_rows(table: &mut [f32], vocab: usize) {
    for row in table.chunks_mut(vocab) {
        let total: f32 = row.iter().sum();
        row.iter_mut().for_each(|x| *x /= total);
    }
}

impl TokenModel for MarkovModel {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn context_len(&self) -> usize {
        self.ctx.len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.ctx.len() {
            return Err(Error::BadTruncate { len: self.ctx.len(), to: len });
        }
        self.ctx.truncate(len);
        Ok(())
    }
}

impl TargetModel for MarkovModel {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(Error::TokenOutOfRange { token, vocab: self.vocab });
        }
        if rows > tokens.len() {
            return Err(Error::setting("rows", rows, "at most the number of tokens fed"));
        }
        let first_row = self.ctx.len() + tokens.len() - rows;
        self.ctx.extend_from_slice(tokens);
        let mut data = Vec::with_capacity(rows * self.vocab);
        for end in first_row + 1..=self.ctx.len() {
            data.extend(self.next_probs(&self.ctx[..end]).iter().map(|p| p.ln()));
        }
        Logits::new(data, self.vocab)
    }
}

/// A deterministic drafter: proposes the argmax of a model's next row as a point mass when its
/// probability reaches `min_prob`, and nothing otherwise.
#[derive(Debug, Clone)]
pub struct PointDraft {
    model: MarkovModel,
    min_prob: f32,
}

impl PointDraft {
    /// Proposes `model`'s most likely token when it has at least `min_prob`.
    pub fn new(model: MarkovModel, min_prob: f32) -> Self {
        Self { model, min_prob }
    }
}

impl TokenModel for PointDraft {
    fn vocab_size(&self) -> usize {
        self.model.vocab
    }

    fn context_len(&self) -> usize {
        self.model.ctx.len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        TokenModel::truncate(&mut self.model, len)
    }
}

impl DraftModel for PointDraft {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        self.model.forward(tokens, 0)?;
        let row = self.model.next_probs(&self.model.ctx);
        let (best, p) = row.iter().enumerate().fold((0, -1.0), |b, (i, &p)| if p > b.1 { (i, p) } else { b });
        Ok(if p >= self.min_prob { Proposal::Token(best as u32) } else { Proposal::Nothing })
    }
}

/// A toy tokenizer: a list of token strings, encoded by longest match from the left and
/// decoded by concatenation, for cross-vocabulary tests (two vocabularies that split the same
/// text differently).
#[derive(Debug, Clone)]
pub struct ToyVocab {
    strings: Vec<String>,
}

impl ToyVocab {
    /// A vocabulary of `strings` (id i is `strings[i]`).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for an empty vocabulary or an empty string.
    pub fn new<S: Into<String>>(strings: impl IntoIterator<Item = S>) -> Result<Self> {
        let strings: Vec<String> = strings.into_iter().map(Into::into).collect();
        if strings.is_empty() || strings.iter().any(String::is_empty) {
            return Err(Error::setting("toy vocabulary", strings.len(), "non-empty strings, at least one"));
        }
        Ok(Self { strings })
    }
}

impl Vocabulary for ToyVocab {
    fn text(&self, ids: &[u32]) -> Result<String> {
        ids.iter()
            .map(|&id| {
                let vocab = self.strings.len();
                self.strings.get(id as usize).map(String::as_str).ok_or(Error::TokenOutOfRange { token: id, vocab })
            })
            .collect()
    }

    fn ids(&self, mut text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        while !text.is_empty() {
            let best = (0..self.strings.len()).filter(|&i| text.starts_with(&self.strings[i]));
            let Some(id) = best.max_by_key(|&i| (self.strings[i].len(), std::cmp::Reverse(i))) else {
                return Err(Error::tokenizer(format!("the toy vocabulary cannot spell {text:?}")));
            };
            ids.push(id as u32);
            text = &text[self.strings[id].len()..];
        }
        Ok(ids)
    }

    fn len(&self) -> usize {
        self.strings.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_last_tokens() {
        let mut m = MarkovModel::random(4, 2, 3);
        let logits = m.forward(&[1, 2, 3], 2).unwrap();
        assert_eq!(logits.rows(), 2);
        let expect: Vec<f32> = m.next_probs(&[9, 1, 2]).iter().map(|p| p.ln()).collect();
        assert_eq!(logits.row(0), &expect[..]);
        TokenModel::truncate(&mut m, 1).unwrap();
        assert_eq!(m.context(), &[1]);
        assert!(TokenModel::truncate(&mut m, 5).is_err());
        assert!(m.forward(&[4], 1).is_err());
    }

    #[test]
    fn bad_tables_are_errors() {
        assert!(MarkovModel::new(2, 1, vec![0.5; 3]).is_err());
        assert!(MarkovModel::new(2, 1, vec![0.5, 0.5, 0.0, 0.0]).is_err());
        assert!(MarkovModel::new(2, 1, vec![0.5, f32::NAN, 1.0, 0.0]).is_err());
        assert!(MarkovModel::new(0, 1, vec![]).is_err());
    }
}
