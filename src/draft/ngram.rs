//! Prompt lookup: propose the token that followed the most recent earlier occurrence of the
//! context's longest matching suffix (Saxena 2023, "prompt lookup decoding"; the n-gram drafter
//! of vLLM and transformers). No model, no weights: it pays off wherever the output repeats the
//! prompt or itself (code edits, summaries quoting the source, retrieval answers).

use crate::error::{Error, Result};
use crate::model::{DraftModel, Proposal, TokenModel};
use crate::stop::check_tokens;
use crate::tree::{ChildPicker, DraftTree, TreeBudget};

/// An n-gram drafter: for n from `max_n` down to `min_n`, it looks for the most recent earlier
/// occurrence of the context's last n tokens and proposes the token that followed it, as a
/// [`Proposal::Token`] (a point mass, which the kernel verifies exactly); with no match it
/// proposes [`Proposal::Nothing`] and the round ends its block early.
///
/// Within a block the decoder feeds each drafted token back, so successive proposals follow
/// the matched continuation.
///
/// # Example
/// ```
/// use specdec::{DraftModel, NGramDraft, Proposal};
/// let mut draft = NGramDraft::new(16)?;
/// // "3 4 5" occurred before, followed by 6.
/// assert_eq!(draft.propose(&[1, 3, 4, 5, 6, 9, 4, 5])?, Proposal::Token(6));
/// # Ok::<(), specdec::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct NGramDraft {
    vocab: usize,
    min_n: usize,
    max_n: usize,
    ctx: Vec<u32>,
    /// The round [`DraftModel::block_len`] planned last.
    round: Round,
}

/// Where a round's first drafted token lands in the context, and the tokens proposed from
/// there on: what a lookup drafter needs to tell whether its last block was all accepted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Round {
    at: usize,
    proposed: Vec<u32>,
}

impl Round {
    /// Notes a proposal made after `ctx_len` tokens, if it continues the round's block.
    pub fn propose(&mut self, ctx_len: usize, token: u32) {
        if ctx_len == self.at + self.proposed.len() {
            self.proposed.push(token);
        }
    }

    /// Starts the next round at the end of `ctx`; returns how long the last block was when
    /// `ctx` accepted all of it, else 0.
    pub fn restart(&mut self, ctx: &[u32]) -> usize {
        let accepted = ctx.get(self.at..).is_some_and(|s| s.starts_with(&self.proposed));
        let all = if accepted { self.proposed.len() } else { 0 };
        self.at = ctx.len();
        self.proposed.clear();
        all
    }
}

/// The longest block [`NGramDraft`] plans: a copied span rarely runs on longer without an
/// edit, and a longer verification costs more than it would win.
pub(crate) const MAX_BLOCK: usize = 16;

impl NGramDraft {
    /// A drafter over `vocab` tokens matching suffixes of 16 down to 1 tokens.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `vocab` is 0.
    pub fn new(vocab: usize) -> Result<Self> {
        Self::with_range(vocab, 1, MAX_BLOCK)
    }

    /// A drafter matching suffixes of `max_n` down to `min_n` tokens. A larger `min_n` proposes
    /// less often but more reliably.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `vocab` is 0 or unless `1 <= min_n <= max_n`.
    pub fn with_range(vocab: usize, min_n: usize, max_n: usize) -> Result<Self> {
        if vocab == 0 {
            return Err(Error::setting("vocab", vocab, "at least 1 token"));
        }
        if min_n == 0 {
            return Err(Error::setting("min_n", min_n, "at least 1"));
        }
        if max_n < min_n {
            return Err(Error::setting("max_n", max_n, "at least min_n"));
        }
        Ok(Self { vocab, min_n, max_n, ctx: Vec::new(), round: Round::default() })
    }

    /// A drafter with this one's settings and no context: another sequence's.
    pub fn fork(&self) -> Self {
        Self { vocab: self.vocab, min_n: self.min_n, max_n: self.max_n, ctx: Vec::new(), round: Round::default() }
    }

    /// The tokens the drafter holds.
    pub fn context(&self) -> &[u32] {
        &self.ctx
    }

    /// The token that followed the most recent earlier occurrence of the longest suffix of the
    /// context of at least `min_n` and at most `max_n` tokens, if there is one.
    pub fn lookup(&self) -> Option<u32> {
        longest_suffix_match(&self.ctx, self.min_n, self.max_n).map(|(end, _)| self.ctx[end + 1])
    }
}

/// The end index `i < ctx.len() - 1` of the occurrence of the longest suffix of `ctx` (of
/// `min_n..=max_n` tokens) that ends latest, scanning once from the back.
///
/// One pass replaces the loop over n: the match length at `i` is at least n exactly when the
/// n-token suffix occurs ending at `i`, so the longest length wins and, among equals, the first
/// found (the most recent). Most positions fail on their first token, so the scan costs about
/// one comparison per context token (a few microseconds for thousands of tokens).
pub(crate) fn longest_suffix_match(ctx: &[u32], min_n: usize, max_n: usize) -> Option<(usize, usize)> {
    let (&last, head) = ctx.split_last()?;
    let mut best: Option<(usize, usize)> = None;
    for i in (0..head.len()).rev().filter(|&i| head[i] == last) {
        let len = match_len(ctx, i, max_n);
        if best.is_none_or(|(_, l)| len > l) {
            best = Some((i, len));
            if len == max_n {
                break;
            }
        }
    }
    best.filter(|&(_, len)| len >= min_n)
}

/// How many tokens (at most `max_n`) ending at `ctx[i]` equal the suffix of `ctx`, comparing
/// backwards from `ctx[i]` (the suffix itself ends at `ctx.len() - 1`).
fn match_len(ctx: &[u32], i: usize, max_n: usize) -> usize {
    (0..max_n.min(i + 1)).take_while(|&j| ctx[i - j] == ctx[ctx.len() - 1 - j]).count()
}

/// The ends of up to `n` earlier occurrences of a suffix of `ctx` (of `min_n..=max_n` tokens)
/// that are followed by different tokens: longest match first, the most recent among equals.
pub(crate) fn distinct_matches(ctx: &[u32], min_n: usize, max_n: usize, n: usize) -> Vec<usize> {
    let Some(head) = ctx.len().checked_sub(1) else { return Vec::new() };
    let mut found: Vec<(usize, usize)> =
        (0..head).rev().map(|i| (i, match_len(ctx, i, max_n))).filter(|&(_, len)| len >= min_n).collect();
    found.sort_by_key(|&(_, len)| std::cmp::Reverse(len));
    let mut ends: Vec<usize> = Vec::new();
    for (i, _) in found {
        if ends.len() < n && ends.iter().all(|&e| ctx[e + 1] != ctx[i + 1]) {
            ends.push(i);
        }
    }
    ends
}

impl TokenModel for NGramDraft {
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

impl DraftModel for NGramDraft {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        check_tokens(tokens, self.vocab)?;
        self.ctx.extend_from_slice(tokens);
        let found = self.lookup();
        if let Some(t) = found {
            self.round.propose(self.ctx.len(), t);
        }
        Ok(found.map_or(Proposal::Nothing, Proposal::Token))
    }

    /// As long as the match the context ends in (none: 0, a plain step), and twice the last
    /// round's block after a round whose drafts were all accepted (a copy that runs on), up
    /// to `max` and 16 tokens whatever `k`: lookup is often wrong just after an edit, where
    /// the match is short, and almost never inside a long copied span, which the controller's
    /// one acceptance rate cannot tell apart.
    fn block_len(&mut self, ctx: &[u32], _k: usize, max: usize) -> usize {
        let all_accepted = self.round.restart(ctx);
        let len = longest_suffix_match(ctx, self.min_n, self.max_n).map_or(0, |(_, len)| len);
        let n = match (len, all_accepted) {
            (0, _) => 0,
            (_, 0) => len,
            (_, last) => len.max(2 * last),
        };
        n.min(MAX_BLOCK).min(max)
    }

    /// Up to `budget.width()` matches followed by different tokens (longest first), each
    /// continued by the `budget.depth()` tokens that followed it, merged into a tree where they
    /// share a prefix, cut at `budget.nodes()` nodes. The context ends holding `tokens`.
    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, _: &mut ChildPicker) -> Result<DraftTree> {
        self.propose(tokens)?;
        let mut tree = DraftTree::new();
        for end in distinct_matches(&self.ctx, self.min_n, self.max_n, budget.width()) {
            let mut parent = None;
            for &token in self.ctx[end + 1..].iter().take(budget.depth()) {
                if tree.len() >= budget.nodes() && !tree.has_child(parent, token) {
                    break;
                }
                parent = Some(tree.push(token, parent)?);
            }
        }
        Ok(tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(draft: &mut NGramDraft, tokens: &[u32]) -> Proposal {
        draft.propose(tokens).unwrap_or_else(|e| panic!("propose failed: {e}"))
    }

    /// The plain definition: for n from max_n down, the most recent earlier occurrence.
    fn reference(ctx: &[u32], min_n: usize, max_n: usize) -> Option<u32> {
        (min_n..=max_n.min(ctx.len().saturating_sub(1))).rev().find_map(|n| {
            let suffix = &ctx[ctx.len() - n..];
            (0..ctx.len() - n).rev().find(|&s| &ctx[s..s + n] == suffix).map(|s| ctx[s + n])
        })
    }

    #[test]
    fn trees_hold_one_branch_per_distinct_continuation() -> Result<()> {
        let mut d = NGramDraft::new(10)?;
        let (sampling, mut rng) =
            (crate::SamplingConfig::greedy(), <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0));
        let picker = &mut ChildPicker::new(&sampling, &mut rng);
        // "5" is followed by 6 7 and, more recently, by 8 9; "4 5" only by 6 7.
        let tree = d.propose_tree(&[4, 5, 6, 7, 1, 5, 8, 9, 2, 4, 5], "3x2x8".parse::<TreeBudget>()?, picker)?;
        assert_eq!(tree.tokens(), &[6, 7, 8, 9]);
        assert_eq!(tree.parents(), &[None, Some(0), None, Some(2)]);
        assert_eq!(d.context().len(), 11);
        // The node budget cuts the second branch.
        d.truncate(0)?;
        let small = d.propose_tree(&[4, 5, 6, 7, 1, 5, 8, 9, 2, 4, 5], "3x2x3".parse::<TreeBudget>()?, picker)?;
        assert_eq!(small.tokens(), &[6, 7, 8]);
        Ok(())
    }

    #[test]
    fn blocks_follow_the_match_and_double_while_all_are_accepted() -> Result<()> {
        let mut d = NGramDraft::new(20)?;
        // No earlier occurrence of the last token: a plain step.
        assert_eq!(d.block_len(&[1, 2, 3], 4, 8), 0);
        // "1 2 3" recurs: a block of 3 whatever the controller's k, within max.
        let mut ctx = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 9, 1, 2, 3];
        assert_eq!(d.block_len(&ctx, 1, 8), 3);
        for t in [4, 5, 6] {
            let fed = d.context_len();
            assert_eq!(propose(&mut d, &ctx[fed..]), Proposal::Token(t));
            ctx.push(t);
        }
        // The second draft rejected, 9 in its place: the 1-token match "9" alone decides.
        let mut rejected = d.clone();
        rejected.truncate(20)?;
        assert_eq!(rejected.block_len(&[&ctx[..20], &[9]].concat(), 1, 8), 1);
        // All three accepted, and a bonus token off the copy (a 1-token match): twice the block.
        ctx.push(9);
        assert_eq!(d.clone().block_len(&ctx, 1, 4), 4, "max bounds the block");
        assert_eq!(d.block_len(&ctx, 1, 8), 6);
        // Nothing proposed since: the match decides again.
        assert_eq!(d.block_len(&ctx, 1, 8), 1);
        assert_eq!(d.block_len(&[7; 40], 1, 64), MAX_BLOCK);
        Ok(())
    }

    #[test]
    fn longest_match_wins_over_a_more_recent_shorter_one() {
        let mut d = NGramDraft::new(10).unwrap();
        // "1 2 3" is followed by 4 early on; "3" alone is followed by 9 more recently.
        assert_eq!(propose(&mut d, &[1, 2, 3, 4, 3, 9, 1, 2, 3]), Proposal::Token(4));
    }

    #[test]
    fn most_recent_occurrence_wins_among_equals() {
        let mut d = NGramDraft::new(10).unwrap();
        assert_eq!(propose(&mut d, &[5, 6, 1, 5, 6, 2, 5, 6]), Proposal::Token(2));
    }

    #[test]
    fn no_match_is_nothing_and_min_n_is_respected() {
        let mut d = NGramDraft::new(10).unwrap();
        assert_eq!(propose(&mut d, &[1, 2, 3]), Proposal::Nothing);
        assert_eq!(propose(&mut d, &[]), Proposal::Nothing);
        let mut strict = NGramDraft::with_range(10, 2, 3).unwrap();
        // Only the single token 3 recurs: too short for min_n = 2.
        assert_eq!(propose(&mut strict, &[3, 7, 1, 3]), Proposal::Nothing);
        assert_eq!(propose(&mut strict, &[7]), Proposal::Token(1));
    }

    #[test]
    fn drafted_tokens_continue_the_match() {
        let mut d = NGramDraft::new(10).unwrap();
        assert_eq!(propose(&mut d, &[1, 2, 3, 4, 5, 0, 1, 2]), Proposal::Token(3));
        assert_eq!(propose(&mut d, &[3]), Proposal::Token(4));
        assert_eq!(propose(&mut d, &[4]), Proposal::Token(5));
    }

    #[test]
    fn truncate_rolls_back() {
        let mut d = NGramDraft::new(10).unwrap();
        propose(&mut d, &[1, 2, 1, 3]);
        d.truncate(3).unwrap();
        assert_eq!(d.context(), &[1, 2, 1]);
        assert_eq!(d.lookup(), Some(2));
        assert!(matches!(d.truncate(4), Err(Error::BadTruncate { len: 3, to: 4 })));
        d.truncate(0).unwrap();
        assert_eq!(d.context_len(), 0);
        assert_eq!(d.lookup(), None);
    }

    #[test]
    fn bad_settings_and_tokens_are_errors() {
        assert!(NGramDraft::new(0).is_err());
        assert!(NGramDraft::with_range(8, 0, 2).is_err());
        assert!(NGramDraft::with_range(8, 3, 2).is_err());
        let mut d = NGramDraft::new(8).unwrap();
        assert!(matches!(d.propose(&[1, 8]), Err(Error::TokenOutOfRange { token: 8, vocab: 8 })));
        assert_eq!(d.context_len(), 0, "a rejected feed leaves the context alone");
    }

    #[test]
    fn one_pass_scan_agrees_with_the_definition() {
        // A small alphabet makes long, overlapping and self-overlapping matches common.
        let mut state = 12345u64;
        for len in 1..300 {
            let ctx: Vec<u32> = (0..len % 60)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 33) % 3) as u32
                })
                .collect();
            for (min_n, max_n) in [(1, 4), (2, 3), (1, 1), (3, 6)] {
                let d = NGramDraft { vocab: 3, min_n, max_n, ctx: ctx.clone(), round: Round::default() };
                assert_eq!(d.lookup(), reference(&ctx, min_n, max_n), "ctx {ctx:?}, n {min_n}..={max_n}");
            }
        }
    }
}
