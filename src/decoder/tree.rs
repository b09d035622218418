//! The tree round of [`SpeculativeDecoder`](crate::SpeculativeDecoder): the draft proposes a
//! tree, the target scores it in one call, the kernel walks it, and both models keep the
//! accepted path.

use super::sequence::history;
use super::Sequence;
use crate::error::{Error, Result};
use crate::kernel::{self, Verdict};
use crate::model::{DraftModel, Logits, TargetModel};
use crate::sampling::{argmax, History};
use crate::stop::pending;
use crate::tree::{ChildPicker, DraftTree, TreeBudget, TreeCall};

impl<D: DraftModel, T: TargetModel> Sequence<D, T> {
    /// A tree round: the draft proposes a tree, the target scores it in one call, the kernel
    /// walks it, and both models keep the accepted path.
    pub fn tree_round(&mut self, budget: TreeBudget) -> Result<Verdict> {
        let n = self.ctx.len();
        let feed = pending(&self.ctx, self.draft.context_len(), "draft")?;
        let mut picker = ChildPicker::new(&self.sampling, &mut self.rng);
        if let Some(noise) = self.noise {
            picker = picker.with_noise(noise, n as u64);
        }
        let draft = &mut self.draft;
        let tree = self.clock.timed(&mut self.stats.draft_secs, || draft.propose_tree(feed, budget, &mut picker))?;
        self.stats.draft_calls += 1;
        self.check_tree(&tree, budget)?;
        let (call, path, logits) = self.verify_tree(&tree)?;
        self.score(&path.tokens, &logits, &call.positions(&path.path))?;
        let accepted = path.path.len();
        let target = &mut self.target;
        let kept = call.positions(&path.path);
        self.clock.timed(&mut self.stats.target_secs, || target.keep_path(&call.tokens, &kept))?;
        self.stats.drafted += tree.len();
        self.stats.accepted += accepted;
        self.stats.tree_rounds += 1;
        let at = path.path.last().copied();
        self.stats.rejections += usize::from(tree.parents().contains(&at));
        let deepest = (0..tree.len()).map(|i| tree.depth(i) + 1).max().unwrap_or(0);
        self.stats.record_depths(deepest, accepted);
        // The drafter may hold drafted tokens of the tree's first path: those the accepted path
        // shares are right.
        let shared = tree.first_path().iter().zip(&path.path).take_while(|(a, b)| a == b).count();
        let keep = n + shared;
        if self.draft.context_len() > keep {
            self.draft.truncate(keep)?;
        }
        Ok(Verdict { accepted, tokens: path.tokens })
    }

    /// Checks a drafted tree against the vocabulary and the budget.
    fn check_tree(&self, tree: &DraftTree, budget: TreeBudget) -> Result<()> {
        let vocab = self.target.vocab_size();
        if let Some(&token) = tree.tokens().iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        if let Some(row) = (0..tree.len()).filter_map(|i| tree.row(i)).find(|r| r.len() != vocab) {
            return Err(Error::BadModelOutput {
                model: "draft",
                what: "tree row length",
                expected: vocab,
                got: row.len(),
            });
        }
        if tree.len() > budget.nodes() {
            return Err(Error::BadModelOutput {
                model: "draft",
                what: "tree nodes",
                expected: budget.nodes(),
                got: tree.len(),
            });
        }
        Ok(())
    }

    /// Scores the pending token and the tree in one target call and walks it. Returns the
    /// call, the verdict and the call's rows.
    fn verify_tree(&mut self, tree: &DraftTree) -> Result<(TreeCall, kernel::TreeVerdict, Logits)> {
        let pending = pending(&self.ctx, self.target.context_len(), "target")?;
        let (&root, head) = pending.split_last().ok_or(Error::NotReady("nothing pending"))?;
        let call = tree.call(root)?;
        let target = &mut self.target;
        let logits = self.clock.timed(&mut self.stats.target_secs, || {
            if !head.is_empty() {
                target.forward(head, 0)?;
            }
            target.forward_tree(&call.tokens, &call.shape)
        })?;
        self.stats.target_calls += 1;
        let vocab = self.target.vocab_size();
        if logits.rows() != call.tokens.len() || logits.vocab() != vocab {
            return Err(Error::BadModelOutput {
                model: "target",
                what: "tree logits rows",
                expected: call.tokens.len(),
                got: logits.rows(),
            });
        }
        // Row r is processed for its own path's history: the context, then the drafted tokens
        // from the root down to call token r (none at the root), as plain decoding would see
        // them at that position; the processors follow whatever history they are handed.
        // Without processors no history is read, and none is built.
        let unprocessed = self.procs.is_empty();
        let drafted = |r: usize| -> Vec<u32> {
            if unprocessed {
                return Vec::new();
            }
            let line = r.checked_sub(1).map_or(Vec::new(), |i| tree.line(i));
            line.iter().rev().map(|&i| tree.tokens()[i]).collect()
        };
        let (sampling, procs, n) = (&self.sampling, &mut self.procs, self.ctx.len());
        let ctx = history(&self.ctx, self.prompt_len);
        let nodes = tree.nodes();
        let verdict = if sampling.is_greedy() {
            kernel::verify_tree_greedy(&nodes, |r| {
                let path = drafted(r);
                argmax(procs.apply(&History { drafted: &path, ..ctx }, logits.row(r))?)
            })?
        } else if let Some(noise) = &self.noise {
            // Coupled: a child stands when it is the target's race winner at its position (row
            // r predicts the position after call token r). Any tree keeps the text plain
            // decoding's; how its children were picked only sets how much stands.
            let mut p = Vec::new();
            kernel::verify_tree_greedy(&nodes, |r| {
                let path = drafted(r);
                sampling.probs(procs.apply(&History { drafted: &path, ..ctx }, logits.row(r))?, &mut p)?;
                noise.pick(&p, (n + call.depth(r)) as u64)
            })?
        } else {
            let row = |r: usize, buf: &mut Vec<f32>| {
                let path = drafted(r);
                sampling.probs(procs.apply(&History { drafted: &path, ..ctx }, logits.row(r))?, buf)
            };
            kernel::verify_tree(&nodes, row, &mut self.rng)?
        };
        self.stats.process_secs = self.procs.secs;
        Ok((call, verdict, logits))
    }
}
