//! Growing a tree of drafts with a model: first children fed one by one at a chain's cost,
//! or the best nodes of each level scored together (EAGLE-2), then the best nodes kept.

use super::{Logits, TargetModel};
use crate::error::{Error, Result};
use crate::tree::{Child, ChildPicker, DraftTree, TreeBudget};

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
/// `budget.nodes()` nodes with the highest cumulative draft log-probability are kept (the EAGLE-2
/// rerank; a node never ranks above its parent, so the kept set is a tree).
///
/// With `budget.expand()` = 1 each level's first child ([`ChildPicker::pick`]: a draw when
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
    if budget.expand() == 1 {
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
    let vocab = model.vocab_size();
    let root = last_row(model.forward(tokens, 1)?, vocab)?;
    let (tree, all) = grow(budget, picker, root, |all, frontier| {
        let node = frontier[0];
        Ok(vec![last_row(model.forward(&all.tokens()[node..=node], 1)?, vocab)?])
    })?;
    // The model holds the first children it was fed; keep those that survived the rerank.
    let kept = tree
        .first_path()
        .iter()
        .zip(all.first_path())
        .take_while(|(a, b)| tree.tokens()[**a] == all.tokens()[*b])
        .count();
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
    let vocab = model.vocab_size();
    // Each level's call scores the root and the nodes the frontier descends from; `index`
    // says where each node of the tree sits in the call (after the root).
    let mut score = |all: &DraftTree, frontier: &[usize]| -> Result<(Logits, Vec<usize>)> {
        let (call, index) = ancestors_of(all, frontier.iter().copied());
        let mut call_tokens = vec![root];
        call_tokens.extend(call.tokens());
        let rows = model.forward_tree(&call_tokens, &call.shape()?)?;
        check_rows(&rows, call_tokens.len(), vocab)?;
        Ok((rows, index))
    };
    let root_row = score(&DraftTree::new(), &[])?.0.row(0).to_vec();
    let (tree, _) = grow(budget, picker, root_row, |all, frontier| {
        let (rows, index) = score(all, frontier)?;
        Ok(frontier.iter().map(|&n| rows.row(index[n] + 1).to_vec()).collect())
    })?;
    Ok(tree)
}

/// Grows a tree level by level from the root's row: each node of the frontier gets children
/// from its row (`picker`: with `budget.expand()` = 1 the first child is a draw when sampling,
/// and it alone is expanded next; with more, children are the most likely tokens and the
/// `expand` best nodes by cumulative log-probability are expanded), `rows` gives the rows
/// that follow the frontier's nodes, and the `budget.nodes()` best nodes are kept. Returns the
/// kept tree and the whole one.
pub(crate) fn grow(
    budget: TreeBudget,
    picker: &mut ChildPicker,
    root: Vec<f32>,
    mut rows: impl FnMut(&DraftTree, &[usize]) -> Result<Vec<Vec<f32>>>,
) -> Result<(DraftTree, DraftTree)> {
    let (mut all, mut candidates) = (DraftTree::new(), Vec::<Scored>::new());
    let mut level: Vec<(Option<usize>, f32, Vec<f32>)> = vec![(None, 0.0, root)];
    for depth in 0..budget.depth() {
        let mut next = Vec::new();
        for (parent, logp, row) in &level {
            // Expanding several nodes, children are deterministic: which nodes are expanded
            // depends on their scores, and a draw's presence must not depend on what was drawn.
            let kids = match budget.expand() {
                1 => picker.pick(row, budget.width(), depth)?,
                _ => picker.pick_top(row, budget.width(), depth)?,
            };
            next.extend(add_children(&mut all, kids, *parent, *logp)?);
        }
        candidates.extend(&next);
        if depth + 1 == budget.depth() || next.is_empty() {
            break;
        }
        if budget.expand() > 1 {
            next.sort_by(|a, b| b.logp.total_cmp(&a.logp));
        }
        let frontier: Vec<Scored> = next.into_iter().take(budget.expand()).collect();
        let nodes: Vec<usize> = frontier.iter().map(|s| s.node).collect();
        let new_rows = rows(&all, &nodes)?;
        if new_rows.len() != nodes.len() {
            return Err(Error::BadModelOutput {
                model: "draft",
                what: "tree rows",
                expected: nodes.len(),
                got: new_rows.len(),
            });
        }
        level = frontier.iter().zip(new_rows).map(|(s, r)| (Some(s.node), s.logp, r)).collect();
    }
    Ok((keep_best(&all, candidates, budget.nodes())?, all))
}

/// The sub-tree of `all` holding the nodes `frontier` and their ancestors, and for each node
/// of `all` in it, its index in the sub-tree.
fn ancestors_of(all: &DraftTree, frontier: impl Iterator<Item = usize>) -> (DraftTree, Vec<usize>) {
    let mut wanted = vec![false; all.len()];
    for node in frontier {
        let mut at = Some(node);
        while let Some(n) = at.filter(|&n| !wanted[n]) {
            wanted[n] = true;
            at = all.parents()[n];
        }
    }
    let (mut sub, mut index) = (DraftTree::new(), vec![usize::MAX; all.len()]);
    for n in (0..all.len()).filter(|&n| wanted[n]) {
        index[n] = sub.add(all.tokens()[n], all.parents()[n].map(|p| index[p]), None);
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
        match all.parents()[n] {
            _ if !keep[n] => {}
            // Equal log-probabilities could still order a child first; such a node is dropped.
            Some(p) if !keep[p] => keep[n] = false,
            p => index[n] = tree.add(all.tokens()[n], p.map(|p| index[p]), all.row(n).map(<[f32]>::to_vec)),
        }
    }
    Ok(tree)
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
    use crate::tree::top_tokens;
    use crate::SamplingConfig;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

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
            let tree = expand_tree(&mut model, &[1, 2], format!("2x3x6x{expand}").parse()?, &mut picker)?;
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
}
