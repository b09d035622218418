//! `--batch 1,2,4,8,16`: per batch size, throughput (tokens/s over all sequences) and mean
//! per-sequence latency of batched plain decoding, speculation with each fixed k, and the
//! adaptive batch policy, all on the same target in the same run; the crossover batch size
//! where fixed-k speculation stops paying; and an SVG chart of throughput against batch size.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use serde_json::json;
use specdec::adaptive::CostModel;
use specdec::batch::{BatchDecoder, Request, MAX_ROWS};
use specdec::{
    KPolicy, Llama, LlamaWeights, Pair, PlainDecoder, SamplingConfig, SpeculativeDecoder, Stats, TargetModel,
};

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
    /// 0 for greedy decoding; otherwise sequence i samples at this temperature with seed i.
    pub temperature: f64,
    /// The chart's title: the models.
    pub title: String,
}

impl Plan<'_> {
    /// The sampling of sequence `i`.
    fn sampling(&self, i: usize) -> Result<SamplingConfig> {
        Ok(match self.temperature {
            0.0 => SamplingConfig::greedy(),
            t => SamplingConfig::new(t as f32)?.with_seed(1000 + i as u64),
        })
    }
}

/// One (batch size, policy) run.
struct Measure {
    /// Tokens per second of decoding: from the first step on (a draft's catch-up on its
    /// prompt counts, the target's prefill as sequences join does not).
    tok_s: f64,
    /// Tokens per second from before the first sequence joined (all prefill included).
    tok_s_all: f64,
    /// Seconds from before the first sequence joined to each sequence's end, the mean.
    latency_s: f64,
    stats: Stats,
}

pub fn run(target: &Arc<LlamaWeights>, draft: &Arc<LlamaWeights>, plan: &Plan) -> Result<()> {
    println!("{}", specdec::cpu::kernels());
    let start = Instant::now();
    let mut probe = Llama::new(target.clone())?;
    probe.forward(&plan.prompts[0], 0)?;
    let mut costs = CostModel::measure(&mut probe, plan.prompts[0][0], MAX_ROWS)?;
    // What a server measures when it starts (a draft call among them), so that no run's first
    // round measures the draft by drafting: each run below starts a new decoder.
    costs.merge(CostModel::warm(&mut probe, &mut Llama::new(draft.clone())?)?);
    let t1 = costs.target_secs(1).unwrap_or(f64::NAN);
    println!("T(m), the target pass over m rows, measured once in {:.1} s:", start.elapsed().as_secs_f64());
    for m in [1, 2, 4, 8, 16, 32, 64, 128] {
        let t = costs.target_secs(m).unwrap_or(f64::NAN);
        println!("  m {m:>3}: {:>7.1} ms  T(m)/T(1) {:>5.2}  ms per row {:>5.2}", t * 1e3, t / t1, t * 1e3 / m as f64);
    }
    measure(target, draft, plan, 2, KPolicy::Plain, &costs)?; // warm-up
    let mut policies = vec![KPolicy::Plain];
    policies.extend(plan.ks.iter().map(|&k| KPolicy::Fixed(k)));
    policies.push(KPolicy::Adaptive { max: plan.max_k });
    println!(
        "{:>5} {:<14} {:>9} {:>8} {:>10} {:>8} {:>10} {:>11} {:>7} {:>6} {:>9}",
        "batch",
        "policy",
        "tok/s",
        "xplain",
        "tok/s all",
        "xplain",
        "latency s",
        "ms/tok/seq",
        "mean k",
        "alpha",
        "tok/step"
    );
    let mut table: Vec<(usize, KPolicy, Measure)> = Vec::new();
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
        let mut plain = (0.0, 0.0);
        for (&policy, runs) in policies.iter().zip(runs) {
            let m = mean_of(runs);
            if policy == KPolicy::Plain {
                plain = (m.tok_s, m.tok_s_all);
            }
            println!(
                "{b:>5} {:<14} {:>9.1} {:>8.2} {:>10.1} {:>8.2} {:>10.2} {:>11.1} {:>7.2} {:>6.3} {:>9.2}",
                name(policy),
                m.tok_s,
                m.tok_s / plain.0,
                m.tok_s_all,
                m.tok_s_all / plain.1,
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
    let mean = |f: fn(&Measure) -> f64| runs.iter().map(f).sum::<f64>() / n;
    let (tok_s, tok_s_all, latency_s) = (mean(|m| m.tok_s), mean(|m| m.tok_s_all), mean(|m| m.latency_s));
    let stats = runs.into_iter().fold(Stats::default(), |mut total, m| {
        total += &m.stats;
        total
    });
    Measure { tok_s, tok_s_all, latency_s, stats }
}

fn name(p: KPolicy) -> String {
    match p {
        KPolicy::Plain => "plain".into(),
        KPolicy::Fixed(k) => format!("fixed k={k}"),
        KPolicy::Adaptive { max: max_k } => format!("adaptive<={max_k}"),
        p => p.to_string(),
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
    policy: KPolicy,
    costs: &CostModel,
) -> Result<Measure> {
    let start = Instant::now();
    let mut batch = BatchDecoder::with_costs(policy, costs.clone())?;
    for i in 0..b {
        let prompt = plan.prompts[i % plan.prompts.len()].clone();
        batch.add(
            Pair { target: Llama::new(target.clone())?, draft: Llama::new(draft.clone())? },
            Request::new(prompt).sampling(plan.sampling(i)?).max_new_tokens(plan.tokens),
        )?;
    }
    let joined = Instant::now();
    let (mut latencies, mut stats, mut tokens) = (Vec::new(), Stats::default(), 0);
    while batch.active() > 0 {
        batch.step()?;
        for f in batch.take_finished() {
            latencies.push(start.elapsed().as_secs_f64());
            tokens += f.generation.tokens.len();
            stats += &f.generation.stats;
        }
    }
    let (wall, decode) = (start.elapsed().as_secs_f64(), joined.elapsed().as_secs_f64());
    if std::env::var_os("SPEC_BENCH_DEBUG").is_some() {
        eprintln!("{b} {policy:?}: {:?}", batch.costs());
    }
    let latency_s = latencies.iter().sum::<f64>() / b as f64;
    Ok(Measure { tok_s: tokens as f64 / decode, tok_s_all: tokens as f64 / wall, latency_s, stats })
}

/// Batch 1 against the single-sequence decoders on the same prompt: plain and adaptive
/// speculation, tokens/s of decoding and with prefill (as the batch rows count them), the mean
/// of `plan.repeats` runs each, alternating.
fn single_sequence(target: &Arc<LlamaWeights>, draft: &Arc<LlamaWeights>, plan: &Plan) -> Result<[f64; 4]> {
    let mut plain = PlainDecoder::new(Llama::new(target.clone())?, plan.sampling(0)?).max_new_tokens(plan.tokens);
    let mut spec =
        SpeculativeDecoder::builder(Pair { target: Llama::new(target.clone())?, draft: Llama::new(draft.clone())? })
            .k_policy(KPolicy::default())
            .sampling(plan.sampling(0)?)
            .max_new_tokens(plan.tokens)
            .build()?;
    let rates = |s: &Stats| [s.tokens_per_sec(), s.new_tokens as f64 / (s.decode_secs + s.prefill_secs).max(1e-9)];
    let mut sum = [0.0; 4];
    for _ in 0..plan.repeats.max(1) {
        let (p, s) = (rates(&plain.generate(&plan.prompts[0])?.stats), rates(&spec.generate(&plan.prompts[0])?.stats));
        for (total, x) in sum.iter_mut().zip([p[0], s[0], p[1], s[1]]) {
            *total += x / plan.repeats.max(1) as f64;
        }
    }
    Ok(sum)
}

/// The numbers the issue asks for, the crossover, the chart and the JSON line.
fn summary(plan: &Plan, policies: &[KPolicy], table: &[(usize, KPolicy, Measure)], single: [f64; 4]) -> Result<()> {
    let tok_s = |b: usize, p: KPolicy| table.iter().find(|r| r.0 == b && r.1 == p).map_or(0.0, |r| r.2.tok_s);
    let tok_s_all = |b: usize, p: KPolicy| table.iter().find(|r| r.0 == b && r.1 == p).map_or(0.0, |r| r.2.tok_s_all);
    println!("adaptive against the best of plain and each fixed k, per batch size (decoding; with prefill):");
    for &b in &plan.sizes {
        let others = policies.iter().filter(|p| !matches!(p, KPolicy::Adaptive { .. }));
        let best = others.clone().map(|&p| tok_s(b, p)).fold(0.0, f64::max);
        let best_all = others.map(|&p| tok_s_all(b, p)).fold(0.0, f64::max);
        let adaptive = KPolicy::Adaptive { max: plan.max_k };
        let (a, a_all) = (tok_s(b, adaptive), tok_s_all(b, adaptive));
        println!(
            "  batch {b:>3}: adaptive {a:.1} tok/s = {:.3} x best {best:.1}; with prefill {a_all:.1} = {:.3} x {best_all:.1}",
            a / best,
            a_all / best_all
        );
    }
    for &k in &plan.ks {
        let cross = plan.sizes.iter().find(|&&b| tok_s(b, KPolicy::Fixed(k)) < tok_s(b, KPolicy::Plain));
        match cross {
            Some(b) => println!("fixed k={k} stops paying at batch {b} (slower than plain batched decoding)"),
            None => println!("fixed k={k} pays at every batch size measured"),
        }
    }
    let (p1, p8) = (tok_s(1, KPolicy::Plain), tok_s(8, KPolicy::Plain));
    if p1 > 0.0 && p8 > 0.0 {
        let ratio_all = tok_s_all(8, KPolicy::Plain) / tok_s_all(1, KPolicy::Plain);
        println!("plain throughput, batch 8 over batch 1: {:.2}x decoding, {ratio_all:.2}x with prefill", p8 / p1);
    }
    let adaptive = KPolicy::Adaptive { max: plan.max_k };
    println!(
        "single-sequence decoders, same prompt: plain {:.1} tok/s, adaptive speculation {:.1} ({:.1} and {:.1} with prefill); batch 1 adaptive {:.1} ({:.1} with prefill)",
        single[0],
        single[1],
        single[2],
        single[3],
        tok_s(1, adaptive),
        tok_s_all(1, adaptive)
    );
    let latency = |b: usize, p: KPolicy| table.iter().find(|r| r.0 == b && r.1 == p).map_or(0.0, |r| r.2.latency_s);
    let series = |value: &dyn Fn(usize, KPolicy) -> f64| -> Vec<Series> {
        let line = |&p: &KPolicy| Series {
            name: name(p),
            points: plan.sizes.iter().map(|&b| (b as f64, value(b, p))).collect(),
            dashed: false,
        };
        policies.iter().map(line).collect()
    };
    if let Some(dir) = std::path::Path::new(&plan.svg).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let kernels = specdec::cpu::kernels().to_string();
    let cpu = kernels.rsplit_once('(').map_or("", |(_, c)| c.trim_end_matches(')'));
    let title = format!("{}, {} tokens/sequence, temperature {}; {cpu}", plan.title, plan.tokens, plan.temperature);
    line_chart(&plan.svg, &title, "batch size", "tokens/s decoding, all sequences", &series(&tok_s), true)?;
    let latency_svg = plan.svg.replace(".svg", "-latency.svg");
    line_chart(&latency_svg, &title, "batch size", "seconds per sequence (mean)", &series(&latency), true)?;
    println!("wrote {} and {latency_svg}", plan.svg);
    if plan.json {
        let rows: Vec<_> = table
            .iter()
            .map(|(b, p, m)| {
                json!({"batch": b, "policy": name(*p), "tok_s": m.tok_s, "tok_s_with_prefill": m.tok_s_all, "latency_s": m.latency_s,
                       "mean_k": m.stats.mean_k(), "alpha": m.stats.position_acceptance(),
                       "tokens_per_call": m.stats.tokens_per_target_call()})
            })
            .collect();
        let head = json!({"kernels": specdec::cpu::kernels().to_string(), "models": plan.title, "temperature": plan.temperature});
        println!("{}", json!({"run": head, "single": single, "rows": rows}));
    }
    Ok(())
}
