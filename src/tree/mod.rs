//! Trees of drafted tokens: the shape a drafter fills ([`TreeBudget`]), what it returns
//! ([`DraftTree`]), and how a drafter's row becomes children under the decoder's sampling
//! settings ([`ChildPicker`]), and the attention layout of a tree call ([`TreeShape`]). Model
//! drafters grow trees with [`expand_tree`](crate::model::expand_tree).
//!
//! A node is a deterministic proposal (a point mass) or a draw from a draft row kept with it.
//! Which deterministic tokens a drafter puts in a tree may depend on anything but the target,
//! and a sampled node must be a fresh draw from its row; the kernel's tree rule then emits
//! exactly the target's distribution (see [`verify_tree`](crate::kernel::verify_tree)).

use rand::Rng;

mod shape;

pub use shape::TreeShape;

use crate::error::{Error, Result};
use crate::kernel::{DraftRow, TreeNode};
use crate::sampling::{sample, Noise, SamplingConfig};

/// How large a tree a drafter may propose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeBudget {
    width: usize,
    depth: usize,
    nodes: usize,
    expand: usize,
}

impl TreeBudget {
    /// A budget of `nodes` nodes, `width` children per expanded node, `depth` levels, `expand`
    /// nodes expanded per level. Public code writes `"WxDxN".parse()` or `"WxDxNxE".parse()`,
    /// where the order is in plain sight, rather than four integers that compile swapped.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when any is 0 or `nodes` exceeds [`TreeBudget::MAX_NODES`].
    fn new(width: usize, depth: usize, nodes: usize, expand: usize) -> Result<Self> {
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

    /// Children per expanded node.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The deepest level (1: children of the root only).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The most nodes in all (the root not counted).
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Nodes expanded per depth. 1: the first child of each level is expanded, the others stay
    /// leaves, so a model drafts the tree with one one-token call per level, as it drafts a
    /// chain; more: the best `expand` nodes by cumulative draft probability, scored together
    /// in one tree call per level (EAGLE-2), which costs more draft time.
    pub fn expand(&self) -> usize {
        self.expand
    }

    /// The same budget no deeper than `depth` levels (a round near the end of a generation, a
    /// drafter with fewer heads).
    pub(crate) fn at_most_deep(self, depth: usize) -> Self {
        Self { depth: self.depth.min(depth), ..self }
    }
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
        match self.point_child(parent, token) {
            Some(i) => Ok(i),
            None => Ok(self.add(token, parent, None)),
        }
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

    /// Appends a node as it is (no parent check, no merging): for copies of checked trees.
    pub(super) fn add(&mut self, token: u32, parent: Option<usize>, row: Option<Vec<f32>>) -> usize {
        self.tokens.push(token);
        self.parents.push(parent);
        self.rows.push(row);
        self.len() - 1
    }

    /// True when `parent` (`None`: the root) has a deterministic child `token`.
    pub fn has_child(&self, parent: Option<usize>, token: u32) -> bool {
        self.point_child(parent, token).is_some()
    }

    /// The deterministic child `token` of `parent`, if there is one.
    fn point_child(&self, parent: Option<usize>, token: u32) -> Option<usize> {
        (0..self.len()).find(|&i| self.parents[i] == parent && self.tokens[i] == token && self.rows[i].is_none())
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

    /// Node `n` and its ancestors, `n` first.
    pub fn line(&self, n: usize) -> Vec<usize> {
        let mut line = vec![n];
        while let Some(p) = line.last().and_then(|&at| self.parents.get(at).copied().flatten()) {
            line.push(p);
        }
        line
    }

    /// How far node `n` lies below the root (0 for the root's children).
    pub fn depth(&self, n: usize) -> usize {
        self.line(n).len() - 1
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
    /// `i + 1` (see [`call`](Self::call), which keeps that offset in one place).
    ///
    /// # Errors
    /// Never for a tree built with `push` (parents come first).
    pub fn shape(&self) -> Result<TreeShape> {
        let parents: Vec<usize> = self.parents.iter().map(|p| p.map_or(0, |p| p + 1)).collect();
        TreeShape::new(&parents)
    }

    /// The kernel's view of the nodes (see [`verify_tree`](crate::kernel::verify_tree)).
    pub fn nodes(&self) -> Vec<TreeNode<'_>> {
        (0..self.len())
            .map(|i| TreeNode {
                token: self.tokens[i],
                parent: self.parents[i],
                q: self.row(i).map_or(DraftRow::Point, DraftRow::Dense),
            })
            .collect()
    }

    /// The tree call that scores `root` (the pending token) and then the nodes: its tokens
    /// and attention layout, and the mapping between its positions and the nodes.
    ///
    /// # Errors
    /// Never for a tree built with `push` (parents come first).
    pub fn call(&self, root: u32) -> Result<TreeCall> {
        let mut tokens = vec![root];
        tokens.extend_from_slice(&self.tokens);
        let depths = std::iter::once(0).chain((0..self.len()).map(|i| self.depth(i) + 1)).collect();
        Ok(TreeCall { tokens, shape: self.shape()?, depths })
    }
}

/// A tree call: the root (position 0), then node `i` at position `i + 1`. The kernel's verdict
/// names nodes; [`positions`](Self::positions) turns an accepted path into the call positions a
/// model keeps, and the kernel's row index `r` is a call position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeCall {
    /// The call's tokens.
    pub tokens: Vec<u32>,
    /// Which tokens of the call each sees.
    pub shape: TreeShape,
    depths: Vec<usize>,
}

impl TreeCall {
    /// The call positions of the root and then of the accepted `path` (node indices).
    pub fn positions(&self, path: &[usize]) -> Vec<usize> {
        std::iter::once(0).chain(path.iter().map(|i| i + 1)).collect()
    }

    /// How far the token at call position `r` lies below the root (0 for the root).
    pub fn depth(&self, r: usize) -> usize {
        self.depths[r]
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
/// Any generator serves (the decoders pass their `StdRng`; tests may pass a counting or a
/// fixed one).
pub struct ChildPicker<'a> {
    sampling: &'a SamplingConfig,
    rng: &'a mut dyn Rng,
    /// Coupled sampling: the noise and the position of the root's children.
    coupled: Option<(Noise, u64)>,
}

impl<'a> ChildPicker<'a> {
    /// A picker sampling with `sampling` from `rng`.
    pub fn new(sampling: &'a SamplingConfig, rng: &'a mut dyn Rng) -> Self {
        Self { sampling, rng, coupled: None }
    }

    /// For coupled sampling ([`SamplingConfig::coupled`]): children are the best runners of
    /// the race on the draft's row under `noise` (the root's children at `position`, theirs at
    /// `position + 1`, …), all deterministic: the draft's likeliest matches for the target's
    /// race winner, which verification keeps.
    pub fn with_noise(mut self, noise: Noise, position: u64) -> Self {
        self.coupled = Some((noise, position));
        self
    }

    /// Coupled children at `depth`, or `None` when not coupled.
    fn coupled(&self, logits: &[f32], width: usize, depth: usize) -> Option<Result<Vec<Child>>> {
        let (noise, position) = self.coupled?;
        let mut q = Vec::new();
        Some(self.sampling.probs(logits, &mut q).and_then(|()| {
            let top = noise.top(&q, position + depth as u64, width)?;
            Ok(top.into_iter().map(|t| Child { token: t, logp: q[t as usize].ln(), row: None }).collect())
        }))
    }

    /// Up to `width` children of a node at `depth` (0: the root's children) whose draft logits
    /// are `logits`, the first to be tried first. Greedy: the `width` most likely tokens.
    /// Sampling: one token drawn from the processed row (a sampled child, accepted as often as
    /// a chain's draft token), then the most likely others (deterministic). Coupled: see
    /// [`with_noise`](Self::with_noise). Tokens the settings rule out are never proposed.
    ///
    /// # Errors
    /// Rows the sampling settings reject (NaN, all masked).
    pub fn pick(&mut self, logits: &[f32], width: usize, depth: usize) -> Result<Vec<Child>> {
        if self.sampling.is_greedy() {
            return self.pick_top(logits, width, depth);
        }
        if let Some(children) = self.coupled(logits, width, depth) {
            return children;
        }
        let mut q = Vec::new();
        self.sampling.probs(logits, &mut q)?;
        let drawn = sample(&q, self.rng)?;
        let others = top_probs(&q, width.saturating_sub(1), Some(drawn));
        let first = Child { token: drawn, logp: q[drawn as usize].ln(), row: Some(q) };
        Ok(std::iter::once(first)
            .chain(others.into_iter().map(|(token, logp)| Child { token, logp, row: None }))
            .collect())
    }

    /// The `width` most likely tokens of the processed row, all deterministic (no draw);
    /// coupled, the best runners of the race at `depth`.
    ///
    /// # Errors
    /// Rows the sampling settings reject (NaN, all masked).
    pub fn pick_top(&mut self, logits: &[f32], width: usize, depth: usize) -> Result<Vec<Child>> {
        if let Some(children) = self.coupled(logits, width, depth).filter(|_| !self.sampling.is_greedy()) {
            return children;
        }
        let top = if self.sampling.is_greedy() {
            crate::sampling::argmax(logits)?; // the same row checks as sampling
            top_tokens(logits, width, None)
        } else {
            let mut q = Vec::new();
            self.sampling.probs(logits, &mut q)?;
            top_probs(&q, width, None)
        };
        Ok(top.into_iter().map(|(token, logp)| Child { token, logp, row: None }).collect())
    }
}

/// The `width` most likely tokens of a logits row (never `skip`), with their
/// log-probabilities; tokens with non-finite logits are never proposed.
pub(crate) fn top_tokens(row: &[f32], width: usize, skip: Option<u32>) -> Vec<(u32, f32)> {
    let max = row.iter().copied().filter(|x| x.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = row.iter().filter(|x| x.is_finite()).map(|&x| f64::from(x - max).exp()).sum();
    let log_total = max + total.ln() as f32;
    let top = top_indices(row, width, skip, |x| x.is_finite());
    top.into_iter().map(|t| (t, row[t as usize] - log_total)).collect()
}

/// The `width` most likely tokens of a probability row (never `skip`, never one of
/// probability 0), with their log-probabilities.
fn top_probs(q: &[f32], width: usize, skip: Option<u32>) -> Vec<(u32, f32)> {
    top_indices(q, width, skip, |p| p > 0.0).into_iter().map(|t| (t, q[t as usize].ln())).collect()
}

/// The indices of the `width` largest values of `row` that pass `keep` (never `skip`), largest
/// first, the lower index first among equals.
fn top_indices(row: &[f32], width: usize, skip: Option<u32>, keep: impl Fn(f32) -> bool) -> Vec<u32> {
    let mut order: Vec<u32> = (0..row.len() as u32).filter(|&t| keep(row[t as usize]) && Some(t) != skip).collect();
    let by_value = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let width = width.min(order.len());
    if width > 0 && width < order.len() {
        order.select_nth_unstable_by(width - 1, by_value);
    }
    order.truncate(width);
    order.sort_by(by_value);
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn a_nodes_line_runs_up_to_the_root() -> Result<()> {
        let mut tree = DraftTree::new();
        let a = tree.push(5, None)?;
        let b = tree.push(6, None)?;
        let c = tree.push(7, Some(a))?;
        let d = tree.push(8, Some(c))?;
        assert_eq!(tree.line(d), vec![d, c, a]);
        assert_eq!([tree.depth(a), tree.depth(b), tree.depth(c), tree.depth(d)], [0, 0, 1, 2]);
        Ok(())
    }

    #[test]
    fn coupled_children_are_the_race_order_at_their_depth() -> Result<()> {
        let sampling = SamplingConfig::new(0.8)?.with_top_k(4)?.coupled();
        let mut rng = StdRng::seed_from_u64(1);
        let noise = Noise::new(9, 0);
        let mut picker = ChildPicker::new(&sampling, &mut rng).with_noise(noise, 20);
        let logits = [0.5f32, 2.0, 1.0, 1.5, -1.0, 0.0];
        let mut q = Vec::new();
        sampling.probs(&logits, &mut q)?;
        for depth in 0..5 {
            let kids = picker.pick(&logits, 3, depth)?;
            let tokens: Vec<u32> = kids.iter().map(|c| c.token).collect();
            assert_eq!(tokens, noise.top(&q, 20 + depth as u64, 3)?);
            assert!(kids.iter().all(|c| c.row.is_none()), "coupled children are deterministic");
            assert_eq!(picker.pick_top(&logits, 3, depth)?.iter().map(|c| c.token).collect::<Vec<_>>(), tokens);
        }
        Ok(())
    }

    #[test]
    fn budgets_are_checked_and_parse() -> Result<()> {
        assert!("0x3x4".parse::<TreeBudget>().is_err());
        assert!("2x0x4".parse::<TreeBudget>().is_err());
        assert!("2x3x0".parse::<TreeBudget>().is_err());
        assert!("2x3x4x0".parse::<TreeBudget>().is_err());
        assert!(TreeBudget::new(2, 3, TreeBudget::MAX_NODES + 1, 1).is_err());
        assert_eq!("2x3x4".parse::<TreeBudget>()?, "2x3x4".parse::<TreeBudget>()?);
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

    #[test]
    fn sampled_picks_draw_the_first_child_from_the_processed_row() -> Result<()> {
        let sampling = SamplingConfig::new(1.0)?.with_top_k(3)?;
        let mut rng = StdRng::seed_from_u64(2);
        let mut picker = ChildPicker::new(&sampling, &mut rng);
        let logits = [0.0f32, 3.0, 1.0, 2.0, -1.0];
        let mut firsts = [0usize; 5];
        for _ in 0..20_000 {
            let kids = picker.pick(&logits, 3, 0)?;
            assert!(kids[0].row.is_some() && kids[1..].iter().all(|c| c.row.is_none()));
            assert_eq!(kids.len(), 3);
            assert!(kids.iter().all(|c| [1, 2, 3].contains(&c.token)), "top-k 3 rules out the rest");
            firsts[kids[0].token as usize] += 1;
        }
        // Draws follow softmax over {1, 2, 3}. Pearson's chi-square on 2 degrees of freedom is
        // exponential with mean 2, so 2·ln(10^6) = 27.6 is its 1e-6 critical value.
        let z: f64 = [3.0f64, 1.0, 2.0].iter().map(|x| x.exp()).sum();
        let law = [0.0, 3f64.exp() / z, 1f64.exp() / z, 2f64.exp() / z, 0.0];
        let chi_square = |law: &[f64]| -> f64 {
            let e = |i: usize| law[i] * 20_000.0;
            [1, 2, 3].iter().map(|&i| (firsts[i] as f64 - e(i)).powi(2) / e(i)).sum()
        };
        assert!(chi_square(&law) < 27.6, "{firsts:?} against {law:?}");
        // Power at this sample size: a law off by two points (9 % read as 11 %) is rejected.
        let biased = [0.0, law[1] - 0.02, law[2] + 0.02, law[3], 0.0];
        assert!(chi_square(&biased) > 27.6, "{firsts:?} passes against {biased:?}");
        Ok(())
    }
}
