//! Trees of drafted tokens: the shape a drafter fills ([`TreeBudget`]), what it returns
//! ([`DraftTree`]), and the EAGLE-2 style expansion any model drafter uses
//! ([`expand_tree`]), with children picked by the decoder's sampling settings ([`ChildPicker`]).
//!
//! A node is a deterministic proposal (a point mass) or a draw from a draft row kept with it.
//! Which deterministic tokens a drafter puts in a tree may depend on anything but the target,
//! and a sampled node must be a fresh draw from its row; the kernel's tree rule then emits
//! exactly the target's distribution (see [`verify_tree`](crate::kernel::verify_tree)).

use rand::rngs::StdRng;

use crate::error::{Error, Result};
use crate::model::{Logits, TargetModel};
use crate::models::TreeShape;
use crate::sampling::{sample, SamplingConfig};

/// How large a tree a drafter may propose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeBudget {
    /// Children per expanded node.
    pub width: usize,
    /// The deepest level (1: children of the root only).
    pub depth: usize,
    /// The most nodes in all (the root not counted).
    pub nodes: usize,
    /// Nodes expanded per depth. 1: the first child of each level is expanded, the others stay
    /// leaves, so a model drafts the tree with one one-token call per level, as it drafts a
    /// chain; more: the best `expand` nodes by cumulative draft probability, scored together
    /// in one tree call per level (EAGLE-2), which costs more draft time.
    pub expand: usize,
}

impl TreeBudget {
    /// A budget of `nodes` nodes, `width` children per expanded node, `depth` levels, `expand`
    /// nodes expanded per level.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when any is 0 or `nodes` exceeds [`TreeBudget::MAX_NODES`].
    pub fn new(width: usize, depth: usize, nodes: usize, expand: usize) -> Result<Self> {
        let sizes = [("tree width", width), ("tree depth", depth), ("tree nodes", nodes), ("tree expand", expand)];
        for (name, value) in sizes {
            if value == 0 {
                return Err(Error::setting(name, value, "at least 1"));
            }
        }
        if nodes > Self::MAX_NODES {
            return Err(Error::setting("tree nodes", nodes, "at most TreeBudget::MAX_NODES (64)"));
        }
        Ok(Self { width, depth, nodes, expand })
    }

    /// The most nodes a tree may have.
    pub const MAX_NODES: usize = 64;
}

impl Default for TreeBudget {
    /// 2 children per node, 6 levels, 12 nodes, the first child of each level expanded: a
    /// chain of 6 with one alternative beside each token, drafted at a chain's cost.
    fn default() -> Self {
        Self { width: 2, depth: 6, nodes: 12, expand: 1 }
    }
}

impl std::fmt::Display for TreeBudget {
    /// `WxDxN` when `expand` is 1, else `WxDxNxE`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.width, self.depth, self.nodes)?;
        if self.expand > 1 {
            write!(f, "x{}", self.expand)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for TreeBudget {
    type Err = Error;

    /// `WxDxN` (width, depth, nodes; expand 1) or `WxDxNxE`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::setting("tree", s, "WxDxN or WxDxNxE (width, depth, nodes, expanded per level)");
        let parts: Vec<usize> = s.split('x').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_>>()?;
        match parts[..] {
            [w, d, n] => Self::new(w, d, n, 1),
            [w, d, n, e] => Self::new(w, d, n, e),
            _ => Err(bad()),
        }
    }
}

/// Drafted tokens in a tree: `tokens[i]` follows `parents[i]` (an earlier node) or, for
/// `None`, the context. Parents come before their children, and siblings are tried in node
/// order. A node is either a deterministic proposal (a point mass: top-k, n-gram) or a draw
/// from a draft probability row kept with it (see [`verify_tree`](crate::kernel::verify_tree)
/// for why both are exact).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DraftTree {
    tokens: Vec<u32>,
    parents: Vec<Option<usize>>,
    /// The row each sampled node was drawn from; `None` for a point mass.
    rows: Vec<Option<Vec<f32>>>,
}

impl DraftTree {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a deterministic `token` under `parent` and returns its index; an existing
    /// deterministic child with that token is returned instead of a duplicate.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `parent` is not an existing node.
    pub fn push(&mut self, token: u32, parent: Option<usize>) -> Result<usize> {
        self.check_parent(parent)?;
        let same =
            (0..self.len()).find(|&i| self.parents[i] == parent && self.tokens[i] == token && self.rows[i].is_none());
        if let Some(i) = same {
            return Ok(i);
        }
        Ok(self.add(token, parent, None))
    }

    /// Adds `token`, drawn from the probability row `row`, under `parent` (never merged: each
    /// draw is tried on its own) and returns its index.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `parent` is not an existing node.
    pub fn push_sampled(&mut self, token: u32, parent: Option<usize>, row: Vec<f32>) -> Result<usize> {
        self.check_parent(parent)?;
        Ok(self.add(token, parent, Some(row)))
    }

    fn check_parent(&self, parent: Option<usize>) -> Result<()> {
        match parent {
            Some(p) if p >= self.len() => Err(Error::setting("tree node parent", p, "an existing node")),
            _ => Ok(()),
        }
    }

    fn add(&mut self, token: u32, parent: Option<usize>, row: Option<Vec<f32>>) -> usize {
        self.tokens.push(token);
        self.parents.push(parent);
        self.rows.push(row);
        self.len() - 1
    }

    /// True when `parent` (`None`: the root) has a deterministic child `token`.
    pub fn has_child(&self, parent: Option<usize>, token: u32) -> bool {
        (0..self.len()).any(|i| self.parents[i] == parent && self.tokens[i] == token && self.rows[i].is_none())
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when the tree has no node.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The drafted tokens, in node order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Each node's parent.
    pub fn parents(&self) -> &[Option<usize>] {
        &self.parents
    }

    /// The row node `i` was drawn from, or `None` for a deterministic node.
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        self.rows[i].as_deref()
    }

    /// The path of first children from the root.
    pub fn first_path(&self) -> Vec<usize> {
        let mut path: Vec<usize> = Vec::new();
        while let Some(next) = (0..self.len()).find(|&i| self.parents[i] == path.last().copied()) {
            path.push(next);
        }
        path
    }

    /// The shape of a tree call scoring a root and then these nodes: node `i` is call token
    /// `i + 1`.
    ///
    /// # Errors
    /// Never for a tree built with `push` (parents come first).
    pub fn shape(&self) -> Result<TreeShape> {
        let parents: Vec<usize> = self.parents.iter().map(|p| p.map_or(0, |p| p + 1)).collect();
        TreeShape::new(&parents)
    }
}

/// A proposed child: its token, its draft log-probability, and the row it was drawn from
/// (`None` for a deterministic pick).
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    /// The token.
    pub token: u32,
    /// Its log-probability under the draft (after the sampling settings, when sampling).
    pub logp: f32,
    /// The probability row it was drawn from, for a sampled child.
    pub row: Option<Vec<f32>>,
}

/// Turns a drafter's logits row into children, with the decoder's sampling settings and
/// random number generator, so that drafts are processed exactly as the target's rows are.
pub struct ChildPicker<'a> {
    sampling: &'a SamplingConfig,
    rng: &'a mut StdRng,
}

impl<'a> ChildPicker<'a> {
    /// A picker sampling with `sampling` from `rng`.
    pub fn new(sampling: &'a SamplingConfig, rng: &'a mut StdRng) -> Self {
        Self { sampling, rng }
    }

    /// Up to `width` children of a node whose draft logits are `logits`, the first to be tried
    /// first. Greedy: the `width` most likely tokens. Sampling: one token drawn from the
    /// processed row (a sampled child, accepted as often as a chain's draft token), then the
    /// most likely others (deterministic). Tokens the settings rule out are never proposed.
    ///
    /// # Errors
    /// Rows the sampling settings reject (NaN, all masked).
    pub fn pick(&mut self, logits: &[f32], width: usize) -> Result<Vec<Child>> {
        if self.sampling.is_greedy() {
            return self.pick_top(logits, width);
        }
        let mut q = Vec::new();
        self.sampling.probs(logits, &mut q)?;
        let drawn = sample(&q, self.rng)?;
        let logq: Vec<f32> = q.iter().map(|&x| x.ln()).collect();
        let first = Child { token: drawn, logp: logq[drawn as usize], row: Some(q) };
        let others = top_tokens(&logq, width.saturating_sub(1), Some(drawn));
        Ok(std::iter::once(first)
            .chain(others.into_iter().map(|(token, logp)| Child { token, logp, row: None }))
            .collect())
    }

    /// The `width` most likely tokens of the processed row, all deterministic (no draw).
    ///
    /// # Errors
    /// Rows the sampling settings reject (NaN, all masked).
    pub fn pick_top(&mut self, logits: &[f32], width: usize) -> Result<Vec<Child>> {
        let top = if self.sampling.is_greedy() {
            crate::sampling::argmax(logits)?; // the same row checks as sampling
            top_tokens(logits, width, None)
        } else {
            let mut q = Vec::new();
            self.sampling.probs(logits, &mut q)?;
            top_tokens(&q.iter().map(|&x| x.ln()).collect::<Vec<_>>(), width, None)
        };
        Ok(top.into_iter().map(|(token, logp)| Child { token, logp, row: None }).collect())
    }
}

/// A node found while expanding: its index, its cumulative draft log-probability, and the
/// score it is kept by. A sampled node is kept by its parent's score: whether a draw stays in
/// the tree must not depend on what was drawn, or the kept draws would no longer follow their
/// row and the kernel's rule would be biased (the decoder's chi-square tests catch exactly
/// that). Its descendants score no higher, so it still ranks above them.
#[derive(Debug, Clone, Copy)]
struct Scored {
    node: usize,
    logp: f32,
    rank: f32,
}

/// Adds `kids` under `parent` (of cumulative log-probability `base`); returns them scored.
fn add_children(tree: &mut DraftTree, kids: Vec<Child>, parent: Option<usize>, base: f32) -> Result<Vec<Scored>> {
    kids.into_iter()
        .map(|c| {
            let (node, rank) = match c.row {
                Some(row) => (tree.push_sampled(c.token, parent, row)?, base),
                None => (tree.push(c.token, parent)?, base + c.logp),
            };
            Ok(Scored { node, logp: base + c.logp, rank })
        })
        .collect()
}

/// Drafts a tree with a model within `budget`, children picked by `picker`; in the end the
/// `budget.nodes` nodes with the highest cumulative draft log-probability are kept (the EAGLE-2
/// rerank; a node never ranks above its parent, so the kept set is a tree).
///
/// With `budget.expand` = 1 each level's first child ([`ChildPicker::pick`]: a draw when
/// sampling) is fed to the model like a chain's draft token (one one-token call per level),
/// and the model ends holding the context through `tokens` plus the kept part of that path
/// but its last node. With more, the `expand` best nodes of each level are scored together in
/// one [`TargetModel::forward_tree`] call (Li et al. 2024, EAGLE-2); their children are the
/// most likely tokens ([`ChildPicker::pick_top`]), and the model ends holding all of `tokens`
/// but the last.
///
/// # Errors
/// Model failures; [`Error::BadModelOutput`] for rows of the wrong size; [`Error::EmptyPrompt`]
/// for no tokens.
pub fn expand_tree<M: TargetModel + ?Sized>(
    model: &mut M,
    tokens: &[u32],
    budget: TreeBudget,
    picker: &mut ChildPicker,
) -> Result<DraftTree> {
    if tokens.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if budget.expand == 1 {
        expand_first_children(model, tokens, budget, picker)
    } else {
        expand_best(model, tokens, budget, picker)
    }
}

fn expand_first_children<M: TargetModel + ?Sized>(
    model: &mut M,
    tokens: &[u32],
    budget: TreeBudget,
    picker: &mut ChildPicker,
) -> Result<DraftTree> {
    let held = model.context_len() + tokens.len();
    let (mut all, mut candidates) = (DraftTree::new(), Vec::new());
    let mut row = last_row(model.forward(tokens, 1)?, model.vocab_size())?;
    let (mut parent, mut base) = (None, 0.0);
    for depth in 0..budget.depth {
        let scored = add_children(&mut all, picker.pick(&row, budget.width)?, parent, base)?;
        let Some(&first) = scored.first() else { break };
        candidates.extend(scored);
        if depth + 1 < budget.depth {
            row = last_row(model.forward(&all.tokens[first.node..=first.node], 1)?, model.vocab_size())?;
            (parent, base) = (Some(first.node), first.logp);
        }
    }
    let tree = keep_best(&all, candidates, budget.nodes)?;
    // The model holds the first children it was fed; keep those that survived the rerank.
    let kept =
        tree.first_path().iter().zip(all.first_path()).take_while(|(a, b)| tree.tokens[**a] == all.tokens[*b]).count();
    if model.context_len() > held + kept {
        model.truncate(held + kept)?;
    }
    Ok(tree)
}

fn expand_best<M: TargetModel + ?Sized>(
    model: &mut M,
    tokens: &[u32],
    budget: TreeBudget,
    picker: &mut ChildPicker,
) -> Result<DraftTree> {
    let (&root, head) = tokens.split_last().ok_or(Error::EmptyPrompt)?;
    if !head.is_empty() {
        model.forward(head, 0)?;
    }
    let (mut all, mut candidates) = (DraftTree::new(), Vec::<Scored>::new());
    let mut frontier = vec![Scored { node: usize::MAX, logp: 0.0, rank: 0.0 }];
    for depth in 0..budget.depth {
        // The call scores the root and the nodes the frontier descends from.
        let (call, index) = ancestors_of(&all, &frontier);
        let mut call_tokens = vec![root];
        call_tokens.extend(call.tokens());
        let rows = model.forward_tree(&call_tokens, &call.shape()?)?;
        check_rows(&rows, call_tokens.len(), model.vocab_size())?;
        let mut next = Vec::new();
        for f in &frontier {
            let (parent, row) = match f.node {
                usize::MAX => (None, rows.row(0)),
                n => (Some(n), rows.row(index[n] + 1)),
            };
            // Deterministic children only: which nodes are expanded depends on their scores,
            // and a draw's presence must not depend on what was drawn.
            next.extend(add_children(&mut all, picker.pick_top(row, budget.width)?, parent, f.logp)?);
        }
        candidates.extend(&next);
        if depth + 1 < budget.depth {
            next.sort_by(|a, b| b.logp.total_cmp(&a.logp));
            next.truncate(budget.expand);
            frontier = next;
        }
    }
    keep_best(&all, candidates, budget.nodes)
}

/// The sub-tree of `all` holding every frontier node and its ancestors, and for each node of
/// `all` in it, its index in the sub-tree.
fn ancestors_of(all: &DraftTree, frontier: &[Scored]) -> (DraftTree, Vec<usize>) {
    let mut wanted = vec![false; all.len()];
    for f in frontier.iter().filter(|f| f.node != usize::MAX) {
        let mut at = Some(f.node);
        while let Some(n) = at.filter(|&n| !wanted[n]) {
            wanted[n] = true;
            at = all.parents[n];
        }
    }
    let (mut sub, mut index) = (DraftTree::new(), vec![usize::MAX; all.len()]);
    for n in (0..all.len()).filter(|&n| wanted[n]) {
        index[n] = sub.add(all.tokens[n], all.parents[n].map(|p| index[p]), None);
    }
    (sub, index)
}

/// The `nodes` best candidates by rank (see [`Scored`]), as a tree in node order.
fn keep_best(all: &DraftTree, mut candidates: Vec<Scored>, nodes: usize) -> Result<DraftTree> {
    // A stable sort: a child ties its parent only when it is certain, and then the parent,
    // found first, stays ahead, so every kept node's parent is kept too.
    candidates.sort_by(|a, b| b.rank.total_cmp(&a.rank));
    let mut keep = vec![false; all.len()];
    for c in candidates.iter().take(nodes) {
        keep[c.node] = true;
    }
    let mut tree = DraftTree::new();
    let mut index = vec![usize::MAX; all.len()];
    for n in 0..all.len() {
        match all.parents[n] {
            _ if !keep[n] => {}
            // Equal log-probabilities could still order a child first; such a node is dropped.
            Some(p) if !keep[p] => keep[n] = false,
            p => index[n] = tree.add(all.tokens[n], p.map(|p| index[p]), all.rows[n].clone()),
        }
    }
    Ok(tree)
}

/// The `width` most likely tokens of a logits row (never `skip`), with their
/// log-probabilities; tokens with non-finite logits are never proposed.
fn top_tokens(row: &[f32], width: usize, skip: Option<u32>) -> Vec<(u32, f32)> {
    let max = row.iter().copied().filter(|x| x.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = row.iter().filter(|x| x.is_finite()).map(|&x| f64::from(x - max).exp()).sum();
    let log_total = max + total.ln() as f32;
    let mut order: Vec<u32> =
        (0..row.len() as u32).filter(|&t| row[t as usize].is_finite() && Some(t) != skip).collect();
    let by_logit = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let width = width.min(order.len());
    if width > 0 && width < order.len() {
        order.select_nth_unstable_by(width - 1, by_logit);
    }
    order.truncate(width);
    order.sort_by(by_logit);
    order.into_iter().map(|t| (t, row[t as usize] - log_total)).collect()
}

fn last_row(rows: Logits, vocab: usize) -> Result<Vec<f32>> {
    check_rows(&rows, 1, vocab)?;
    Ok(rows.into_last_row())
}

fn check_rows(rows: &Logits, expected: usize, vocab: usize) -> Result<()> {
    if rows.rows() != expected || rows.vocab() != vocab {
        return Err(Error::BadModelOutput { model: "draft", what: "tree logits rows", expected, got: rows.rows() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::MarkovModel;
    use rand::SeedableRng;

    #[test]
    fn budgets_are_checked_and_parse() -> Result<()> {
        assert!(TreeBudget::new(0, 3, 4, 1).is_err());
        assert!(TreeBudget::new(2, 0, 4, 1).is_err());
        assert!(TreeBudget::new(2, 3, 0, 1).is_err());
        assert!(TreeBudget::new(2, 3, 4, 0).is_err());
        assert!(TreeBudget::new(2, 3, TreeBudget::MAX_NODES + 1, 1).is_err());
        assert_eq!("2x3x4".parse::<TreeBudget>()?, TreeBudget::new(2, 3, 4, 1)?);
        assert_eq!("2x3x4x2".parse::<TreeBudget>()?.to_string(), "2x3x4x2");
        assert!("2x3".parse::<TreeBudget>().is_err());
        Ok(())
    }

    #[test]
    fn deterministic_duplicates_merge_sampled_ones_do_not() -> Result<()> {
        let mut t = DraftTree::new();
        assert_eq!(t.push(5, None)?, 0);
        assert_eq!(t.push(6, Some(0))?, 1);
        assert_eq!(t.push(5, None)?, 0);
        assert_eq!(t.push_sampled(5, None, vec![1.0])?, 2);
        assert!(t.push(1, Some(9)).is_err());
        assert_eq!(t.first_path(), vec![0, 1]);
        assert_eq!(t.row(2), Some(&[1.0f32][..]));
        assert_eq!(t.shape()?.depth(3), 1);
        Ok(())
    }

    fn rank(model: &MarkovModel, last: u32) -> Vec<u32> {
        let row: Vec<f32> = model.next_probs(&[last]).iter().map(|p| p.ln()).collect();
        top_tokens(&row, 2, None).into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn greedy_expansion_takes_each_parents_best_tokens_within_the_budget() -> Result<()> {
        let (sampling, mut rng) = (SamplingConfig::greedy(), StdRng::seed_from_u64(1));
        let mut picker = ChildPicker::new(&sampling, &mut rng);
        for expand in [1, 2] {
            let mut model = MarkovModel::random(8, 1, 3);
            let tree = expand_tree(&mut model, &[1, 2], TreeBudget::new(2, 3, 6, expand)?, &mut picker)?;
            assert_eq!(tree.len(), 6, "expand {expand}");
            assert_eq!(tree.tokens()[0], rank(&model, 2)[0]);
            for (i, &p) in tree.parents().iter().enumerate() {
                let last = p.map_or(2, |p| tree.tokens()[p]);
                assert!(rank(&model, last).contains(&tree.tokens()[i]), "expand {expand}, node {i}");
            }
            // The model holds the context and, expanding first children, the kept first path
            // but its last node.
            let first: Vec<u32> = tree.first_path().iter().map(|&i| tree.tokens()[i]).collect();
            let held = if expand == 1 { [vec![1, 2], first[..first.len() - 1].to_vec()].concat() } else { vec![1] };
            assert_eq!(model.context(), &held[..], "expand {expand}");
        }
        Ok(())
    }

    #[test]
    fn sampled_picks_draw_the_first_child_from_the_processed_row() -> Result<()> {
        let sampling = SamplingConfig::new(1.0)?.with_top_k(3)?;
        let mut rng = StdRng::seed_from_u64(2);
        let mut picker = ChildPicker::new(&sampling, &mut rng);
        let logits = [0.0f32, 3.0, 1.0, 2.0, -1.0];
        let mut firsts = [0usize; 5];
        for _ in 0..2_000 {
            let kids = picker.pick(&logits, 3)?;
            assert!(kids[0].row.is_some() && kids[1..].iter().all(|c| c.row.is_none()));
            assert_eq!(kids.len(), 3);
            assert!(kids.iter().all(|c| [1, 2, 3].contains(&c.token)), "top-k 3 rules out the rest");
            firsts[kids[0].token as usize] += 1;
        }
        // Draws follow softmax over {1, 2, 3}: about 67 %, 9 %, 24 %.
        assert!(firsts[1] > 1_200 && firsts[2] > 100 && firsts[3] > 350, "{firsts:?}");
        Ok(())
    }
}
