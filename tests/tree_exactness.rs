//! Statistical proof that tree verification samples the target's distribution: a toy tree
//! speculation loop (Markov target and draft, a two-level tree per round) run with
//! `kernel::verify_tree`, the joint law of the first three generated tokens checked by
//! chi-square at significance 1e-6 with fixed seeds, for sampled and deterministic children
//! under every sampling setting; plus a power check that rejects the naive rule "accept a
//! sampled child when a fresh draw from p equals it, else emit another draw from p".
//! Then the decoder itself with tree rounds (model drafts: first children expanded, sampled
//! when sampling; the best two per level, EAGLE-2; n-gram trees): whole generations checked
//! the same way, on two windows of tokens, with two power checks through the decoder: a tree
//! call that ignores its mask, and a drafter that keeps a draw only when it was likely.

mod common;

use common::{
    assert_fits, assert_nudge_rejected, assert_rejects, cell, check_windows, exact_window, nudged_past_the_limit,
    processed_row, settings, window_counts,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use specdec::kernel::{self, DraftRow, TreeNode, TreeVerdict};
use specdec::sampling::sample;
use specdec::toy::MarkovModel;
use specdec::TokenModel;
use specdec::{DraftModel, NGramDraft, Pair, Result, SamplingConfig, SpeculativeDecoder, TreeBudget, TreePolicy};

const VOCAB: usize = 6;
const PROMPT: [u32; 3] = [2, 0, 5];
const SAMPLES: usize = 60_000;
const LEN: usize = 3;

/// How the children of a tree node are drafted.
#[derive(Clone, Copy, PartialEq)]
enum Children {
    /// `n` independent draws from the draft row.
    Sampled(usize),
    /// The draft row's `n` most likely tokens, as point masses.
    TopK(usize),
}

/// How a round's tree is judged.
#[derive(Clone, Copy, PartialEq)]
enum Rule {
    Exact,
    /// The biased rule the power check must reject.
    NaiveResample,
}

fn f32s(row: &[f64]) -> Vec<f32> {
    row.iter().map(|&x| x as f32).collect()
}

/// Draft children of `ctx`: tokens and their rows.
fn draft_children(
    draft: &MarkovModel,
    cfg: &SamplingConfig,
    ctx: &[u32],
    how: Children,
    rng: &mut StdRng,
) -> Result<(Vec<u32>, Vec<f32>)> {
    let q = f32s(&processed_row(draft, cfg, ctx));
    let tokens = match how {
        Children::Sampled(n) => (0..n).map(|_| sample(&q, rng)).collect::<Result<Vec<u32>>>()?,
        Children::TopK(n) => {
            let mut order: Vec<u32> = (0..VOCAB as u32).filter(|&t| q[t as usize] > 0.0).collect();
            order.sort_by(|a, b| q[*b as usize].total_cmp(&q[*a as usize]));
            order.truncate(n);
            order
        }
    };
    Ok((tokens, q))
}

/// One round: a tree of up to 3 children, each with up to 2 children, judged against the target.
fn round(
    target: &MarkovModel,
    draft: &MarkovModel,
    cfg: &SamplingConfig,
    ctx: &[u32],
    how: (Children, Children),
    rule: Rule,
    rng: &mut StdRng,
) -> Result<Vec<u32>> {
    // Nodes as (token, parent, index of its q row); the rows live in `rows`.
    let (mut spec, mut rows) = (Vec::new(), Vec::new());
    let (first, q0) = draft_children(draft, cfg, ctx, how.0, rng)?;
    rows.push(q0);
    for t in first {
        spec.push((t, None, 0));
        let parent = spec.len() - 1;
        let mut path = ctx.to_vec();
        path.push(t);
        let (second, q1) = draft_children(draft, cfg, &path, how.1, rng)?;
        rows.push(q1);
        spec.extend(second.into_iter().map(|u| (u, Some(parent), rows.len() - 1)));
    }
    let dense = matches!(how.0, Children::Sampled(_));
    let nodes: Vec<TreeNode> = spec
        .iter()
        .map(|&(token, parent, q)| {
            let sampled = if parent.is_none() { dense } else { matches!(how.1, Children::Sampled(_)) };
            TreeNode { token, parent, q: if sampled { DraftRow::Dense(&rows[q]) } else { DraftRow::Point } }
        })
        .collect();
    // The context at each position: the root, then each node's path.
    let context = |r: usize| -> Vec<u32> {
        let mut path = Vec::new();
        let mut at = r.checked_sub(1);
        while let Some(i) = at {
            path.push(nodes[i].token);
            at = nodes[i].parent;
        }
        ctx.iter().copied().chain(path.into_iter().rev()).collect()
    };
    let target_row = |r: usize, buf: &mut Vec<f32>| -> Result<()> {
        *buf = f32s(&processed_row(target, cfg, &context(r)));
        Ok(())
    };
    let verdict: TreeVerdict = match rule {
        Rule::Exact => kernel::verify_tree(&nodes, target_row, rng)?,
        Rule::NaiveResample => naive(&nodes, target_row, rng)?,
    };
    Ok(verdict.tokens)
}

/// At each position: for each child, a fresh draw from p; if it equals the child, descend;
/// if no child matched, emit one more fresh draw from p.
fn naive(
    nodes: &[TreeNode],
    mut target_row: impl FnMut(usize, &mut Vec<f32>) -> Result<()>,
    rng: &mut StdRng,
) -> Result<TreeVerdict> {
    let kids = kernel::children(nodes)?;
    let (mut path, mut tokens, mut p) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0;
    'walk: loop {
        target_row(at, &mut p)?;
        for &c in &kids[at] {
            if sample(&p, rng)? == nodes[c].token {
                path.push(c);
                tokens.push(nodes[c].token);
                at = c + 1;
                continue 'walk;
            }
        }
        tokens.push(sample(&p, rng)?);
        return Ok(TreeVerdict { path, tokens });
    }
}

/// The counts of the first `LEN` generated tokens over `SAMPLES` generations.
fn counts(
    target: &MarkovModel,
    draft: &MarkovModel,
    cfg: &SamplingConfig,
    how: (Children, Children),
    rule: Rule,
    seed: u64,
) -> Result<(Vec<u64>, usize)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut counts, mut accepted) = (vec![0u64; VOCAB.pow(LEN as u32)], 0);
    for _ in 0..SAMPLES {
        let mut ctx = PROMPT.to_vec();
        while ctx.len() < PROMPT.len() + LEN {
            let tokens = round(target, draft, cfg, &ctx, how, rule, &mut rng)?;
            accepted += tokens.len() - 1;
            ctx.extend(tokens);
        }
        counts[cell(&ctx, PROMPT.len(), LEN, VOCAB)] += 1;
    }
    Ok((counts, accepted))
}

fn pair() -> (MarkovModel, MarkovModel) {
    let target = MarkovModel::random(VOCAB, 2, 51);
    let draft = target.noisy_copy(0.6, 52);
    (target, draft)
}

#[test]
fn trees_of_sampled_children_follow_the_target() -> Result<()> {
    let (target, draft) = pair();
    for (i, (name, cfg)) in settings()?.into_iter().enumerate() {
        let (c, accepted) =
            counts(&target, &draft, &cfg, (Children::Sampled(3), Children::Sampled(2)), Rule::Exact, 60 + i as u64)?;
        assert!(accepted > SAMPLES / 2, "{name}: the trees were hardly ever accepted ({accepted})");
        assert_fits(&format!("tree, sampled children, {name}"), &c, &exact_window(&target, &cfg, &PROMPT, 0, LEN));
    }
    Ok(())
}

#[test]
fn trees_of_top_k_children_follow_the_target() -> Result<()> {
    let (target, draft) = pair();
    for (i, (name, cfg)) in settings()?.into_iter().enumerate() {
        // Mixed: deterministic top-3 at the root, sampled pairs below.
        for (how, what) in [
            ((Children::TopK(3), Children::TopK(2)), "top-k"),
            ((Children::TopK(3), Children::Sampled(2)), "top-k over sampled"),
        ] {
            let (c, accepted) = counts(&target, &draft, &cfg, how, Rule::Exact, 70 + i as u64)?;
            assert!(accepted > SAMPLES / 2, "{what}, {name}: the trees were hardly ever accepted ({accepted})");
            assert_fits(&format!("tree, {what} children, {name}"), &c, &exact_window(&target, &cfg, &PROMPT, 0, LEN));
        }
    }
    Ok(())
}

#[test]
fn tree_power_naive_resampling_of_sampled_children_is_rejected() -> Result<()> {
    let (target, draft) = pair();
    let cfg = SamplingConfig::new(1.0)?;
    let (c, _) = counts(&target, &draft, &cfg, (Children::Sampled(3), Children::Sampled(2)), Rule::NaiveResample, 80)?;
    assert_rejects("tree, naive resampling", &c, &exact_window(&target, &cfg, &PROMPT, 0, LEN));
    Ok(())
}

/// Whole generations from the decoder drafting trees with `draft` follow the target.
fn decoder_follows_the_target<D: DraftModel + Clone>(
    what: &str,
    draft: &D,
    budget: TreeBudget,
    seed: u64,
) -> Result<()> {
    let (target, _) = pair();
    for (i, (name, cfg)) in settings()?.into_iter().enumerate() {
        let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
            .tree(TreePolicy::Always(budget))
            .sampling(cfg.clone().with_seed(seed + i as u64))
            .max_new_tokens(7)
            .build()?;
        let total =
            check_windows(&format!("decoder, {what} trees, {name}"), &mut dec, &target, &cfg, &PROMPT, 4, SAMPLES)?;
        assert!(
            total.accepted > SAMPLES / 2 && total.rejections > 0,
            "{what}, {name}: the trees were hardly ever accepted, or never rejected ({total:?})"
        );
    }
    Ok(())
}

#[test]
fn the_decoder_with_model_trees_follows_the_target() -> Result<()> {
    let (_, draft) = pair();
    // First children expanded (chain cost), then the best two per level (EAGLE-2).
    decoder_follows_the_target("model", &draft, "2x3x5".parse::<TreeBudget>()?, 90)?;
    decoder_follows_the_target("model, 2 expanded per level,", &draft, "3x3x8x2".parse::<TreeBudget>()?, 100)
}

/// Power near the detection limit of the decoder's tree battery (60,000 generations): the
/// target's rows nudged until the first window's law sits at twice the noncentrality the
/// test catches half the time (see `tests/exactness.rs`) must be rejected.
#[test]
fn the_decoder_tree_battery_rejects_a_law_just_past_its_detection_limit() -> Result<()> {
    let (target, draft) = pair();
    let cfg = SamplingConfig::new(1.0)?;
    let (nudged, eps, ratio) = nudged_past_the_limit(&target, &cfg, &PROMPT, 0, SAMPLES);
    assert!(ratio < 3.0 && eps < 0.05, "ε = {eps}, {ratio:.2} times the limit: not near the limit");
    let mut dec = SpeculativeDecoder::builder(Pair { target: nudged.clone(), draft })
        .tree(TreePolicy::Always("3x3x8x2".parse::<TreeBudget>()?))
        .sampling(cfg.clone().with_seed(120))
        .max_new_tokens(7)
        .build()?;
    let (counts, _) = window_counts(&mut dec, VOCAB, &PROMPT, 4, SAMPLES)?;
    assert_nudge_rejected("decoder, model trees", &counts[0], (&target, &nudged), &cfg, &PROMPT);
    Ok(())
}

#[test]
fn the_decoder_with_ngram_trees_follows_the_target() -> Result<()> {
    decoder_follows_the_target("n-gram", &NGramDraft::with_range(VOCAB, 1, 2)?, "3x3x8".parse::<TreeBudget>()?, 95)
}

/// A target whose tree call ignores the tree and scores its tokens as one chain: the attention
/// mask bug a tree engine can have. The decoder statistic must catch it.
#[derive(Clone)]
struct MaskIgnored(MarkovModel);

impl specdec::TokenModel for MaskIgnored {
    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn context_len(&self) -> usize {
        self.0.context().len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        specdec::TokenModel::truncate(&mut self.0, len)
    }
}

impl specdec::TargetModel for MaskIgnored {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<specdec::Logits> {
        self.0.forward(tokens, rows)
    }

    fn forward_tree(&mut self, tokens: &[u32], _tree: &specdec::TreeShape) -> Result<specdec::Logits> {
        let base = self.0.context().len();
        let rows = self.0.forward(tokens, tokens.len());
        specdec::TokenModel::truncate(&mut self.0, base)?;
        rows
    }
}

#[test]
fn decoder_power_a_tree_call_without_its_mask_is_rejected() -> Result<()> {
    let (target, draft) = pair();
    let cfg = SamplingConfig::new(1.0)?;
    let mut dec = SpeculativeDecoder::builder(Pair { target: MaskIgnored(target.clone()), draft })
        .tree(TreePolicy::Always("3x3x8".parse::<TreeBudget>()?))
        .sampling(cfg.clone().with_seed(99))
        .max_new_tokens(LEN)
        .build()?;
    let mut c = vec![0u64; VOCAB.pow(LEN as u32)];
    for _ in 0..SAMPLES {
        c[cell(&dec.generate(&PROMPT)?.tokens, 0, LEN, VOCAB)] += 1;
    }
    assert_rejects("decoder, tree call without its mask", &c, &exact_window(&target, &cfg, &PROMPT, 0, LEN));
    Ok(())
}

/// Draws one child from the draft row but keeps it only when the draw was likely: a draw
/// whose presence in the tree depends on its own value (the pruning mistake `expand_tree`
/// avoids by ranking a sampled node by its parent's score).
#[derive(Clone)]
struct KeepsLikelyDraws(MarkovModel);

impl TokenModel for KeepsLikelyDraws {
    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn context_len(&self) -> usize {
        self.0.context().len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        TokenModel::truncate(&mut self.0, len)
    }
}

impl DraftModel for KeepsLikelyDraws {
    fn propose(&mut self, tokens: &[u32]) -> Result<specdec::Proposal> {
        DraftModel::propose(&mut self.0, tokens)
    }

    fn propose_tree(
        &mut self,
        tokens: &[u32],
        _: TreeBudget,
        picker: &mut specdec::tree::ChildPicker,
    ) -> Result<specdec::DraftTree> {
        let mut tree = specdec::DraftTree::new();
        if let specdec::Proposal::Logits(row) = DraftModel::propose(&mut self.0, tokens)? {
            if let Some(specdec::tree::Child { token, logp, row: Some(q) }) = picker.pick(&row, 1, 0)?.pop() {
                if logp > 0.3f32.ln() {
                    tree.push_sampled(token, None, q)?;
                }
            }
        }
        Ok(tree)
    }
}

#[test]
fn decoder_power_a_draw_kept_by_its_own_value_is_rejected() -> Result<()> {
    let (target, draft) = pair();
    let cfg = SamplingConfig::new(1.0)?;
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: KeepsLikelyDraws(draft) })
        .tree(TreePolicy::Always("1x1x1".parse::<TreeBudget>()?))
        .sampling(cfg.clone().with_seed(98))
        .max_new_tokens(LEN)
        .build()?;
    let mut c = vec![0u64; VOCAB.pow(LEN as u32)];
    for _ in 0..SAMPLES {
        c[cell(&dec.generate(&PROMPT)?.tokens, 0, LEN, VOCAB)] += 1;
    }
    assert_rejects("decoder, draws kept by their own value", &c, &exact_window(&target, &cfg, &PROMPT, 0, LEN));
    Ok(())
}
