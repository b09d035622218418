//! The performance report: for each drafter and k, acceptance, tokens per target call, the cost
//! ratios c (draft call / target call) and v (verification call / one-token call), plain and
//! speculative tokens per second on the same target in the same run, the measured speedup and
//! the seed's predictions S(k, α, c) and S with v, plus resident memory.
//!
//! `cargo run --release --example spec_bench -- --json` (after `scripts/fetch-models.sh`);
//! chains against trees: `-- --drafters model,ngram --ks auto --trees none,2x5x12,auto --formats ''`;
//! batches: `-- --batch 1,2,4,8,16` (see `batch.rs`).

mod batch;
#[path = "../support/chart.rs"]
mod chart;
mod workload;

use specdec::TokenModel;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;
use specdec::grammar::{Grammar, GrammarVocab};
use specdec::sampling::{argmax, ProcessorFactory};
use specdec::stats::{predicted_speedup, predicted_speedup_with_verify};
use specdec::{
    Drafter, DrafterSpec, Generation, KPolicy, Llama, LlamaWeights, Logits, ModelFiles, Pair, PlainDecoder,
    SamplingConfig, SpeculativeDecoder, Stats, TargetModel, Tokenizer, TreePolicy, WeightFormat,
};

#[derive(Parser)]
pub struct Args {
    /// Target model (.gguf, HF folder or hub id hf:org/name); default: the fetched SmolLM2-135M-Instruct.
    #[arg(long)]
    target: Option<String>,
    /// Weight format of the target: f32 (the exact reference) or stored (a quantized file as
    /// users run it).
    #[arg(long, default_value = "f32")]
    target_format: String,
    /// Token ids a model draft with a large vocabulary scores: N (its first N, with the
    /// special tokens) or all. Default: 65536, for vocabularies of more than 1.5 times as many.
    #[arg(long)]
    draft_vocab: Option<String>,
    /// Drafters, comma-separated: model[:PATH[@FORMAT]] (a draft file's weights compact unless
    /// FORMAT says otherwise, e.g. @stored), ngram, layerskip:N, quant:TYPE, draft heads
    /// eagle:PATH, eagle3:PATH, medusa:PATH (scripts/train-heads.sh trains them), and models
    /// with another tokenizer cross:text:PATH, cross:intersection:PATH.
    #[arg(long, default_value = "model,quant:q8_0,quant:q4_0,ngram")]
    drafters: String,
    /// Values of k, comma-separated: N, auto, grow.
    #[arg(long, default_value = "2,4,6,auto")]
    ks: String,
    /// Round shapes, comma-separated: none (chains), WxDxN (always a tree: width, depth,
    /// nodes), auto or auto:WxDxN (a tree when it measures faster than the chain).
    #[arg(long, default_value = "none")]
    trees: String,
    /// Temperatures, comma-separated.
    #[arg(long, default_value = "0,0.8")]
    temperatures: String,
    /// A file with one prompt per line (`\n` for a newline); default: four chat prompts. A line
    /// `SCHEMA<TAB>PROMPT` constrains its output to the JSON Schema `schemas/SCHEMA.json` next
    /// to the file (`json` for any JSON object): `benches/prompts/json.txt`.
    #[arg(long)]
    prompts: Option<String>,
    /// Wrap prompts in the chat template.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    chat: bool,
    /// Tokens per generation.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Generate exactly max-new-tokens (ignore end-of-sequence), as benchmarks need.
    #[arg(long)]
    ignore_eos: bool,
    /// Random seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Weight formats to compare with the f32 target over the prompts' positions (mean
    /// |Δlogit|, argmax agreement, 1-token and 5-token forward times), comma-separated.
    #[arg(long, default_value = "f32,stored,q8_0,q4_0,q4_1,q4k")]
    formats: String,
    /// Print T(m)/T(1), the cost of scoring m rows in one forward pass at context 100, for
    /// m = 1..=16 (what trees and batches spend), and prefill times up to 2048 rows, on the
    /// stored weights; then stop.
    #[arg(long)]
    rows_curve: bool,
    /// With --rows-curve: the row counts, comma-separated.
    #[arg(long, default_value = "1,2,3,4,5,6,7,8,9,12,16,32,64,128,256,512,1024,2048")]
    rows: String,
    /// Batch sizes, comma-separated (e.g. 1,2,4,8,16): measure batched plain decoding, fixed-k
    /// and adaptive speculation per batch size instead of the single-sequence tables.
    #[arg(long)]
    batch: Option<String>,
    /// Batch mode: the fixed k's to compare, comma-separated.
    #[arg(long, default_value = "2,4")]
    batch_ks: String,
    /// Batch mode: the adaptive policy's largest k.
    #[arg(long, default_value_t = specdec::adaptive::DEFAULT_MAX_K)]
    batch_max_k: usize,
    /// Batch mode: tokens per sequence.
    #[arg(long, default_value_t = 96)]
    batch_tokens: usize,
    /// Batch mode: runs per batch size and policy (the policies take turns).
    #[arg(long, default_value_t = 2)]
    batch_repeats: usize,
    /// Batch mode: the draft model (a .gguf, run as stored); default: the target's own file as
    /// stored (SmolLM2's Q4_1 weights beside its f32 copy).
    #[arg(long)]
    batch_draft: Option<String>,
    /// Batch mode: the temperature (0: greedy); sequence i samples with seed 1000 + i.
    #[arg(long, default_value_t = 0.0)]
    batch_temperature: f64,
    /// Batch mode: where to write the chart of throughput against batch size.
    #[arg(long, default_value = "docs/charts/batch-throughput.svg")]
    batch_svg: String,
    /// Replay a trace of requests (JSON lines: session, messages, max_tokens) in order, each
    /// drafter kept from request to request: `benches/workloads/agent.jsonl`. Uses the first
    /// of --ks.
    #[arg(long, value_name = "FILE.jsonl")]
    workload: Option<String>,
    /// With --workload: write each request's rendered prompt to DIR/NNN.txt and its
    /// max_tokens to DIR/NNN.n (for running a peer on the same trace), then stop.
    #[arg(long, value_name = "DIR")]
    dump_prompts: Option<String>,
    /// End with one JSON line.
    #[arg(long)]
    json: bool,
}

const PROMPTS: [&str; 4] = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works, step by step.",
    "Repeat this sentence three times, then summarize it: The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "List ten fruits and one fact about each.",
];

/// Per prompt: statistics, tokens per second and the tokens.
#[derive(Default)]
struct Run {
    stats: Vec<Stats>,
    tok_s: Vec<f64>,
    tokens: Vec<Vec<u32>>,
}

impl Run {
    fn push(&mut self, out: Generation) {
        self.tok_s.push(out.stats.tokens_per_sec());
        self.stats.push(out.stats);
        self.tokens.push(out.tokens);
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let device = specdec::device(&args.device)?;
    let target_spec = args
        .target
        .clone()
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/models-cache/SmolLM2-135M-Instruct.Q4_1.gguf").into());
    let files = ModelFiles::resolve(&target_spec)?;
    if args.rows_curve {
        return rows_curve(&files.load(WeightFormat::Stored, &device)?.0, &args.rows);
    }
    let target_format: WeightFormat = args.target_format.parse()?;
    let (target, tok) = files.load(target_format, &device).with_context(|| format!("loading {target_spec}"))?;
    let (prompts, grammars) = load_prompts(&args, &tok)?;
    let mut stop = tok.stop_ids();
    if args.ignore_eos {
        stop.clear();
    }
    if let Some(sizes) = &args.batch {
        let draft_files = match &args.batch_draft {
            Some(path) => ModelFiles::resolve(path)?,
            None => files.clone(),
        };
        let draft = draft_files.load(WeightFormat::Stored, &device)?.0;
        let plan = batch::Plan {
            sizes: parse_list(sizes)?,
            ks: if args.batch_ks.is_empty() { Vec::new() } else { parse_list(&args.batch_ks)? },
            max_k: args.batch_max_k,
            tokens: args.batch_tokens,
            repeats: args.batch_repeats,
            prompts: &prompts,
            svg: args.batch_svg.clone(),
            json: args.json,
            temperature: args.batch_temperature,
            title: format!("{} ({target_format}) drafted by {} (stored)", files.name(), draft_files.name()),
        };
        return batch::run(&target, &draft, &plan);
    }
    if let Some(path) = &args.workload {
        return workload::run(&args, &files, &target, &tok, path);
    }
    let v_f32 = verify_ratio(&target)?;
    let quant = files.load(WeightFormat::Stored, &device)?.0;
    let v_quant = verify_ratio(&quant)?;
    drop(quant);
    println!("{}", specdec::cpu::kernels());
    println!("target {} ({target_format}, {:?} engine): v = T(5 tokens)/T(1 token) at context 100 = {v_f32:.2}; its stored weights: v = {v_quant:.2}", files.name(), target.engine());
    if !args.formats.is_empty() {
        format_errors(&args, &files, &target, &prompts, &device)?;
    }
    println!(
        "{:<14} {:>6} {:>12} {:>5} {:>5} {:>6} {:>6} {:>8} {:>6} {:>6} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8} {:>5}",
        "drafter",
        "k",
        "tree",
        "mean k",
        "temp",
        "alpha",
        "a_pos",
        "tok/call",
        "c",
        "v",
        "plain/s",
        "spec/s",
        "speedup",
        "S(kac)",
        "S(v)",
        "rss plain",
        "rss spec",
        "match"
    );
    let mut rows = Vec::new();
    for temp in parse_list::<f32>(&args.temperatures)? {
        let sampling = SamplingConfig::new(temp)?.with_seed(args.seed);
        let mut plain_dec = PlainDecoder::new(Llama::new(target.clone())?, sampling.clone())
            .max_new_tokens(args.max_new_tokens)
            .stop_tokens(stop.clone());
        plain_dec.generate(&prompts[0])?; // warm-up: page in the weights, start the threads
        let rss_plain = rss_mb();
        for spec in args.drafters.split(',').filter(|s| !s.is_empty()).map(str::parse::<DrafterSpec>) {
            let spec = spec?;
            let shapes = args.ks.split(',').flat_map(|k| args.trees.split(',').map(move |t| (k, t)));
            for (k, tree) in shapes {
                let (k, tree) = (k.parse::<KPolicy>()?, tree.parse::<TreePolicy>()?);
                let mut verifier = Llama::new(target.clone())?;
                let mut drafter = Drafter::build(&spec, &files, &mut verifier, &tok, &device)?;
                if let Some(rows) = &args.draft_vocab {
                    drafter.limit_vocabulary(&tok, if rows == "all" { None } else { Some(rows.parse()?) })?;
                }
                if let Some(note) = drafter.note() {
                    eprintln!("  {spec}: {note}");
                }
                let mut dec = SpeculativeDecoder::builder(Pair { target: verifier, draft: drafter })
                    .k_policy(k)
                    .tree(tree)
                    .sampling(sampling.clone())
                    .max_new_tokens(args.max_new_tokens)
                    .stop_tokens(stop.clone())
                    .build()?;
                dec.generate(&prompts[0])?;
                // Plain and speculative alternate prompt by prompt, so that the machine's
                // drifting speed affects both sides of each ratio alike.
                let (mut plain, mut run) = (Run::default(), Run::default());
                for (p, grammar) in prompts.iter().zip(&grammars) {
                    if grammars.iter().any(Option::is_some) {
                        let cfg =
                            grammar.as_ref().map_or(sampling.clone(), |g| sampling.clone().with_processor(g.clone()));
                        plain_dec.set_sampling(cfg.clone())?;
                        dec.set_sampling(cfg)?;
                    }
                    plain.push(plain_dec.generate(p)?);
                    run.push(dec.generate(p)?);
                }
                if grammars.iter().any(Option::is_some) {
                    let (s, p) = (sum(&run.stats), sum(&plain.stats));
                    let valid = run
                        .tokens
                        .iter()
                        .filter(|t| {
                            tok.decode(t).is_ok_and(|x| serde_json::from_str::<serde_json::Value>(x.trim()).is_ok())
                        })
                        .count();
                    eprintln!(
                        "  {spec}: grammar: {:.1} % of tokens forced, {:.2} ms a token in the processors (plain: {:.2}), {valid} of {} outputs JSON",
                        100.0 * s.forced_tokens as f64 / s.new_tokens.max(1) as f64,
                        1e3 * s.process_secs / s.new_tokens.max(1) as f64,
                        1e3 * p.process_secs / p.new_tokens.max(1) as f64,
                        run.tokens.len()
                    );
                }
                let rss_spec = rss_mb();
                let speedups: Vec<f64> = run.tok_s.iter().zip(&plain.tok_s).map(|(s, p)| s / p).collect();
                let total = sum(&run.stats);
                let (alpha, kbar, c) = (total.position_acceptance(), total.mean_k(), total.cost_ratio());
                // v of this run: verification call time over the plain one-token call time.
                let v = (total.target_secs / total.target_calls.max(1) as f64)
                    / (sum(&plain.stats).target_secs / sum(&plain.stats).target_calls.max(1) as f64);
                let c_plain = c * v; // draft call over a one-token target call
                let greedy_match = (temp == 0.0).then(|| run.tokens == plain.tokens);
                let row = json!({
                    "drafter": spec.to_string(), "k": k.to_string(), "tree": tree.to_string(), "temperature": temp,
                    "acceptance_rate": total.acceptance_rate(), "position_acceptance": alpha, "mean_k": kbar,
                    "tokens_per_target_call": total.tokens_per_target_call(), "draft_cost_ratio": c_plain, "verify_ratio": v,
                    "plain_tok_s": mean(&plain.tok_s), "spec_tok_s": mean(&run.tok_s), "speedup": mean(&speedups),
                    "predicted_speedup": predicted_speedup(kbar, alpha, c_plain),
                    "predicted_speedup_with_v": predicted_speedup_with_verify(kbar, alpha, c_plain, v),
                    "rss_plain_mb": rss_plain, "rss_spec_mb": rss_spec, "greedy_match": greedy_match,
                    "tree_rounds": total.tree_rounds, "rounds": total.target_calls,
                    "acceptance_by_depth": total.acceptance_by_depth(),
                    "measured_tok_s_chain_tree": dec.shape_chooser().rates(),
                    "forced_share": total.forced_tokens as f64 / total.new_tokens.max(1) as f64,
                    "process_ms_per_token": 1e3 * total.process_secs / total.new_tokens.max(1) as f64,
                });
                let by_depth: Vec<String> = total.acceptance_by_depth().iter().map(|a| format!("{a:.2}")).collect();
                eprintln!("  {spec}: acceptance by depth {}", by_depth.join(" "));
                if total.tree_rounds > 0 {
                    let (chain, tree) = dec.shape_chooser().rates();
                    eprintln!("  {} of {} rounds drafted trees; rounds measured at {chain:.1} tok/s (chain), {tree:.1} (tree)", total.tree_rounds, total.target_calls);
                }
                println!(
                    "{:<14} {:>6} {:>12} {:>5.2} {:>5.1} {:>6.3} {:>6.3} {:>8.2} {:>6.3} {:>6.2} {:>8.1} {:>8.1} {:>8.2} {:>7.2} {:>7.2} {:>8.0} {:>8.0} {:>5}",
                    spec.to_string(), k.to_string(), tree.to_string(), kbar, temp, total.acceptance_rate(), alpha, total.tokens_per_target_call(), c_plain, v,
                    mean(&plain.tok_s), mean(&run.tok_s), mean(&speedups), row["predicted_speedup"].as_f64().unwrap_or(0.0),
                    row["predicted_speedup_with_v"].as_f64().unwrap_or(0.0), rss_plain, rss_spec,
                    greedy_match.map_or("-", |m| if m { "yes" } else { "NO" })
                );
                rows.push(row);
            }
        }
    }
    let best = |t: f32| {
        rows.iter().filter(|r| r["temperature"].as_f64() == Some(t as f64)).max_by(|a, b| {
            a["speedup"].as_f64().partial_cmp(&b["speedup"].as_f64()).unwrap_or(std::cmp::Ordering::Equal)
        })
    };
    let (greedy, sampled) = (best(0.0), best(0.8));
    if let Some(g) = greedy {
        println!(
            "best greedy: {} k={} tree={} speedup {:.2}",
            g["drafter"],
            g["k"],
            g["tree"],
            g["speedup"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(s) = sampled {
        println!(
            "best at temperature 0.8: {} k={} tree={} speedup {:.2}",
            s["drafter"],
            s["k"],
            s["tree"],
            s["speedup"].as_f64().unwrap_or(0.0)
        );
    }
    if args.json {
        let summary = json!({
            "target": files.name(), "verify_ratio_f32": v_f32, "verify_ratio_quant": v_quant,
            "greedy_speedup": greedy.map(|g| g["speedup"].clone()), "sampled_speedup": sampled.map(|s| s["speedup"].clone()),
            "plain_tok_s": rows.first().map(|r| r["plain_tok_s"].clone()),
            "best_k": greedy.map(|g| g["k"].clone()), "best_drafter": greedy.map(|g| g["drafter"].clone()),
            "draft_cost_ratio": greedy.map(|g| g["draft_cost_ratio"].clone()),
            "device": args.device, "kernels": specdec::cpu::kernels().to_string(), "rows": rows,
        });
        println!("{summary}");
    }
    Ok(())
}

/// For each weight format: how far its logits are from the target's (as loaded) along the
/// prompts, how often its argmax agrees, and its forward times for 1, 5 and 9 rows.
fn format_errors(
    args: &Args,
    files: &ModelFiles,
    target: &Arc<LlamaWeights>,
    prompts: &[Vec<u32>],
    device: &candle_core::Device,
) -> Result<()> {
    println!(
        "{:<8} {:>8} {:>10} {:>9} {:>9} {:>6} {:>6} {:>9}",
        "format", "MB/token", "mean|dl|", "argmax=", "1-row ms", "v(5)", "v(9)", "tg128/s"
    );
    let reference: Vec<Logits> =
        prompts.iter().map(|p| Ok(Llama::new(target.clone())?.forward(p, p.len())?)).collect::<Result<_>>()?;
    for f in args.formats.split(',') {
        let (w, _) = files.load(f.parse()?, device)?;
        let (mut diff, mut same, mut n) = (0f64, 0usize, 0usize);
        for (p, r) in prompts.iter().zip(&reference) {
            let l = Llama::new(w.clone())?.forward(p, p.len())?;
            for i in 0..p.len() {
                diff +=
                    l.row(i).iter().zip(r.row(i)).map(|(a, b)| (a - b).abs() as f64).sum::<f64>() / r.vocab() as f64;
                same += usize::from(argmax(l.row(i))? == argmax(r.row(i))?);
                n += 1;
            }
        }
        let one = forward_ms(&w, 1)?;
        let mb = w.bytes_per_token().map_or(0.0, |b| b as f64 / 1e6);
        // Plain decoding of 128 tokens from one token, as llama-bench's tg128 measures it.
        let mut plain = PlainDecoder::new(Llama::new(w.clone())?, SamplingConfig::greedy()).max_new_tokens(128);
        plain.generate(&[prompts[0][0]])?;
        let tg = (0..3)
            .map(|_| Ok(plain.generate(&[prompts[0][0]])?.stats.tokens_per_sec()))
            .collect::<Result<Vec<f64>>>()?;
        println!(
            "{f:<8} {mb:>8.0} {:>10.4} {:>9.3} {:>9.2} {:>6.2} {:>6.2} {:>9.1}",
            diff / n as f64,
            same as f64 / n as f64,
            one,
            forward_ms(&w, 5)? / one,
            forward_ms(&w, 9)? / one,
            mean(&tg)
        );
    }
    Ok(())
}

pub fn parse_list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>> {
    s.split(',').map(|x| x.trim().parse::<T>().map_err(|_| anyhow::anyhow!("cannot parse `{x}`"))).collect()
}

/// Each prompt's token ids, and its grammar where its line names a schema.
type Prompts = (Vec<Vec<u32>>, Vec<Option<ProcessorFactory>>);

/// The prompts' token ids, and for each its grammar if its line names a schema.
fn load_prompts(args: &Args, tok: &Tokenizer) -> Result<Prompts> {
    let lines: Vec<String> = match &args.prompts {
        Some(path) => std::fs::read_to_string(path)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.replace("\\n", "\n"))
            .collect(),
        None => PROMPTS.iter().map(|s| s.to_string()).collect(),
    };
    let dir = args.prompts.as_ref().and_then(|p| std::path::Path::new(p).parent().map(|d| d.join("schemas")));
    let mut vocab = None;
    let (mut ids, mut grammars) = (Vec::new(), Vec::new());
    for line in &lines {
        let (grammar, text) = match (line.split_once('\t'), &dir) {
            (Some((name, text)), Some(dir)) => {
                let grammar = match name {
                    "json" => Grammar::json(),
                    _ => {
                        let path = dir.join(format!("{name}.json"));
                        let schema =
                            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                        Grammar::json_schema(serde_json::from_str(&schema)?)
                    }
                };
                if vocab.is_none() {
                    vocab = Some(GrammarVocab::new(tok)?);
                }
                (vocab.as_ref().map(|v| grammar.compile(v)).transpose()?, text)
            }
            _ => (None, line.as_str()),
        };
        ids.push(tok.encode(&if args.chat { tok.chat_prompt(text) } else { text.to_string() })?);
        grammars.push(grammar);
    }
    Ok((ids, grammars))
}

/// The cost of many rows on the stored weights alone (no f32 copy is loaded): T(m), a forward
/// of m new rows at context 100 with every row's logits (what verification and batches spend),
/// and T(m)/T(1) for m up to 16; then prefill, a forward of m rows from an empty context with
/// the last row's logits only (what a prompt costs), in ms and prompt tokens a second, for
/// every m of `sizes` (comma-separated).
fn rows_curve(stored: &Arc<LlamaWeights>, sizes: &str) -> Result<()> {
    println!("{}", specdec::cpu::kernels());
    println!("{:>5} {:>10} {:>8} {:>12} {:>10}", "m", "T(m) ms", "T(m)/T1", "prefill ms", "prompt/s");
    let one = forward_ms(stored, 1)?;
    for m in parse_list::<usize>(sizes)? {
        let verify = if m <= 16 { Some(forward_ms(stored, m)?) } else { None };
        let prefill = prefill_ms(stored, m)?;
        let (t, ratio) = verify.map_or(("".into(), "".into()), |t| (format!("{t:.2}"), format!("{:.2}", t / one)));
        println!("{m:>5} {t:>10} {ratio:>8} {prefill:>12.1} {:>10.1}", m as f64 * 1000.0 / prefill);
    }
    Ok(())
}

/// Milliseconds of a prefill of `rows` tokens from an empty context (the last row's logits):
/// the median of at least 3 runs after one unmeasured, more while under 3 seconds in all.
fn prefill_ms(weights: &Arc<LlamaWeights>, rows: usize) -> Result<f64> {
    let mut model = Llama::new(weights.clone())?;
    let toks: Vec<u32> = (0..rows as u32).map(|i| 200 + i * 7919 % 20000).collect();
    model.forward(&toks, 1)?;
    model.truncate(0)?;
    let (mut times, begun) = (Vec::new(), Instant::now());
    while times.len() < 3 || (times.len() < 15 && begun.elapsed().as_secs_f64() < 3.0) {
        let start = Instant::now();
        model.forward(&toks, 1)?;
        model.truncate(0)?;
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// T(5-token forward) / T(1-token forward) at context 100, all logits rows.
fn verify_ratio(weights: &Arc<LlamaWeights>) -> Result<f64> {
    forward_ms(weights, 1)?; // warm-up
    Ok(forward_ms(weights, 5)? / forward_ms(weights, 1)?)
}

/// Milliseconds of a forward of `rows` new tokens at context 100 (all rows' logits): the
/// median of 15 after 3 unmeasured.
fn forward_ms(weights: &Arc<LlamaWeights>, rows: usize) -> Result<f64> {
    let mut model = Llama::new(weights.clone())?;
    model.forward(&(0..100).collect::<Vec<u32>>(), 0)?;
    let toks: Vec<u32> = (200..200 + rows as u32).collect();
    let mut times = Vec::new();
    for i in 0..18 {
        let start = Instant::now();
        model.forward(&toks, rows)?;
        model.truncate(100)?;
        if i >= 3 {
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn sum(stats: &[Stats]) -> Stats {
    stats.iter().fold(Stats::default(), |mut total, s| {
        total += s;
        total
    })
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// Resident memory of this process in MB (0 where /proc is absent).
fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
