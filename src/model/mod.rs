//! The two roles a model plays: the target that verifies and the draft that proposes; and
//! the tokenizer's, [`Vocabulary`], for drafts over another vocabulary.

mod expand;
mod vocab;

pub use expand::expand_tree;
#[cfg(feature = "heads")]
pub(crate) use expand::grow;
pub use vocab::Vocabulary;

use crate::error::{Error, Result};
use crate::tree::{ChildPicker, DraftTree, TreeBudget, TreeShape};

/// Logits rows on the host: `rows() × vocab()` values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    data: Vec<f32>,
    vocab: usize,
}

impl Logits {
    /// Wraps `data` as rows of `vocab` logits.
    ///
    /// # Errors
    /// [`Error::BadModelOutput`] when `vocab` is 0 or does not divide `data.len()`.
    pub fn new(data: Vec<f32>, vocab: usize) -> Result<Self> {
        if vocab == 0 || !data.len().is_multiple_of(vocab) {
            return Err(Error::BadModelOutput {
                model: "model",
                what: "logits values",
                expected: vocab,
                got: data.len(),
            });
        }
        Ok(Self { data, vocab })
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.data.len() / self.vocab
    }

    /// The row length.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row `i` (panics when `i >= rows()`, like slice indexing).
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// All values, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The last row as an owned vector (empty when there are no rows).
    pub fn into_last_row(mut self) -> Vec<f32> {
        let start = self.data.len().saturating_sub(self.vocab);
        self.data.drain(..start);
        self.data
    }
}

/// What both roles share: a vocabulary, and a context of tokens that can be rolled back.
/// [`TargetModel`] and [`DraftModel`] build on it, so that a model that is both has one
/// `vocab_size`, one `context_len` and one `truncate`.
pub trait TokenModel {
    /// The number of tokens in the vocabulary; every logits row has this length.
    fn vocab_size(&self) -> usize;

    /// How many tokens the context holds.
    fn context_len(&self) -> usize;

    /// Rolls the context back to its first `len` tokens. A target then holds exactly `len`. A
    /// draft may hold fewer (a draft head keeps only positions it computed from the target's
    /// own states): the decoders feed a draft whatever its
    /// [`context_len`](Self::context_len) says it lacks.
    ///
    /// # Errors
    /// [`Error::BadTruncate`] when `len > context_len()`.
    fn truncate(&mut self, len: usize) -> Result<()>;

    /// The model's state for its context positions `from..` (its keys and values, for a
    /// llama), for a [`PrefixCache`](crate::prefix::PrefixCache) to keep. `None` where the
    /// model holds no position from `from` on, or cannot hand its state out (the default).
    fn save_rows(&self, from: usize) -> Option<KvRows> {
        let _ = from;
        None
    }

    /// Makes `rows`, which [`save_rows`](Self::save_rows) handed out for the context
    /// `tokens` (one row per token, from a model over the same weights), the first
    /// `tokens.len()` positions of this model's context, in place of what it held. Returns
    /// whether it did; the default does not (false), and leaves the model as it was, as does a model
    /// whose rows have another width. A model that keeps a token history of its own beside a
    /// model ([`LookupOr`](crate::LookupOr)) restores the model and leaves its own context
    /// empty: the decoder then feeds it the tokens as usual, and the model only those past
    /// the restored ones.
    ///
    /// # Errors
    /// As [`truncate`](Self::truncate); [`Error::TokenOutOfRange`] and
    /// [`Error::ContextTooLong`] for tokens the model cannot hold.
    fn restore_rows(&mut self, tokens: &[u32], rows: &KvRows) -> Result<bool> {
        let _ = (tokens, rows);
        Ok(false)
    }
}

/// A model's state for a run of context positions: one row of `width` floats per position
/// (a llama's keys and values of every block), what a prefix cache keeps and restores.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvRows {
    width: usize,
    data: Vec<f32>,
}

impl KvRows {
    /// Wraps `data` as rows of `width` floats.
    ///
    /// # Errors
    /// [`Error::BadModelOutput`] when `width` is 0 or does not divide `data.len()`.
    pub fn new(width: usize, data: Vec<f32>) -> Result<Self> {
        if width == 0 || !data.len().is_multiple_of(width) {
            return Err(Error::BadModelOutput {
                model: "model",
                what: "state values",
                expected: width,
                got: data.len(),
            });
        }
        Ok(Self { width, data })
    }

    /// Floats per position.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// All values, position by position.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The values, position by position.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }
}

/// A model that scores tokens: it keeps a context (its KV cache) and extends it.
///
/// The target verifies k drafted tokens plus the bonus position in ONE `forward` call, and is
/// rolled back with `truncate` after a rejection.
pub trait TargetModel: TokenModel {
    /// Appends `tokens` to the context and returns the logits that follow each of the last
    /// `rows` of them (`rows <= tokens.len()`; 0 when only the cache is wanted, as in prefill).
    /// Row `i` is the next-token distribution after `tokens[tokens.len() - rows + i]`.
    ///
    /// # Errors
    /// Out-of-vocabulary tokens, a context past the model's limit, backend failures.
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits>;

    /// Scores a tree of tokens after the context: `tokens[0]` follows the context, `tokens[i]`
    /// (i ≥ 1) follows the token `tree` names as its parent, and row `i` of the result is the
    /// next-token distribution after `tokens[i]`. The context is left as it was; follow with
    /// [`keep_path`](Self::keep_path) to extend it.
    ///
    /// The default scores each root-to-leaf path with [`forward`](Self::forward) and rolls
    /// back, so every model verifies trees; models with a tree attention mask (`Llama`)
    /// score the whole tree in one pass.
    ///
    /// # Errors
    /// As [`forward`](Self::forward); [`Error::InvalidSetting`] when `tree` does not fit `tokens`.
    fn forward_tree(&mut self, tokens: &[u32], tree: &TreeShape) -> Result<Logits> {
        if tree.len() != tokens.len() {
            return Err(Error::setting("tree size", tree.len(), "one entry per token"));
        }
        let (base, vocab) = (TokenModel::context_len(self), TokenModel::vocab_size(self));
        let mut data = vec![0.0; tokens.len() * vocab];
        let mut done = vec![false; tokens.len()];
        for leaf in (0..tokens.len()).rev() {
            if done[leaf] {
                continue;
            }
            let path: Vec<usize> = (0..=leaf).filter(|&j| tree.sees(leaf)[j]).collect();
            let feed: Vec<u32> = path.iter().map(|&j| tokens[j]).collect();
            let rows = self.forward(&feed, feed.len());
            TokenModel::truncate(self, base)?;
            let rows = rows?;
            if rows.rows() != feed.len() || rows.vocab() != vocab {
                return Err(Error::BadModelOutput {
                    model: "target",
                    what: "logits rows",
                    expected: feed.len(),
                    got: rows.rows(),
                });
            }
            // Each node's row comes from the first path that reaches it.
            for (r, &j) in path.iter().enumerate() {
                if !done[j] {
                    data[j * vocab..(j + 1) * vocab].copy_from_slice(rows.row(r));
                    done[j] = true;
                }
            }
        }
        Logits::new(data, vocab)
    }

    /// Extends the context by the tokens of `path` (indices into the `tokens` of the
    /// [`forward_tree`](Self::forward_tree) call just before: 0, then each a child of the one
    /// before). The default feeds them again; tree-capable models keep what they computed.
    ///
    /// # Errors
    /// As [`forward`](Self::forward); [`Error::InvalidSetting`] for an index outside `tokens`.
    fn keep_path(&mut self, tokens: &[u32], path: &[usize]) -> Result<()> {
        let kept: Option<Vec<u32>> = path.iter().map(|&i| tokens.get(i).copied()).collect();
        let kept =
            kept.ok_or_else(|| Error::setting("kept path", format!("{path:?}"), "indices of the tree's tokens"))?;
        self.forward(&kept, 0).map(drop)
    }

    /// Runs `calls[i]` (tokens, rows) on `models[i]` as [`forward`](Self::forward) would and
    /// returns each call's logits: several sequences, each a model instance with its own
    /// context (a `Llama` per sequence over shared weights), scored in one pass where the model
    /// can. The default runs them one by one, so any target serves a batch.
    ///
    /// # Errors
    /// As [`forward`](Self::forward); [`Error::InvalidSetting`] when the numbers of models and
    /// calls differ.
    fn forward_batch(models: &mut [&mut Self], calls: &[(&[u32], usize)]) -> Result<Vec<Logits>>
    where
        Self: Sized,
    {
        if models.len() != calls.len() {
            return Err(Error::setting("batch calls", calls.len(), "one per model"));
        }
        models.iter_mut().zip(calls).map(|(m, &(tokens, rows))| m.forward(tokens, rows)).collect()
    }
}

/// What a drafter proposes as the next token.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Proposal {
    /// A logits row: the decoder applies the sampling settings and samples the draft token.
    Logits(Vec<f32>),
    /// One token with certainty (n-gram lookup and other deterministic drafters).
    Token(u32),
    /// Nothing worth proposing: the block ends early (possibly with no drafted token at all).
    Nothing,
}

/// A model or heuristic that proposes tokens cheaply.
///
/// Every [`TargetModel`] is a `DraftModel` (through its last logits row), so a small model is a
/// drafter as it is; heuristic drafters implement this trait directly.
pub trait DraftModel: TokenModel {
    /// Appends `tokens` (at least one) to the context and proposes the token that follows.
    ///
    /// # Errors
    /// Out-of-vocabulary tokens, backend failures.
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal>;

    /// How many tokens to draft in the chain round about to start, asked once before its
    /// first [`propose`](Self::propose) with the whole context `ctx` (the pending token
    /// included), the decoder's choice `k` (at least 1) and the longest block its policy
    /// allows, `max`. The default drafts `k`. A drafter that can tell its confidence from the
    /// context may draft fewer, or up to `max` where it is sure: [`NGramDraft`](crate::NGramDraft)
    /// drafts long inside a long match. Exactness does not depend on the answer, which is
    /// fixed from the context before the round's random draws.
    fn block_len(&mut self, ctx: &[u32], k: usize, max: usize) -> usize {
        let _ = (ctx, max);
        k
    }

    /// Appends `tokens` (at least one) to the context and proposes a tree of continuations
    /// within `budget` (see [`DraftTree`]), turning logits rows into children with `picker`
    /// (the decoder's sampling settings). Afterwards the context holds at least all but the
    /// last of `tokens`; any more it holds must lie on the tree's first path (the decoder rolls
    /// it back to the accepted part).
    ///
    /// The default drafts a chain of `budget.depth()` tokens with [`propose`](Self::propose);
    /// model drafters expand a real tree ([`expand_tree`]), and
    /// [`NGramDraft`](crate::NGramDraft) merges several matches.
    ///
    /// # Errors
    /// As [`propose`](Self::propose).
    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, picker: &mut ChildPicker) -> Result<DraftTree> {
        let mut tree = DraftTree::new();
        let mut feed = tokens.to_vec();
        while tree.len() < budget.depth().min(budget.nodes()) {
            let parent = tree.len().checked_sub(1);
            let node = match self.propose(&feed)? {
                Proposal::Nothing => break,
                Proposal::Token(t) => tree.push(t, parent)?,
                Proposal::Logits(row) => match picker.pick(&row, 1, tree.len())?.pop() {
                    Some(c) => match c.row {
                        Some(q) => tree.push_sampled(c.token, parent, q)?,
                        None => tree.push(c.token, parent)?,
                    },
                    None => break,
                },
            };
            feed = vec![tree.tokens()[node]];
        }
        Ok(tree)
    }

    /// Feeds `feeds[i]` to `drafts[i]` and returns each one's proposal, as
    /// [`propose`](Self::propose) would: several sequences' drafts (one instance each) in one
    /// call. The default proposes one sequence at a time; every target drafts through its
    /// batched forward pass.
    ///
    /// # Errors
    /// As [`propose`](Self::propose); [`Error::InvalidSetting`] when the numbers of drafts and
    /// feeds differ.
    fn propose_batch(drafts: &mut [&mut Self], feeds: &[&[u32]]) -> Result<Vec<Proposal>>
    where
        Self: Sized,
    {
        if drafts.len() != feeds.len() {
            return Err(Error::setting("batch feeds", feeds.len(), "one per draft"));
        }
        drafts.iter_mut().zip(feeds).map(|(d, feed)| d.propose(feed)).collect()
    }
}

impl<M: TargetModel> DraftModel for M {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        let logits = self.forward(tokens, 1)?;
        if logits.rows() != 1 {
            return Err(Error::BadModelOutput { model: "draft", what: "logits rows", expected: 1, got: logits.rows() });
        }
        Ok(Proposal::Logits(logits.into_last_row()))
    }

    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, picker: &mut ChildPicker) -> Result<DraftTree> {
        expand_tree(self, tokens, budget, picker)
    }

    fn propose_batch(drafts: &mut [&mut Self], feeds: &[&[u32]]) -> Result<Vec<Proposal>> {
        let calls: Vec<(&[u32], usize)> = feeds.iter().map(|&f| (f, 1)).collect();
        let rows = M::forward_batch(drafts, &calls)?;
        rows.into_iter()
            .map(|logits| match logits.rows() {
                1 => Ok(Proposal::Logits(logits.into_last_row())),
                got => Err(Error::BadModelOutput { model: "draft", what: "logits rows", expected: 1, got }),
            })
            .collect()
    }
}

impl<M: TokenModel + ?Sized> TokenModel for &mut M {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn context_len(&self) -> usize {
        (**self).context_len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        (**self).truncate(len)
    }

    fn save_rows(&self, from: usize) -> Option<KvRows> {
        (**self).save_rows(from)
    }

    fn restore_rows(&mut self, tokens: &[u32], rows: &KvRows) -> Result<bool> {
        (**self).restore_rows(tokens, rows)
    }
}

impl<M: TargetModel + ?Sized> TargetModel for &mut M {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        (**self).forward(tokens, rows)
    }

    fn forward_tree(&mut self, tokens: &[u32], tree: &TreeShape) -> Result<Logits> {
        (**self).forward_tree(tokens, tree)
    }

    fn keep_path(&mut self, tokens: &[u32], path: &[usize]) -> Result<()> {
        (**self).keep_path(tokens, path)
    }
}
