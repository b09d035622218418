//! Trees of drafted tokens: the shape a drafter fills ([`TreeBudget`]), what it returns
//! ([`DraftTree`]), and the EAGLE-2 style expansion any model drafter uses
//! ([`expand_tree`]).
//!
//! Tree nodes are deterministic proposals (point masses): which tokens a drafter puts in the
//! tree may depend on anything but the target, and the kernel's tree rule then emits exactly
//! the target's distribution (see [`verify_tree`](crate::kernel::verify_tree)).

use crate::error::{Error, Result};
use crate::model::TargetModel;
use crate::models::TreeShape;

/// How large a tree a drafter may propose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeBudget {
    /// Children tried per expanded node, and nodes expanded per depth.
    pub width: usize,
    /// The deepest level (1: children of the root only).
    pub depth: usize,
    /// The most nodes in all (the root not counted).
    pub nodes: usize,
}

impl TreeBudget {
    /// A budget of `nodes` nodes, `width` wide and `depth` deep.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when any is 0 or `nodes` exceeds [`TreeBudget::MAX_NODES`].
    pub fn new(width: usize, depth: usize, nodes: usize) -> Result<Self> {
        for (name, value) in [("tree width", width), ("tree depth", depth), ("tree nodes", nodes)] {
            if value == 0 {
                return Err(Error::setting(name, value, "at least 1"));
            }
        }
        if nodes > Self::MAX_NODES {
            return Err(Error::setting("tree nodes", nodes, "at most TreeBudget::MAX_NODES (64)"));
        }
        Ok(Self { width, depth, nodes })
    }

    /// The most nodes a tree may have.
    pub const MAX_NODES: usize = 64;

    /// A chain of `k` tokens.
    pub fn chain(k: usize) -> Self {
        Self { width: 1, depth: k, nodes: k }
    }
}

impl Default for TreeBudget {
    /// 2 wide, 5 deep, 12 nodes: small enough that scoring it costs about as much as a chain
    /// of 5 on a CPU, where the target's time grows with the rows it scores.
    fn default() -> Self {
        Self { width: 2, depth: 5, nodes: 12 }
    }
}

/// Drafted tokens in a tree: `tokens[i]` follows `parents[i]` (an earlier node) or, for
/// `None`, the context. Parents always come before their children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraftTree {
    tokens: Vec<u32>,
    parents: Vec<Option<usize>>,
}

impl DraftTree {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `token` under `parent` and returns its index; an existing child with that token
    /// is returned instead of a duplicate.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when `parent` is not an existing node.
    pub fn push(&mut self, token: u32, parent: Option<usize>) -> Result<usize> {
        if parent.is_some_and(|p| p >= self.len()) {
            return Err(Error::setting("tree node parent", format!("{parent:?}"), "an existing node"));
        }
        if let Some(i) = self.child(parent, token) {
            return Ok(i);
        }
        self.tokens.push(token);
        self.parents.push(parent);
        Ok(self.len() - 1)
    }

    /// The child of `parent` (`None`: the root) holding `token`, if there is one.
    pub fn child(&self, parent: Option<usize>, token: u32) -> Option<usize> {
        (0..self.len()).find(|&i| self.parents[i] == parent && self.tokens[i] == token)
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

    /// True when every node follows the one before.
    pub fn is_chain(&self) -> bool {
        self.parents.iter().enumerate().all(|(i, &p)| p == i.checked_sub(1))
    }

    /// The shape of a tree call scoring `root` and then these nodes: node `i` is call token
    /// `i + 1`.
    pub fn shape(&self) -> Result<TreeShape> {
        let parents: Vec<usize> = self.parents.iter().map(|p| p.map_or(0, |p| p + 1)).collect();
        TreeShape::new(&parents)
    }
}

/// A node waiting to be expanded: its index and cumulative draft log-probability.
#[derive(Debug, Clone, Copy)]
struct Scored {
    node: usize,
    logp: f32,
}

/// Drafts a tree with a model, the EAGLE-2 way (Li et al. 2024): the root's row gives the best
/// `width` tokens; at each further depth the `width` nodes with the highest cumulative draft
/// log-probability are expanded together in one [`TargetModel::forward_tree`] call, each
/// offering its own best `width`; in the end the `nodes` best of all candidates are kept
/// (a node never ranks above its parent, so the kept set is a tree). The model's rows are
/// ranked at temperature 1, whatever the sampling settings: the ranking only decides which
/// tokens are tried, never how they are judged.
///
/// `tokens` are appended to the model's context (all but the last for good; the last is the
/// root each call scores again), so the model ends holding the context up to the root.
///
/// # Errors
/// Model failures; [`Error::BadModelOutput`] for rows of the wrong size.
pub fn expand_tree<M: TargetModel + ?Sized>(model: &mut M, tokens: &[u32], budget: TreeBudget) -> Result<DraftTree> {
    let Some((&root, head)) = tokens.split_last() else {
        return Err(Error::EmptyPrompt);
    };
    if !head.is_empty() {
        model.forward(head, 0)?;
    }
    // Candidates in the order found, then the frontier expanded at each depth.
    let (mut all, mut candidates) = (DraftTree::new(), Vec::<Scored>::new());
    let mut frontier = vec![Scored { node: usize::MAX, logp: 0.0 }];
    for depth in 0..budget.depth {
        // The call scores the root and the nodes found so far that the frontier descends from.
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
            for (token, logp) in top_tokens(row, budget.width) {
                let node = all.push(token, parent)?;
                let scored = Scored { node, logp: f.logp + logp };
                candidates.push(scored);
                next.push(scored);
            }
        }
        if depth + 1 < budget.depth {
            next.sort_by(|a, b| b.logp.total_cmp(&a.logp));
            next.truncate(budget.width);
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
        sub.tokens.push(all.tokens[n]);
        sub.parents.push(all.parents[n].map(|p| index[p]));
        index[n] = sub.len() - 1;
    }
    (sub, index)
}

/// The `nodes` best candidates by cumulative log-probability, as a tree in node order.
fn keep_best(all: &DraftTree, mut candidates: Vec<Scored>, nodes: usize) -> Result<DraftTree> {
    // A stable sort: a child ties its parent only when it is certain, and then the parent,
    // found first, stays ahead, so every kept node's parent is kept too.
    candidates.sort_by(|a, b| b.logp.total_cmp(&a.logp));
    let mut keep = vec![false; all.len()];
    for c in candidates.iter().take(nodes) {
        keep[c.node] = true;
    }
    let mut tree = DraftTree::new();
    let mut index = vec![usize::MAX; all.len()];
    for n in 0..all.len() {
        if !keep[n] {
            continue;
        }
        // Equal log-probabilities could still order a child first; such a node is dropped.
        match all.parents[n] {
            Some(p) if !keep[p] => keep[n] = false,
            p => index[n] = tree.push(all.tokens[n], p.map(|p| index[p]))?,
        }
    }
    Ok(tree)
}

/// The `width` most likely tokens of a logits row, with their log-probabilities (non-finite
/// logits are never proposed).
fn top_tokens(row: &[f32], width: usize) -> Vec<(u32, f32)> {
    let max = row.iter().copied().filter(|x| x.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = row.iter().filter(|x| x.is_finite()).map(|&x| f64::from(x - max).exp()).sum();
    let log_total = max + total.ln() as f32;
    let mut order: Vec<u32> = (0..row.len() as u32).filter(|&t| row[t as usize].is_finite()).collect();
    let by_logit = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]);
    let width = width.min(order.len());
    if width > 0 && width < order.len() {
        order.select_nth_unstable_by(width - 1, by_logit);
    }
    order.truncate(width);
    order.sort_by(by_logit);
    order.into_iter().map(|t| (t, row[t as usize] - log_total)).collect()
}

fn check_rows(rows: &crate::model::Logits, expected: usize, vocab: usize) -> Result<()> {
    if rows.rows() != expected || rows.vocab() != vocab {
        return Err(Error::BadModelOutput { model: "draft", what: "tree logits rows", expected, got: rows.rows() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::MarkovModel;

    #[test]
    fn budgets_are_checked() {
        assert!(TreeBudget::new(0, 3, 4).is_err());
        assert!(TreeBudget::new(2, 0, 4).is_err());
        assert!(TreeBudget::new(2, 3, 0).is_err());
        assert!(TreeBudget::new(2, 3, TreeBudget::MAX_NODES + 1).is_err());
        assert_eq!(TreeBudget::new(2, 3, 4).unwrap(), TreeBudget { width: 2, depth: 3, nodes: 4 });
    }

    #[test]
    fn duplicate_children_merge_and_parents_must_exist() {
        let mut t = DraftTree::new();
        assert_eq!(t.push(5, None).unwrap(), 0);
        assert_eq!(t.push(6, Some(0)).unwrap(), 1);
        assert_eq!(t.push(5, None).unwrap(), 0);
        assert!(t.push(1, Some(9)).is_err());
        assert!(t.is_chain());
        t.push(7, None).unwrap();
        assert!(!t.is_chain());
        assert_eq!(t.shape().unwrap().depth(3), 1);
    }

    #[test]
    fn expansion_follows_the_most_likely_paths_within_the_budget() -> Result<()> {
        let mut model = MarkovModel::random(8, 1, 3);
        let budget = TreeBudget::new(2, 3, 6)?;
        let tree = expand_tree(&mut model, &[1, 2], budget)?;
        assert_eq!(tree.len(), 6);
        assert_eq!(model.context(), &[1]);
        // The root's best token is the first node, and every node is among its parent's best 2.
        let row = |ctx: &[u32]| model.next_probs(ctx).to_vec();
        let best = |row: &[f32]| top_tokens(&row.iter().map(|p| p.ln()).collect::<Vec<_>>(), 2);
        assert_eq!(tree.tokens()[0], best(&row(&[1, 2]))[0].0);
        for (i, &p) in tree.parents().iter().enumerate() {
            let last = p.map_or(2, |p| tree.tokens()[p]);
            assert!(best(&row(&[last])).iter().any(|&(t, _)| t == tree.tokens()[i]), "node {i}");
        }
        // A width-1 budget is the greedy chain.
        let chain = expand_tree(&mut model, &[2], TreeBudget::chain(3))?;
        assert!(chain.is_chain() && chain.len() == 3);
        Ok(())
    }
}
