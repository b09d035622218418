//! A prefix cache: the models' states for token sequences seen before (prompts and the
//! outputs that followed them), so that a request that resends a conversation prefills only
//! what is new.
//!
//! Keys are token ids at token granularity, held in a radix tree per role (the target's
//! states, the draft's): a node holds a run of tokens and one row of state per token (see
//! [`KvRows`]), its children the runs that continued it. A radix tree rather than fixed
//! blocks because a hit may end at any token (a turn quotes the model's answer to the last
//! token, and a new turn differs from the cached one inside what would be a block), and a
//! shared system prompt is stored once under every conversation that starts with it.
//!
//! A sequence that starts copies the rows of its longest cached prefix into its own models
//! (copy on admit): running sequences never share state with the cache or with each other,
//! so eviction can never take rows a sequence uses, and no sequence reads another's rows.
//! What it finishes with (prompt and output) is inserted when it ends. The cache is bounded
//! in bytes; the least recently used leaves go first.
//!
//! The promise: a generation that starts from a hit emits the same tokens as one that
//! prefilled everything. It holds because the rows restored are the very rows a prefill
//! computes, and the native engine's rows do not depend on how the positions were split
//! into calls (a chunk of the prompt or the whole of it, a batch of one or of eight). The
//! candle engine hands out no rows, so its models never hit.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::Result;
use crate::model::{KvRows, TokenModel};

/// The default budget: 1 GiB holds about 18,000 positions of the Qwen2.5-Coder 1.5B (57 KiB
/// each) with its 0.5B draft (24 KiB each).
pub const DEFAULT_BUDGET: usize = 1 << 30;

/// Bytes counted for a node beside its tokens and rows.
const NODE_OVERHEAD: usize = 96;

/// Which model's states a tree holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Target,
    Draft,
}

/// A prefix cache shared by clones (an `Arc` inside): one for a
/// [`BatchDecoder`](crate::BatchDecoder) and all its sequences, or for several decoders over
/// the same weights. Give it only decoders whose targets share one set of weights and whose
/// drafts share another: the rows of other weights would be restored as they are (rows of
/// another width are refused).
///
/// # Example
/// ```
/// use specdec::prefix::PrefixCache;
/// let cache = PrefixCache::new(256 << 20);
/// assert_eq!(cache.stats().bytes, 0);
/// ```
#[derive(Debug, Clone)]
pub struct PrefixCache {
    inner: Arc<Mutex<Trees>>,
}

/// What the cache holds and has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PrefixStats {
    /// Sequences that looked their prompt up.
    pub lookups: u64,
    /// Lookups that found at least one token of the prompt for the target.
    pub hits: u64,
    /// Prompt tokens whose target state came from the cache.
    pub hit_tokens: u64,
    /// Prompt tokens whose draft state came from the cache.
    pub draft_hit_tokens: u64,
    /// Positions inserted (both roles).
    pub inserted_tokens: u64,
    /// Nodes evicted.
    pub evictions: u64,
    /// Positions evicted (both roles).
    pub evicted_tokens: u64,
    /// Bytes held now.
    pub bytes: usize,
    /// The most bytes it holds.
    pub budget: usize,
}

/// What a sequence's start took from the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hit {
    /// Prompt tokens the target did not have to prefill.
    pub target: usize,
    /// Prompt tokens the draft did not have to prefill.
    pub draft: usize,
}

impl PrefixCache {
    /// An empty cache holding at most `budget` bytes of rows and tokens.
    pub fn new(budget: usize) -> Self {
        let trees =
            Trees { roles: [Tree::default(), Tree::default()], budget, clock: 0, stats: PrefixStats::default() };
        Self { inner: Arc::new(Mutex::new(trees)) }
    }

    /// What it holds and has done.
    pub fn stats(&self) -> PrefixStats {
        let t = self.lock();
        PrefixStats { bytes: t.roles.iter().map(|r| r.bytes).sum(), budget: t.budget, ..t.stats }
    }

    /// Forgets everything (the counters stay).
    pub fn clear(&self) {
        let mut t = self.lock();
        t.roles = [Tree::default(), Tree::default()];
    }

    /// The tokens of the longest cached prefix of `tokens` for the target (at most all of
    /// them); a query that copies no rows and counts as no use.
    pub fn longest_prefix(&self, tokens: &[u32]) -> usize {
        self.lock().roles[0].walk(tokens).1
    }

    /// Restores into `target` and `draft` (both with empty contexts) the longest cached
    /// prefixes of `tokens`, each model its own.
    pub(crate) fn restore<T: TokenModel, D: TokenModel>(
        &self,
        tokens: &[u32],
        target: &mut T,
        draft: &mut D,
    ) -> Result<Hit> {
        let mut t = self.lock();
        t.clock += 1;
        let now = t.clock;
        t.stats.lookups += 1;
        let mut hit = Hit::default();
        for role in [Role::Target, Role::Draft] {
            let (n, rows) = t.roles[role as usize].lookup(tokens, now);
            let restored = match role {
                _ if n == 0 => false,
                Role::Target => target.restore_rows(&tokens[..n], &rows)?,
                Role::Draft => draft.restore_rows(&tokens[..n], &rows)?,
            };
            match role {
                Role::Target if restored => hit.target = n,
                Role::Draft if restored => hit.draft = n,
                _ => {}
            }
        }
        t.stats.hits += u64::from(hit.target > 0);
        t.stats.hit_tokens += hit.target as u64;
        t.stats.draft_hit_tokens += hit.draft as u64;
        Ok(hit)
    }

    /// Inserts the states of the contexts `target` and `draft` hold, whose tokens begin
    /// `tokens`, then evicts down to the budget.
    pub(crate) fn insert<T: TokenModel, D: TokenModel>(&self, tokens: &[u32], target: &T, draft: &D) {
        let mut t = self.lock();
        t.clock += 1;
        let now = t.clock;
        let mut inserted = 0;
        inserted += t.roles[0].insert(tokens, now, |from| target.save_rows(from));
        inserted += t.roles[1].insert(tokens, now, |from| draft.save_rows(from));
        t.stats.inserted_tokens += inserted as u64;
        t.evict();
    }

    /// The lock; a panic while it was held leaves trees that are whole (each change is made
    /// before the counts that follow it), so a poisoned lock is taken as it is.
    fn lock(&self) -> MutexGuard<'_, Trees> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for PrefixCache {
    /// A cache of [`DEFAULT_BUDGET`] bytes.
    fn default() -> Self {
        Self::new(DEFAULT_BUDGET)
    }
}

/// Both roles' trees, the budget, and the clock that orders uses.
#[derive(Debug)]
struct Trees {
    roles: [Tree; 2],
    budget: usize,
    clock: u64,
    stats: PrefixStats,
}

impl Trees {
    /// Evicts least recently used leaves (of either tree) until the bytes fit the budget.
    fn evict(&mut self) {
        while self.roles.iter().map(|r| r.bytes).sum::<usize>() > self.budget {
            let oldest = (0..2).filter_map(|r| self.roles[r].oldest_leaf().map(|(n, used)| (used, r, n))).min();
            let Some((_, r, n)) = oldest else { break };
            let tokens = self.roles[r].remove(n);
            self.stats.evictions += 1;
            self.stats.evicted_tokens += tokens as u64;
        }
    }
}

/// A run of tokens with one row of state each, and the runs that continued it.
#[derive(Debug)]
struct Node {
    tokens: Vec<u32>,
    rows: Vec<f32>,
    children: Vec<usize>,
    parent: usize,
    last_used: u64,
}

impl Node {
    fn bytes(&self) -> usize {
        (self.tokens.len() + self.rows.len()) * 4 + NODE_OVERHEAD
    }
}

/// One role's radix tree: node 0 is the root (no tokens); removed nodes leave `None` slots
/// that new nodes reuse.
#[derive(Debug)]
struct Tree {
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    /// Floats per position (0 until the first insert).
    width: usize,
    bytes: usize,
}

impl Default for Tree {
    fn default() -> Self {
        let root = Node { tokens: Vec::new(), rows: Vec::new(), children: Vec::new(), parent: 0, last_used: 0 };
        Self { nodes: vec![Some(root)], free: Vec::new(), width: 0, bytes: 0 }
    }
}

impl Tree {
    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("a live node")
    }

    /// The child of `at` whose run starts with `token`.
    fn child(&self, at: usize, token: u32) -> Option<usize> {
        self.node(at).children.iter().copied().find(|&c| self.node(c).tokens[0] == token)
    }

    /// Walks `tokens` down from the root: the nodes passed (each with how many of its tokens
    /// matched) and the tokens matched in all.
    fn walk(&self, tokens: &[u32]) -> (Vec<(usize, usize)>, usize) {
        let (mut at, mut done, mut path) = (0, 0, Vec::new());
        while let Some(c) = tokens.get(done).and_then(|&t| self.child(at, t)) {
            let run = &self.node(c).tokens;
            let m = run.iter().zip(&tokens[done..]).take_while(|(a, b)| a == b).count();
            path.push((c, m));
            done += m;
            if m < run.len() {
                break;
            }
            at = c;
        }
        (path, done)
    }

    /// The longest cached prefix of `tokens` and its rows; marks the nodes used at `now`.
    fn lookup(&mut self, tokens: &[u32], now: u64) -> (usize, KvRows) {
        let (path, done) = self.walk(tokens);
        let width = self.width;
        let mut data = Vec::with_capacity(done * width);
        for &(n, m) in &path {
            let node = self.node_mut(n);
            node.last_used = now;
            data.extend_from_slice(&node.rows[..m * width]);
        }
        let rows = KvRows::new(self.width.max(1), data).unwrap_or_default();
        (done, rows)
    }

    /// Inserts what `save` hands out past the cached prefix of `tokens` (rows for positions
    /// `from..`, at most one per token left). Returns the positions inserted.
    fn insert(&mut self, tokens: &[u32], now: u64, save: impl FnOnce(usize) -> Option<KvRows>) -> usize {
        let (path, done) = self.walk(tokens);
        for &(n, _) in &path {
            self.node_mut(n).last_used = now;
        }
        let at = match path.last() {
            Some(&(n, m)) if m < self.node(n).tokens.len() => self.split(n, m),
            Some(&(n, _)) => n,
            None => 0,
        };
        if done == tokens.len() {
            return 0;
        }
        let Some(rows) = save(done) else { return 0 };
        if self.width == 0 {
            self.width = rows.width();
        }
        if rows.width() != self.width || rows.is_empty() {
            return 0;
        }
        let n = rows.len().min(tokens.len() - done);
        let mut data = rows.into_data();
        data.truncate(n * self.width);
        let node = Node {
            tokens: tokens[done..done + n].to_vec(),
            rows: data,
            children: Vec::new(),
            parent: at,
            last_used: now,
        };
        self.bytes += node.bytes();
        let slot = self.add(node);
        self.node_mut(at).children.push(slot);
        n
    }

    /// Splits node `n` after its first `m` tokens (0 < m < its length): `n` keeps the head,
    /// a new child takes the tail and `n`'s children. Returns `n`.
    fn split(&mut self, n: usize, m: usize) -> usize {
        let width = self.width;
        let node = self.node_mut(n);
        let tail = Node {
            tokens: node.tokens.split_off(m),
            rows: node.rows.split_off(m * width),
            children: std::mem::take(&mut node.children),
            parent: n,
            last_used: node.last_used,
        };
        self.bytes += NODE_OVERHEAD;
        let slot = self.add(tail);
        for c in self.node(slot).children.clone() {
            self.node_mut(c).parent = slot;
        }
        self.node_mut(n).children.push(slot);
        n
    }

    /// Puts `node` in a free slot or a new one; returns the slot.
    fn add(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(s) => {
                self.nodes[s] = Some(node);
                s
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// The least recently used leaf (not the root) and when it was used.
    fn oldest_leaf(&self) -> Option<(usize, u64)> {
        let leaves = self.nodes.iter().enumerate().skip(1);
        let leaves = leaves.filter_map(|(i, n)| n.as_ref().filter(|n| n.children.is_empty()).map(|n| (i, n.last_used)));
        leaves.min_by_key(|&(_, used)| used)
    }

    /// Removes leaf `n`; returns its positions.
    fn remove(&mut self, n: usize) -> usize {
        let Some(node) = self.nodes[n].take() else { return 0 };
        self.bytes -= node.bytes();
        self.free.push(n);
        self.node_mut(node.parent).children.retain(|&c| c != n);
        node.tokens.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose state for position `i` is the row `[token_i, i]`: what a restore put
    /// where shows.
    #[derive(Default)]
    struct Echo {
        ctx: Vec<u32>,
        rows: Vec<f32>,
    }

    impl Echo {
        fn fed(tokens: &[u32]) -> Self {
            let rows = tokens.iter().enumerate().flat_map(|(i, &t)| [t as f32, i as f32]).collect();
            Self { ctx: tokens.to_vec(), rows }
        }
    }

    impl TokenModel for Echo {
        fn vocab_size(&self) -> usize {
            100
        }
        fn context_len(&self) -> usize {
            self.ctx.len()
        }
        fn truncate(&mut self, len: usize) -> Result<()> {
            self.ctx.truncate(len);
            self.rows.truncate(2 * len);
            Ok(())
        }
        fn save_rows(&self, from: usize) -> Option<KvRows> {
            (from < self.ctx.len()).then(|| KvRows::new(2, self.rows[2 * from..].to_vec()).expect("rows of 2"))
        }
        fn restore_rows(&mut self, tokens: &[u32], rows: &KvRows) -> Result<bool> {
            assert!(self.ctx.is_empty());
            self.ctx = tokens.to_vec();
            self.rows = rows.as_slice().to_vec();
            Ok(true)
        }
    }

    fn restored(cache: &PrefixCache, tokens: &[u32]) -> (Hit, Echo) {
        let (mut target, mut draft) = (Echo::default(), Echo::default());
        let hit = cache.restore(tokens, &mut target, &mut draft).expect("restores");
        (hit, target)
    }

    #[test]
    fn the_longest_prefix_comes_back_with_its_own_rows() {
        let cache = PrefixCache::new(1 << 20);
        cache.insert(&[1, 2, 3, 4, 5], &Echo::fed(&[1, 2, 3, 4, 5]), &Echo::default());
        cache.insert(&[1, 2, 7, 8], &Echo::fed(&[1, 2, 7, 8]), &Echo::default());
        // Ends inside the first run, after the split.
        let (hit, m) = restored(&cache, &[1, 2, 3, 9]);
        assert_eq!((hit.target, hit.draft), (3, 0));
        assert_eq!(m.rows, Echo::fed(&[1, 2, 3]).rows);
        let (hit, m) = restored(&cache, &[1, 2, 7, 8, 9]);
        assert_eq!(hit.target, 4);
        assert_eq!(m.rows, Echo::fed(&[1, 2, 7, 8]).rows);
        assert_eq!(restored(&cache, &[2, 1]).0.target, 0);
        // Inserting what is there adds nothing.
        let before = cache.stats();
        cache.insert(&[1, 2, 3], &Echo::fed(&[1, 2, 3]), &Echo::default());
        assert_eq!(cache.stats().inserted_tokens, before.inserted_tokens);
        assert_eq!(cache.longest_prefix(&[1, 2, 3, 4, 5, 6]), 5);
    }

    #[test]
    fn a_model_holding_fewer_positions_than_tokens_inserts_what_it_holds() {
        let cache = PrefixCache::new(1 << 20);
        cache.insert(&[1, 2, 3, 4, 5], &Echo::fed(&[1, 2, 3]), &Echo::fed(&[1, 2]));
        let (hit, _) = restored(&cache, &[1, 2, 3, 4, 5]);
        assert_eq!((hit.target, hit.draft), (3, 2));
    }

    #[test]
    fn eviction_keeps_the_most_recent_within_the_budget() {
        let one = |t: u32| (0..50).map(|i| t * 100 + i).collect::<Vec<u32>>();
        // Each run: 50 tokens × (1 + 2 floats) × 4 bytes + overhead.
        let node = 50 * 12 + NODE_OVERHEAD;
        let cache = PrefixCache::new(3 * node);
        for t in 0..3 {
            cache.insert(&one(t), &Echo::fed(&one(t)), &Echo::default());
        }
        // Touch the first: the second is now the oldest.
        assert_eq!(restored(&cache, &one(0)).0.target, 50);
        cache.insert(&one(3), &Echo::fed(&one(3)), &Echo::default());
        let s = cache.stats();
        assert!(s.bytes <= s.budget, "{s:?}");
        assert_eq!((s.evictions, s.evicted_tokens), (1, 50));
        assert_eq!(cache.longest_prefix(&one(1)), 0);
        for t in [0, 2, 3] {
            assert_eq!(cache.longest_prefix(&one(t)), 50, "run {t}");
        }
    }

    #[test]
    fn leaves_go_before_the_prefix_they_share() {
        let cache = PrefixCache::new(1 << 20);
        let system: Vec<u32> = (1..=20).collect();
        for turn in 0..3 {
            let mut tokens = system.clone();
            tokens.extend([50 + turn, 60 + turn]);
            cache.insert(&tokens, &Echo::fed(&tokens), &Echo::default());
        }
        let full = cache.stats().bytes;
        // A budget that holds the shared run and one leaf less than now.
        cache.lock().budget = full - 1;
        cache.insert(&[], &Echo::default(), &Echo::default());
        assert_eq!(cache.stats().evictions, 1);
        assert_eq!(cache.longest_prefix(&system), 20);
    }
}
