//! Tree verification in the engines: a tree of tokens scored in one call gives, along every
//! root-to-leaf path, the logits a sequential forward of that path gives (on the native engine
//! bit for bit, so that a tree's values, logprobs included, are plain decoding's); keeping a
//! path leaves the cache as a fresh run over the accepted tokens would. Both engines, both
//! real models.

mod common;

use candle_core::Device;
use common::models::{model_path, SMOLLM2, STORIES};
use specdec::tree::TreeShape;
use specdec::TokenModel;
use specdec::{Engine, Llama, Logits, ModelFiles, Result, TargetModel, WeightFormat};

/// max |a − b| / max |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Token i + 1 hangs under `PARENTS[i]`: two branches at the root, a split below each.
const PARENTS: [usize; 7] = [0, 0, 1, 1, 2, 3, 5];
const TOKENS: [u32; 8] = [10, 11, 12, 13, 14, 15, 16, 17];

/// The tree's root-to-leaf paths (token indices).
fn paths(tree: &TreeShape) -> Vec<Vec<usize>> {
    let n = tree.len();
    let leaves = (0..n).filter(|i| !PARENTS.contains(i));
    leaves.map(|leaf| (0..=leaf).filter(|&j| tree.sees(leaf)[j]).collect()).collect()
}

#[test]
fn tree_rows_equal_sequential_paths_and_kept_paths_equal_fresh_runs() -> Result<()> {
    let tree = TreeShape::new(&PARENTS)?;
    for name in [STORIES, SMOLLM2] {
        let Some(path) = model_path(name) else { continue };
        for engine in [Engine::Native, Engine::Candle] {
            let (w, tok) = ModelFiles::Gguf(path.clone()).load_with(WeightFormat::F32, &Device::Cpu, engine)?;
            let prompt = tok.encode("Once upon a time, there was")?;
            let mut model = Llama::new(w.clone())?;
            model.forward(&prompt, 0)?;
            let rows = model.forward_tree(&TOKENS, &tree)?;
            // The native engine's rows do not depend on the call's shape; candle's may differ
            // by rounding.
            let tolerance = |loose: f32| if engine == Engine::Native { 0.0 } else { loose };
            for p in paths(&tree) {
                let toks: Vec<u32> = p.iter().map(|&i| TOKENS[i]).collect();
                let mut fresh = Llama::new(w.clone())?;
                fresh.forward(&prompt, 0)?;
                let want = fresh.forward(&toks, toks.len())?;
                for (j, &i) in p.iter().enumerate() {
                    let d = rel_diff(rows.row(i), want.row(j));
                    assert!(d <= tolerance(1e-4), "{name} {engine:?}: path {p:?}, token {i}: relative difference {d}");
                }
            }
            // Keep the path to the deepest leaf, then step once: as if the path had been fed.
            let kept = paths(&tree).into_iter().max_by_key(Vec::len).expect("a path");
            model.keep_tree_path(&kept)?;
            assert_eq!(model.context_len(), prompt.len() + kept.len());
            let next = model.forward(&[20, 21], 2)?;
            let mut fresh = Llama::new(w)?;
            let mut all = prompt.clone();
            all.extend(kept.iter().map(|&i| TOKENS[i]));
            fresh.forward(&all, 0)?;
            let want = fresh.forward(&[20, 21], 2)?;
            let d = rel_diff(next.as_slice(), want.as_slice());
            assert!(d <= tolerance(1e-5), "{name} {engine:?}: after keep_path, relative difference {d}");
        }
    }
    Ok(())
}

#[test]
fn misused_trees_are_typed_errors() -> Result<()> {
    assert!(TreeShape::new(&[1]).is_err(), "a parent after its child");
    let Some(path) = model_path(STORIES) else { return Ok(()) };
    let (w, _) = ModelFiles::Gguf(path).load(WeightFormat::F32, &Device::Cpu)?;
    let mut model = Llama::new(w)?;
    model.forward(&[1, 2, 3], 0)?;
    let tree = TreeShape::new(&[0, 0])?;
    assert!(model.keep_tree_path(&[0]).is_err(), "no tree call before");
    assert!(model.forward_tree(&[4, 5], &tree).is_err(), "a tree of another size");
    model.forward_tree(&[4, 5, 6], &tree)?;
    assert!(model.keep_tree_path(&[0, 1, 2]).is_err(), "siblings are not a path");
    assert!(model.keep_tree_path(&[0, 2]).is_err(), "the tree is gone after a failed keep");
    model.forward_tree(&[4, 5, 6], &tree)?;
    assert!(model.keep_tree_path(&[1]).is_err(), "a path starts at the root");
    model.forward_tree(&[4, 5, 6], &tree)?;
    model.keep_tree_path(&[0, 2])?;
    assert_eq!(model.context_len(), 5);
    Ok(())
}

/// A model with only `forward` and `truncate`: it gets the trait's path-by-path tree call.
struct PathByPath(Llama);

impl TokenModel for PathByPath {
    fn vocab_size(&self) -> usize {
        self.0.config().vocab_size
    }

    fn context_len(&self) -> usize {
        self.0.context_len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.0.truncate(len)
    }
}

impl TargetModel for PathByPath {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        self.0.forward(tokens, rows)
    }
}

#[test]
fn the_default_tree_call_scores_path_by_path_like_the_masked_one() -> Result<()> {
    let Some(path) = model_path(STORIES) else { return Ok(()) };
    let (w, _) = ModelFiles::Gguf(path).load(WeightFormat::F32, &Device::Cpu)?;
    let tree = TreeShape::new(&PARENTS)?;
    let (mut masked, mut plain) = (Llama::new(w.clone())?, PathByPath(Llama::new(w)?));
    masked.forward(&[1, 2, 3], 0)?;
    plain.forward(&[1, 2, 3], 0)?;
    let (a, b) = (TargetModel::forward_tree(&mut masked, &TOKENS, &tree)?, plain.forward_tree(&TOKENS, &tree)?);
    assert!(rel_diff(a.as_slice(), b.as_slice()) <= 1e-4);
    assert_eq!(plain.context_len(), 3, "the default call rolls back");
    TargetModel::keep_path(&mut masked, &TOKENS, &[0, 2, 5])?;
    plain.keep_path(&TOKENS, &[0, 2, 5])?;
    let (a, b) = (masked.forward(&[9], 1)?, plain.forward(&[9], 1)?);
    assert!(rel_diff(a.as_slice(), b.as_slice()) <= 1e-5);
    assert!(plain.keep_path(&TOKENS, &[0, 99]).is_err(), "an index outside the tree");
    Ok(())
}
