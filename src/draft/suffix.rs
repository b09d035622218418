//! Suffix drafting (SuffixDecoding, Oliaro et al. 2024): lookup over the current request and
//! over every earlier request a [`SuffixCache`] holds, so that speculation learns from what it
//! has served (tool-call skeletons, file contents quoted back, repeated plans).
//!
//! Exactness is the kernel's, as for [`NGramDraft`](super::NGramDraft): every proposal is a
//! point mass fixed by the context and the cache before the round's random draws (the cache
//! changes only between generations, with other generations' finished outputs), and the kernel
//! accepts a point mass on `t` with probability `p(t)` and otherwise draws from the residual,
//! which leaves the target's law intact whatever the proposal.

use super::ngram::{distinct_matches, longest_suffix_match, Round, MAX_BLOCK};
use super::suffix_cache::{SuffixCache, ANCHOR};
use crate::error::{Error, Result};
use crate::model::{DraftModel, Proposal, TokenModel};
use crate::stop::check_tokens;
use crate::tree::{ChildPicker, DraftTree, TreeBudget};

/// The longest suffix a lookup compares.
const MAX_MATCH: usize = 32;
/// A match at least this long is taken for a copied span: its block is as long as the match,
/// whatever the controller's k.
const LONG_MATCH: usize = 8;

/// A suffix drafter: for the context's longest suffix (at least 2 tokens, at most 32) that
/// occurred before in this request or in a request the shared cache holds, it proposes what
/// followed (the current request wins a tie), as a point mass; nothing without a match. Its
/// request (prompt and output) goes into the cache when it starts the next one or is dropped.
///
/// # Example
/// ```
/// use specdec::{DraftModel, Proposal, SuffixCache, SuffixDraft};
/// let cache = SuffixCache::new(16, 1000)?;
/// cache.insert(&[1, 2, 3, 4, 5])?; // an earlier request
/// let mut draft = SuffixDraft::new(cache)?;
/// assert_eq!(draft.propose(&[9, 2, 3])?, Proposal::Token(4));
/// # Ok::<(), specdec::Error>(())
/// ```
#[derive(Debug)]
pub struct SuffixDraft {
    cache: SuffixCache,
    vocab: usize,
    /// The shortest match it proposes from.
    min_match: usize,
    ctx: Vec<u32>,
    /// The last planned round (see `block_len`).
    round: Round,
}

/// A match: its length and what followed it.
type Match = (usize, Vec<u32>);

impl SuffixDraft {
    /// A drafter over `cache` (clones of one cache share it).
    ///
    /// # Errors
    /// None today; kept for settings to come.
    pub fn new(cache: SuffixCache) -> Result<Self> {
        let vocab = cache.vocab();
        Ok(Self { cache, vocab, min_match: ANCHOR, ctx: Vec::new(), round: Round::default() })
    }

    /// A drafter with this one's cache and settings and no request yet: another sequence's,
    /// sharing the cache.
    pub fn fork(&self) -> Self {
        Self {
            cache: self.cache.clone(),
            vocab: self.vocab,
            min_match: self.min_match,
            ctx: Vec::new(),
            round: Round::default(),
        }
    }

    /// Proposes only from matches of at least `n` tokens (2 by default; `suffix+model` uses
    /// 4, where shorter matches are too often wrong to stand in for the model).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] unless `2 <= n <= 32`.
    pub fn with_min_match(mut self, n: usize) -> Result<Self> {
        if !(ANCHOR..=MAX_MATCH).contains(&n) {
            return Err(Error::setting("min_match", n, "2 to 32 tokens"));
        }
        self.min_match = n;
        Ok(self)
    }

    /// The shared cache.
    pub fn cache(&self) -> &SuffixCache {
        &self.cache
    }

    /// The best match of `ctx`'s suffix, here or in the cache, with up to `depth` tokens that
    /// followed it.
    fn best(&self, ctx: &[u32], depth: usize) -> Option<Match> {
        let local = longest_suffix_match(ctx, ANCHOR, MAX_MATCH)
            .map(|(end, len)| (len, ctx[end + 1..].iter().take(depth).copied().collect::<Vec<u32>>()));
        let global = self.cache.lookup(ctx, MAX_MATCH, depth, 1).into_iter().next().map(|c| (c.matched, c.tokens));
        let best = match (local, global) {
            (Some(l), Some(g)) if g.0 > l.0 => Some(g),
            (Some(l), _) => Some(l),
            (None, g) => g,
        };
        best.filter(|(len, _)| *len >= self.min_match)
    }

    /// Adds the request so far to the cache and starts empty.
    fn retire(&mut self) {
        if !self.ctx.is_empty() {
            // The tokens were checked on the way in.
            let _ = self.cache.insert(&self.ctx);
            self.ctx.clear();
        }
    }
}

impl Drop for SuffixDraft {
    fn drop(&mut self) {
        self.retire();
    }
}

impl TokenModel for SuffixDraft {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn context_len(&self) -> usize {
        self.ctx.len()
    }

    /// Rolls back; back to nothing, it first adds the request to the cache (a new one starts).
    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.ctx.len() {
            return Err(Error::BadTruncate { len: self.ctx.len(), to: len });
        }
        if len == 0 {
            self.retire();
        }
        self.ctx.truncate(len);
        Ok(())
    }
}

impl DraftModel for SuffixDraft {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        check_tokens(tokens, self.vocab)?;
        self.ctx.extend_from_slice(tokens);
        let found = self.best(&self.ctx, 1).and_then(|(_, next)| next.first().copied());
        if let Some(t) = found {
            self.round.propose(self.ctx.len(), t);
        }
        Ok(found.map_or(Proposal::Nothing, Proposal::Token))
    }

    /// As long as the match the context ends in where it is long (8 tokens or more: a copied
    /// span), the controller's `k` where it is shorter (none: 0, a plain step), and twice the
    /// last block after a round that accepted all of it; up to `max` and 16.
    fn block_len(&mut self, ctx: &[u32], k: usize, max: usize) -> usize {
        let all_accepted = self.round.restart(ctx);
        let len = self.best(ctx, 1).map_or(0, |(len, _)| len);
        let n = match (len, all_accepted) {
            (0, _) => 0,
            (_, last) if last > 0 => len.max(2 * last),
            (len, _) if len >= LONG_MATCH => len,
            (len, _) => k.min(len),
        };
        n.min(MAX_BLOCK).min(max)
    }

    /// Continuations followed by different tokens, from the cache (by match length, then how
    /// often they occurred) and from this request, merged where they share a prefix, within
    /// `budget`.
    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, _: &mut ChildPicker) -> Result<DraftTree> {
        self.propose(tokens)?;
        let mut branches: Vec<Match> = self
            .cache
            .lookup(&self.ctx, MAX_MATCH, budget.depth(), budget.width())
            .into_iter()
            .map(|c| (c.matched, c.tokens))
            .collect();
        for end in distinct_matches(&self.ctx, ANCHOR, MAX_MATCH, budget.width()) {
            let len = (0..MAX_MATCH.min(end + 1))
                .take_while(|&j| self.ctx[end - j] == self.ctx[self.ctx.len() - 1 - j])
                .count();
            branches.push((len, self.ctx[end + 1..].iter().take(budget.depth()).copied().collect()));
        }
        branches.sort_by_key(|(len, _)| std::cmp::Reverse(*len));
        let mut tree = DraftTree::new();
        let mut firsts = Vec::new();
        for (_, branch) in branches {
            let Some(&first) = branch.first() else { continue };
            if firsts.len() >= budget.width() && !firsts.contains(&first) {
                continue;
            }
            firsts.push(first);
            let mut parent = None;
            for &token in &branch {
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

    #[test]
    fn the_longer_match_wins_and_this_request_wins_ties() -> Result<()> {
        let cache = SuffixCache::new(32, 100)?;
        cache.insert(&[1, 2, 3, 4, 20])?;
        let mut d = SuffixDraft::new(cache.clone())?;
        // Locally "3 4" is followed by 9 (a 2-token match); the cache has "2 3 4" then 20.
        assert_eq!(d.propose(&[3, 4, 9, 2, 3, 4])?, Proposal::Token(20));
        let mut d = SuffixDraft::new(cache)?;
        assert_eq!(d.propose(&[2, 3, 4, 9, 2, 3, 4])?, Proposal::Token(9));
        Ok(())
    }

    #[test]
    fn a_request_joins_the_cache_when_the_next_starts_or_the_drafter_is_dropped() -> Result<()> {
        let cache = SuffixCache::new(32, 100)?;
        let mut d = SuffixDraft::new(cache.clone())?;
        d.propose(&[5, 6, 7, 8])?;
        d.truncate(3)?;
        assert_eq!(cache.requests(), 0);
        d.truncate(0)?;
        assert_eq!((cache.requests(), cache.tokens()), (1, 3));
        d.propose(&[10, 11, 12])?;
        drop(d);
        assert_eq!((cache.requests(), cache.tokens()), (2, 6));
        assert_eq!(SuffixDraft::new(cache)?.propose(&[1, 10, 11])?, Proposal::Token(12));
        Ok(())
    }

    #[test]
    fn trees_hold_the_cache_and_the_request_continuations() -> Result<()> {
        let cache = SuffixCache::new(32, 100)?;
        cache.insert(&[1, 2, 3, 4, 5])?;
        cache.insert(&[1, 2, 3, 6, 7])?;
        let mut d = SuffixDraft::new(cache)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let sampling = crate::SamplingConfig::greedy();
        let mut picker = ChildPicker::new(&sampling, &mut rng);
        let tree = d.propose_tree(&[2, 3, 8, 9, 2, 3], "3x2x8".parse::<TreeBudget>()?, &mut picker)?;
        let mut firsts: Vec<u32> =
            (0..tree.len()).filter(|&i| tree.parents()[i].is_none()).map(|i| tree.tokens()[i]).collect();
        firsts.sort_unstable();
        assert_eq!(firsts, vec![4, 6, 8]);
        Ok(())
    }

    use rand::SeedableRng;
}
