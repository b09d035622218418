//! `--batch 1,2,4,8,16`: per batch size, throughput (tokens/s over all sequences) and mean
//! per-sequence latency of batched plain decoding, speculation with each fixed k, and the
//! adaptive batch policy, all on the same target in the same run; the crossover batch size
//! where fixed-k speculation stops paying; and an SVG chart of throughput against batch size.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use serde_json::json;
use specdec::batch::{BatchCosts, BatchDecoder, BatchPolicy, Request, MAX_ROWS};
use specdec::{KPolicy, Llama, LlamaWeights, PlainDecoder, SamplingConfig, SpeculativeDecoder, Stats, TargetModel};

use crate::chart::{line_chart, Series};

/// What the batch mode measures.
pub struct Plan<'a> {
    pub sizes: Vec<usize>,
    pub ks: Vec<usize>,
    pub max_k: usize,
    pub tokens: usize,
    pub repeats: usize,
    pub prompts: &'a [Vec<u32>],
    pub svg: String,
    pub json: bool,
}

/// One (batch size, policy) run.
struct Measure {
    tok_s: f64,
    latency_s: f64,
    stats: Stats,
}

pub fn run(target: &Arc<LlamaWeights>, draft: &Arc<LlamaWeights>, plan: &Plan) -> Result<()> {
    println!("{}", specdec::cpu::kernels());
    let start = Instant::now();
    let mut probe = Llama::new(target.clone())?;
    probe.forward(&plan.prompts[0], 0)?;
    let costs = BatchCosts::measure(&mut probe, plan.prompts[0][0], MAX_ROWS)?;
    let t1 = costs.target_secs(1).unwrap_or(f64::NAN);
    println!("T(m), the target pass over m rows, measured once in {:.1} s:", start.elapsed().as_secs_f64());
    for m in [1, 2, 4, 8, 16, 32, 64, 128] {
        let t = costs.target_secs(m).unwrap_or(f64::NAN);
        println!("  m {m:>3}: {:>7.1} ms  T(m)/T(1) {:>5.2}  ms per row {:>5.2}", t * 1e3, t / t1, t * 1e3 / m as f64);
    }
    measure(target, draft, plan, 2, BatchPolicy::Plain, &costs)?; // warm-up
    let mut policies = vec![BatchPolicy::Plain];
    policies.extend(plan.ks.iter().map(|&k| BatchPolicy::Fixed(k)));
    policies.push(BatchPolicy::Adaptive { max_k: plan.max_k });
    println!(
        "{:>5} {:<14} {:>9} {:>8} {:>10} {:>11} {:>7} {:>6} {:>9}",
        "batch", "policy", "tok/s", "xplain", "latency s", "ms/tok/seq", "mean k", "alpha", "tok/step"
    );
    let mut table: Vec<(usize, BatchPolicy, Measure)> = Vec::new();
    for &b in &plan.sizes {
        // The policies take turns, `repeats` times, so that the machine's drifting speed
        // touches them alike; each row is their mean.
        let mut runs: Vec<Vec<Measure>> = policies.iter().map(|_| Vec::new()).collect();
        for r in 0..plan.repeats.max(1) {
            // Each repeat starts at another policy, so that none always runs first.
            for i in (0..policies.len()).map(|i| (i + r) % policies.len()) {
                runs[i].push(measure(target, draft, plan, b, policies[i], &costs)?);
            }
        }
        let mut plain_tok_s = 0.0;
        for (&policy, runs) in policies.iter().zip(runs) {
            let m = mean_of(runs);
            if policy == BatchPolicy::Plain {
                plain_tok_s = m.tok_s;
            }
            println!(
                "{b:>5} {:<14} {:>9.1} {:>8.2} {:>10.2} {:>11.1} {:>7.2} {:>6.3} {:>9.2}",
                name(policy),
                m.tok_s,
                m.tok_s / plain_tok_s,
                m.latency_s,
                m.latency_s * 1e3 / plan.tokens as f64,
                m.stats.mean_k(),
                m.stats.position_acceptance(),
                m.stats.tokens_per_target_call()
            );
            table.push((b, policy, m));
        }
    }
    let single = single_sequence(target, draft, plan)?;
    summary(plan, &policies, &table, single)?;
    Ok(())
}

/// The mean throughput and latency of several runs, their statistics summed.
fn mean_of(runs: Vec<Measure>) -> Measure {
    let n = runs.len().max(1) as f64;
    let (tok_s, latency_s) =
        (runs.iter().map(|m| m.tok_s).sum::<f64>() / n, runs.iter().map(|m| m.latency_s).sum::<f64>() / n);
    let stats = runs.into_iter().fold(Stats::default(), |mut total, m| {
        total += &m.stats;
        total
    });
    Measure { tok_s, latency_s, stats }
}

fn name(p: BatchPolicy) -> String {
    match p {
        BatchPolicy::Plain => "plain".into(),
        BatchPolicy::Fixed(k) => format!("fixed k={k}"),
        BatchPolicy::Adaptive { max_k } => format!("adaptive<={max_k}"),
    }
}

/// Decodes `b` sequences (the prompts cycled), `plan.tokens` each, with no stop token; the
/// times include the prompts' prefill (the target's as each joins, the draft's when it first
/// drafts).
fn measure(
    target: &Arc<LlamaWeights>,
    draft: &Arc<LlamaWeights>,
    plan: &Plan,
    b: usize,
    policy: BatchPolicy,
    costs: &BatchCosts,
) -> Result<Measure> {
    let start = Instant::now();
    let mut batch = BatchDecoder::with_costs(policy, costs.clone())?;
    for i in 0..b {
        let prompt = plan.prompts[i % plan.prompts.len()].clone();
        batch.add(
            Llama::new(draft.clone())?,
            Llama::new(target.clone())?,
            Request::new(prompt).max_new_tokens(plan.tokens),
        )?;
    }
    let (mut latencies, mut stats, mut tokens) = (Vec::new(), Stats::default(), 0);
    while batch.active() > 0 {
        batch.step()?;
        for f in batch.take_finished() {
            latencies.push(start.elapsed().as_secs_f64());
            tokens += f.generation.tokens.len();
            stats += &f.generation.stats;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    if std::env::var_os("SPEC_BENCH_DEBUG").is_some() {
        eprintln!("{b} {policy:?}: {:?}", batch.costs());
    }
    Ok(Measure { tok_s: tokens as f64 / wall, latency_s: latencies.iter().sum::<f64>() / b as f64, stats })
}

/// Batch 1 against the single-sequence decoders: plain and adaptive speculation, tokens/s.
fn single_sequence(target: &Arc<LlamaWeights>, draft: &Arc<LlamaWeights>, plan: &Plan) -> Result<(f64, f64)> {
    let mut plain =
        PlainDecoder::new(Llama::new(target.clone())?, SamplingConfig::greedy()).max_new_tokens(plan.tokens);
    let mut spec = SpeculativeDecoder::builder(Llama::new(draft.clone())?, Llama::new(target.clone())?)
        .k_policy(KPolicy::default())
        .max_new_tokens(plan.tokens)
        .build()?;
    let (p, s) = (plain.generate(&plan.prompts[0])?, spec.generate(&plan.prompts[0])?);
    Ok((p.stats.tokens_per_sec(), s.stats.tokens_per_sec()))
}

/// The numbers the issue asks for, the crossover, the chart and the JSON line.
fn summary(
    plan: &Plan,
    policies: &[BatchPolicy],
    table: &[(usize, BatchPolicy, Measure)],
    single: (f64, f64),
) -> Result<()> {
    let tok_s = |b: usize, p: BatchPolicy| table.iter().find(|r| r.0 == b && r.1 == p).map_or(0.0, |r| r.2.tok_s);
    println!("adaptive against the best of plain and each fixed k, per batch size:");
    for &b in &plan.sizes {
        let best = policies.iter().filter(|p| !matches!(p, BatchPolicy::Adaptive { .. })).map(|&p| tok_s(b, p));
        let best = best.fold(0.0, f64::max);
        let adaptive = tok_s(b, BatchPolicy::Adaptive { max_k: plan.max_k });
        println!("  batch {b:>3}: adaptive {adaptive:.1} tok/s = {:.3} x best {best:.1}", adaptive / best);
    }
    for &k in &plan.ks {
        let cross = plan.sizes.iter().find(|&&b| tok_s(b, BatchPolicy::Fixed(k)) < tok_s(b, BatchPolicy::Plain));
        match cross {
            Some(b) => println!("fixed k={k} stops paying at batch {b} (slower than plain batched decoding)"),
            None => println!("fixed k={k} pays at every batch size measured"),
        }
    }
    let (p1, p8) = (tok_s(1, BatchPolicy::Plain), tok_s(8, BatchPolicy::Plain));
    if p1 > 0.0 && p8 > 0.0 {
        println!("plain throughput, batch 8 over batch 1: {:.2}x", p8 / p1);
    }
    println!(
        "single-sequence decoders, same prompt: plain {:.1} tok/s, adaptive speculation {:.1} tok/s; batch 1 adaptive {:.1} tok/s",
        single.0,
        single.1,
        tok_s(1, BatchPolicy::Adaptive { max_k: plan.max_k })
    );
    let series: Vec<Series> = policies
        .iter()
        .map(|&p| Series {
            name: name(p),
            points: plan.sizes.iter().map(|&b| (b as f64, tok_s(b, p))).collect(),
            dashed: false,
        })
        .collect();
    if let Some(dir) = std::path::Path::new(&plan.svg).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let title = format!("SmolLM2-135M f32 target, Q4_1 draft, {} tokens per sequence", plan.tokens);
    line_chart(&plan.svg, &title, "batch size", "tokens/s, all sequences", &series, true)?;
    println!("wrote {}", plan.svg);
    if plan.json {
        let rows: Vec<_> = table
            .iter()
            .map(|(b, p, m)| {
                json!({"batch": b, "policy": name(*p), "tok_s": m.tok_s, "latency_s": m.latency_s,
                       "mean_k": m.stats.mean_k(), "alpha": m.stats.position_acceptance(),
                       "tokens_per_call": m.stats.tokens_per_target_call()})
            })
            .collect();
        println!("{}", json!({"kernels": specdec::cpu::kernels().to_string(), "single": single, "rows": rows}));
    }
    Ok(())
}
