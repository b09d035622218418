//! What one drafted token costs an EAGLE head at several context lengths: the target reads a
//! context of N tokens (recording the states the head reads), the head absorbs it, then drafts
//! chains of `--chain` tokens from its own guesses, rolled back after each, and the time per
//! drafted token is printed per run. A head whose cache grows in place drafts as fast at
//! N = 1,000 as at N = 100, but for attention's own O(N) reads.
//!
//! `cargo run --release --example head_context -- --contexts 100,1000 --runs 5`

use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::Device;
use clap::Parser;
use specdec::heads::{EagleVersion, HeadDraft};
use specdec::{DraftModel, Llama, ModelFiles, Proposal, TargetModel, TokenModel, WeightFormat};

#[derive(Parser)]
struct Args {
    /// The target: a .gguf file or an HF folder.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/models-cache/SmolLM2-135M-Instruct.Q4_1.gguf"))]
    target: String,
    /// An EAGLE-1 head for it (`scripts/train-heads.sh --short` writes this one).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/models-cache/heads-short/eagle"))]
    head: String,
    /// Context lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    contexts: Vec<usize>,
    /// Timed runs per context.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Chains drafted per run.
    #[arg(long, default_value_t = 16)]
    chains: usize,
    /// Tokens per chain.
    #[arg(long, default_value_t = 8)]
    chain: usize,
}

/// A context of `n` tokens: a paragraph of text, repeated.
fn context(files: &ModelFiles, n: usize) -> Result<Vec<u32>> {
    let (_, tok) = files.load(WeightFormat::Stored, &Device::Cpu)?;
    let text = "The lighthouse keeper climbed the stairs each evening, counting the steps, \
                and watched the ships pass the rocks under a sky that changed with the seasons. ";
    let ids = tok.encode(text)?;
    Ok(ids.iter().copied().cycle().take(n).collect())
}

fn best(row: &[f32]) -> u32 {
    (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap_or(0) as u32
}

/// Milliseconds per drafted token of each run, after a context of `n` tokens.
fn measure(files: &ModelFiles, args: &Args, n: usize) -> Result<Vec<f64>> {
    let device = Device::Cpu;
    let (weights, _) = files.load(WeightFormat::Stored, &device)?;
    let mut target = Llama::new(weights)?;
    let mut draft = HeadDraft::eagle(&args.head, EagleVersion::One, &mut target, &device)?;
    let tokens = context(files, n)?;
    target.forward(&tokens, 1)?;
    let Proposal::Logits(row) = draft.propose(&tokens)? else { anyhow::bail!("no proposal after the context") };
    let held = draft.context_len();
    let mut times = Vec::with_capacity(args.runs);
    // One untimed run warms the caches up.
    for run in 0..=args.runs {
        let start = Instant::now();
        for _ in 0..args.chains {
            let mut last = row.clone();
            for _ in 0..args.chain {
                let Proposal::Logits(next) = draft.propose(&[best(&last)])? else { anyhow::bail!("no proposal") };
                last = next;
            }
            // Back to the context: the head keeps the positions it computed from the target's
            // states, so the next chain drafts the same tokens at the same cost.
            draft.truncate(held)?;
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / (args.chains * args.chain) as f64;
        if run > 0 {
            times.push(ms);
        }
    }
    Ok(times)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let files = ModelFiles::resolve(&args.target).context("the target")?;
    let mut medians = Vec::new();
    for &n in &args.contexts {
        let mut times = measure(&files, &args, n)?;
        let shown: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
        times.sort_by(f64::total_cmp);
        let (least, median) = (times[0], times[times.len() / 2]);
        println!(
            "context {n:>6}: {median:.3} ms per drafted token (median), {least:.3} (least); runs: {}",
            shown.join(", ")
        );
        medians.push(median);
    }
    if let (Some(first), Some(last)) = (medians.first(), medians.last()) {
        println!(
            "{:.2}x the cost per drafted token at context {} as at {}; {:.0} drafted tokens/s at {}",
            last / first,
            args.contexts.last().copied().unwrap_or(0),
            args.contexts.first().copied().unwrap_or(0),
            1e3 / last,
            args.contexts.last().copied().unwrap_or(0),
        );
    }
    Ok(())
}
