//! Exact acceptance on a tree of drafts: several continuations share one target pass, so one
//! wrong guess no longer ends the round (SpecInfer's multi-step speculative sampling, Miao et
//! al. 2024, arXiv 2305.09781). Pure like the chain rule in the parent module: slices in, a
//! decision out, the random number generator passed in.
//!
//! The walk starts at the root (the position after the pending token). At a position whose
//! target row is `p`, the children `x_1, …, x_m` are tried in order. Child `j`, drafted from the
//! row `q_j` (a dense row it was sampled from, independently of its siblings, or a point mass
//! for a deterministic proposal), is accepted with probability `min(1, p(x_j)/q_j(x_j))`, and
//! the walk moves to it. After a rejection, `p` becomes the residual
//! `normalize(max(0, p − q_j))` and the next child is tried. When every child has failed (a leaf
//! has none), one token is drawn from the final `p` and the round ends.
//!
//! Why each emitted token follows `p`, by induction on the children left. With none, the token
//! is drawn from `p`. With children `j..m`: child `j` is emitted with probability
//! `Σ_x q_j(x)·min(1, p(x)/q_j(x))·[x = t] = min(p(t), q_j(t))`; otherwise, with probability
//! `β = 1 − Σ min(p, q_j)`, the remaining children emit (by induction) the residual
//! `max(0, p − q_j)/β`; in total `min(p, q_j) + max(0, p − q_j) = p`. The residual does not
//! depend on which `x_j` was drawn, so independent draws are all the proof needs. For a point
//! mass the rule reads: accept `x` with probability `p(x)`, else take `x` out of `p` (the same
//! as drawing `y ~ p` and descending when `y` is a child). Once a child is accepted the walk
//! repeats at the child with the target's row there, so every emitted token follows the target
//! given the tokens before it. Greedy decoding is the argmax case: descend while the target's
//! argmax is a child.

use rand::{Rng, RngExt};

use super::{check_rows, DraftRow};
use crate::error::{Error, Result};
use crate::sampling::sample_weighted;

/// One drafted node of a tree.
#[derive(Debug, Clone, Copy)]
pub struct TreeNode<'a> {
    /// The drafted token.
    pub token: u32,
    /// The node this one follows (an earlier index), or `None` for a child of the root.
    pub parent: Option<usize>,
    /// The draft row the token was drawn from.
    pub q: DraftRow<'a>,
}

/// The outcome of verifying a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeVerdict {
    /// The accepted nodes from the root down, each a child of the one before.
    pub path: Vec<usize>,
    /// The tokens to emit: the path's tokens, then one more.
    pub tokens: Vec<u32>,
}

/// The children of each position, in node order: entry 0 for the root, `i + 1` for node `i`.
///
/// # Errors
/// [`Error::InvalidSetting`] when a node's parent is not an earlier node.
pub fn children(nodes: &[TreeNode]) -> Result<Vec<Vec<usize>>> {
    let mut kids = vec![Vec::new(); nodes.len() + 1];
    for (i, n) in nodes.iter().enumerate() {
        match n.parent {
            None => kids[0].push(i),
            Some(p) if p < i => kids[p + 1].push(i),
            Some(p) => return Err(Error::setting("tree node parent", p, "the index of an earlier node")),
        }
    }
    Ok(kids)
}

/// Verifies a tree of drafts. `target_row(r, buf)` writes the target's probability row at
/// position `r` (0: the root, `i + 1`: after node `i`) into `buf`; it is called only for the
/// positions the walk reaches.
///
/// # Errors
/// Whatever `target_row` returns; a misplaced parent; the row errors of
/// [`judge`](super::judge).
pub fn verify_tree<R, F>(nodes: &[TreeNode], mut target_row: F, rng: &mut R) -> Result<TreeVerdict>
where
    R: Rng + ?Sized,
    F: FnMut(usize, &mut Vec<f32>) -> Result<()>,
{
    let kids = children(nodes)?;
    let (mut path, mut tokens, mut row) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0;
    loop {
        target_row(at, &mut row)?;
        match try_children(&row, nodes, &kids[at], rng)? {
            Step::Descend(i) => {
                path.push(i);
                tokens.push(nodes[i].token);
                at = i + 1;
            }
            Step::Emit(t) => {
                tokens.push(t);
                return Ok(TreeVerdict { path, tokens });
            }
        }
    }
}

/// Greedy verification of a tree: descend while the target's argmax is a child, then emit the
/// argmax. `target_argmax(r)` gives the argmax at position `r` (as in [`verify_tree`]).
///
/// # Errors
/// Whatever `target_argmax` returns; a misplaced parent.
pub fn verify_tree_greedy<F>(nodes: &[TreeNode], mut target_argmax: F) -> Result<TreeVerdict>
where
    F: FnMut(usize) -> Result<u32>,
{
    let kids = children(nodes)?;
    let (mut path, mut tokens) = (Vec::new(), Vec::new());
    let mut at = 0;
    loop {
        let best = target_argmax(at)?;
        tokens.push(best);
        match kids[at].iter().find(|&&c| nodes[c].token == best) {
            Some(&c) => {
                path.push(c);
                at = c + 1;
            }
            None => return Ok(TreeVerdict { path, tokens }),
        }
    }
}

enum Step {
    Descend(usize),
    Emit(u32),
}

/// Tries `children` in order against the target row `row`, moving to the residual after each
/// rejection; draws from the final row when all fail.
fn try_children<R: Rng + ?Sized>(row: &[f32], nodes: &[TreeNode], children: &[usize], rng: &mut R) -> Result<Step> {
    let mut p = normalized(row)?;
    for &c in children {
        let TreeNode { token, q, .. } = nodes[c];
        check_rows(row, q, token)?;
        if rng.random::<f64>() < accept(&p, q, token) {
            return Ok(Step::Descend(c));
        }
        to_residual(&mut p, q, token);
    }
    Ok(Step::Emit(sample_weighted(p.iter().copied(), 1.0, rng)))
}

/// `row` divided by its f64 sum.
fn normalized(row: &[f32]) -> Result<Vec<f64>> {
    let total = crate::math::sum(row);
    if !(total > 0.0 && total.is_finite()) {
        return Err(Error::EmptyDistribution);
    }
    Ok(row.iter().map(|&x| x as f64 / total).collect())
}

/// `min(1, p(t)/q(t))` for a normalized `p` (a `q(t) = 0`, which a correct drafter cannot
/// produce, accepts iff `p(t) > 0`, as in the chain rule).
fn accept(p: &[f64], q: DraftRow, t: u32) -> f64 {
    let (t, q_total) = (t as usize, q.total());
    let q_t = q.prob(t, t, q_total);
    if q_t <= 0.0 {
        return f64::from(u8::from(p[t] > 0.0));
    }
    (p[t] / q_t).min(1.0)
}

/// `p ← normalize(max(0, p − q))`; unchanged when that has no mass (then `p = q`, and a
/// rejection could only come from a token outside `q`).
fn to_residual(p: &mut [f64], q: DraftRow, t: u32) {
    let q_total = q.total();
    let mass: f64 = p.iter().enumerate().map(|(i, &x)| (x - q.prob(i, t as usize, q_total)).max(0.0)).sum();
    if mass > 0.0 {
        for (i, x) in p.iter_mut().enumerate() {
            *x = (*x - q.prob(i, t as usize, q_total)).max(0.0) / mass;
        }
    }
}

/// The probability that the walk at one position emits each token first, computed analytically
/// over the draws of the dense children (each child `(token, q)`; a dense child's token is a
/// draw, so only its row matters): equal to `p` (normalized) by the theorem above; exposed so
/// that tests can check the identity on arbitrary rows and sibling lists.
///
/// # Errors
/// [`Error::EmptyDistribution`] when `p` has no mass.
pub fn tree_emission_probabilities(p: &[f32], children: &[(u32, DraftRow)]) -> Result<Vec<f64>> {
    let mut p = normalized(p)?;
    let mut out = vec![0.0; p.len()];
    // The probability that every child so far was rejected.
    let mut reach = 1.0;
    for &(token, q) in children {
        let q_total = q.total();
        let candidates: Vec<usize> = match q {
            DraftRow::Dense(_) => (0..p.len()).collect(),
            DraftRow::Point => vec![token as usize],
        };
        let mut accepted = 0.0;
        for t in candidates {
            let a = q.prob(t, token as usize, q_total) * accept(&p, q, t as u32);
            out[t] += reach * a;
            accepted += a;
        }
        reach *= 1.0 - accepted;
        to_residual(&mut p, q, token);
    }
    for (o, x) in out.iter_mut().zip(&p) {
        *o += reach * x;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn point(token: u32, parent: Option<usize>) -> TreeNode<'static> {
        TreeNode { token, parent, q: DraftRow::Point }
    }

    #[test]
    fn greedy_descends_while_the_argmax_is_a_child() {
        // root → {5, 7}; 7 → {1, 2}; 2 → {9}.
        let nodes = [point(5, None), point(7, None), point(1, Some(1)), point(2, Some(1)), point(9, Some(3))];
        let argmax = [7u32, 0, 2, 0, 2, 4];
        let v = verify_tree_greedy(&nodes, |r| Ok(argmax[r])).unwrap();
        assert_eq!(v, TreeVerdict { path: vec![1, 3], tokens: vec![7, 2, 2] });
    }

    #[test]
    fn a_certain_target_follows_its_branch_and_ends_with_a_bonus() {
        // Target rows are one-hot: root → 1, after node 1 (token 1) → 3, after node 2 → 0.
        let nodes = [point(0, None), point(1, None), point(3, Some(1))];
        let rows = [[0.0f32, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]];
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..100 {
            let v = verify_tree(
                &nodes,
                |r, buf| {
                    buf.clear();
                    buf.extend_from_slice(&rows[r]);
                    Ok(())
                },
                &mut rng,
            )
            .unwrap();
            assert_eq!(v, TreeVerdict { path: vec![1, 2], tokens: vec![1, 3, 0] });
        }
    }

    #[test]
    fn a_parent_after_its_child_is_an_error() {
        let nodes = [point(1, Some(1)), point(2, None)];
        assert!(matches!(children(&nodes), Err(Error::InvalidSetting { .. })));
        assert!(verify_tree_greedy(&nodes, |_| Ok(0)).is_err());
    }
}
