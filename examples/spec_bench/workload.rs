//! `--workload FILE.jsonl`: replays a trace of requests in order (one JSON object a line:
//! `{"session", "messages": [{"role", "content"}, …], "max_tokens"}`, rendered with the model's
//! chat template): plain decoding, each drafter once (kept from request to request: a suffix
//! drafter's cache grows with the trace), then plain again (the machine's drift shows); reports
//! per-request and whole-trace speedups against the first plain run of the same session.

use anyhow::{Context, Result};
use serde_json::json;
use specdec::chat::ChatMessage;
use specdec::{
    Drafter, DrafterSpec, KPolicy, Llama, ModelFiles, Pair, PlainDecoder, SamplingConfig, SpeculativeDecoder,
    Tokenizer, TreePolicy,
};

use crate::Args;

/// One request of a trace.
#[derive(serde::Deserialize)]
struct Line {
    session: String,
    messages: Vec<ChatMessage>,
    max_tokens: usize,
}

/// A pass over the trace: per request, tokens and decode seconds, and the tokens themselves.
struct Pass {
    tokens: Vec<usize>,
    secs: Vec<f64>,
    outputs: Vec<Vec<u32>>,
    drafted: usize,
    accepted: usize,
    target_calls: usize,
}

impl Pass {
    fn tok_s(&self) -> f64 {
        self.tokens.iter().sum::<usize>() as f64 / self.secs.iter().sum::<f64>().max(1e-9)
    }
}

pub fn run(
    args: &Args,
    files: &ModelFiles,
    target: &std::sync::Arc<specdec::LlamaWeights>,
    tok: &Tokenizer,
    path: &str,
) -> Result<()> {
    let device = specdec::device(&args.device)?;
    let lines: Vec<Line> = std::fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("a line of {path}")))
        .collect::<Result<_>>()?;
    let texts: Vec<String> = lines.iter().map(|l| Ok(tok.chat(&l.messages)?)).collect::<Result<_>>()?;
    if let Some(dir) = &args.dump_prompts {
        std::fs::create_dir_all(dir)?;
        for (i, (text, line)) in texts.iter().zip(&lines).enumerate() {
            std::fs::write(format!("{dir}/{i:03}.txt"), text)?;
            std::fs::write(format!("{dir}/{i:03}.n"), line.max_tokens.to_string())?;
        }
        println!("wrote {} prompts to {dir}", texts.len());
        return Ok(());
    }
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| Ok(tok.encode(t)?)).collect::<Result<_>>()?;
    let stop = if args.ignore_eos { Vec::new() } else { tok.stop_ids() };
    let sessions: std::collections::BTreeSet<&str> = lines.iter().map(|l| l.session.as_str()).collect();
    let mean_prompt = prompts.iter().map(Vec::len).sum::<usize>() / prompts.len().max(1);
    println!("{}", specdec::cpu::kernels());
    println!(
        "workload {path}: {} requests in {} sessions, prompts of {mean_prompt} tokens on average",
        lines.len(),
        sessions.len()
    );
    for temp in crate::parse_list::<f32>(&args.temperatures)? {
        let sampling = SamplingConfig::new(temp)?.with_seed(args.seed);
        let mut plain = PlainDecoder::new(Llama::new(target.clone())?, sampling.clone()).stop_tokens(stop.clone());
        plain.generate(&prompts[0])?; // warm-up
        let base = replay_plain(&lines, &prompts, &mut plain)?;
        println!("temperature {temp}: plain {:.1} tok/s over the trace", base.tok_s());
        println!(
            "{:<40} {:>8} {:>8} {:>8} {:>9} {:>10} {:>6}",
            "drafter", "tok/s", "speedup", "alpha", "tok/call", "per-request", "match"
        );
        let mut rows = Vec::new();
        let specs = args.drafters.split(',').filter(|s| !s.is_empty()).map(str::parse::<DrafterSpec>);
        let shapes: Vec<TreePolicy> = args.trees.split(',').map(str::parse).collect::<Result<_, _>>()?;
        for (spec, tree) in
            specs.collect::<Result<Vec<_>, _>>()?.into_iter().flat_map(|s| shapes.iter().map(move |t| (s.clone(), *t)))
        {
            let name = if tree == TreePolicy::default() { spec.to_string() } else { format!("{spec} tree={tree}") };
            let mut verifier = Llama::new(target.clone())?;
            let drafter = Drafter::build(&spec, files, &mut verifier, tok, &device)?;
            let policy: KPolicy = args.ks.split(',').next().unwrap_or("auto").parse()?;
            let mut dec = SpeculativeDecoder::builder(Pair { target: verifier, draft: drafter })
                .k_policy(policy)
                .tree(tree)
                .sampling(sampling.clone())
                .stop_tokens(stop.clone())
                .build()?;
            let pass = replay(&lines, &prompts, |p, n| {
                dec.set_max_new_tokens(n);
                Ok(dec.generate(p)?)
            })?;
            let speedups: Vec<f64> = (0..lines.len())
                .map(|i| (pass.tokens[i] as f64 / pass.secs[i]) / (base.tokens[i] as f64 / base.secs[i]))
                .collect();
            let mut sorted = speedups.clone();
            sorted.sort_by(f64::total_cmp);
            let median = sorted[sorted.len() / 2];
            let same = (temp == 0.0).then(|| pass.outputs == base.outputs);
            let alpha = pass.accepted as f64 / pass.drafted.max(1) as f64;
            let per_call = pass.tokens.iter().sum::<usize>() as f64 / pass.target_calls.max(1) as f64;
            let whole = pass.tok_s() / base.tok_s();
            println!(
                "{:<40} {:>8.1} {:>8.2} {:>8.3} {:>9.2} {:>10} {:>6}",
                name,
                pass.tok_s(),
                whole,
                alpha,
                per_call,
                format!("med {median:.2}"),
                same.map_or("-", |s| if s { "yes" } else { "NO" })
            );
            eprintln!(
                "  {name}: per request {}",
                speedups.iter().map(|s| format!("{s:.2}")).collect::<Vec<_>>().join(" ")
            );
            rows.push(json!({
                "drafter": spec.to_string(), "tree": tree.to_string(), "temperature": temp, "tok_s": pass.tok_s(), "plain_tok_s": base.tok_s(),
                "speedup": whole, "acceptance_rate": alpha, "tokens_per_target_call": per_call,
                "per_request_speedups": speedups, "greedy_match": same,
            }));
        }
        // Plain again, so that the machine's drift over the rows shows.
        let again = replay_plain(&lines, &prompts, &mut plain)?;
        println!(
            "plain again after the drafters: {:.1} tok/s ({:+.1} %)",
            again.tok_s(),
            100.0 * (again.tok_s() / base.tok_s() - 1.0)
        );
        if args.json {
            let (before, after) = (base.tok_s(), again.tok_s());
            let kernels = specdec::cpu::kernels().to_string();
            println!(
                "{}",
                json!({ "workload": path, "kernels": kernels, "plain_tok_s": [before, after], "rows": rows })
            );
        }
    }
    Ok(())
}

/// Plain decoding over the trace in order.
fn replay_plain(lines: &[Line], prompts: &[Vec<u32>], plain: &mut PlainDecoder<Llama>) -> Result<Pass> {
    replay(lines, prompts, |p, n| {
        plain.set_max_new_tokens(n);
        Ok(plain.generate(p)?)
    })
}

/// Runs `generate(prompt, max_tokens)` over the trace in order.
fn replay(
    lines: &[Line],
    prompts: &[Vec<u32>],
    mut generate: impl FnMut(&[u32], usize) -> Result<specdec::Generation>,
) -> Result<Pass> {
    let mut pass =
        Pass { tokens: Vec::new(), secs: Vec::new(), outputs: Vec::new(), drafted: 0, accepted: 0, target_calls: 0 };
    for (line, prompt) in lines.iter().zip(prompts) {
        let out = generate(prompt, line.max_tokens)?;
        pass.tokens.push(out.stats.new_tokens);
        pass.secs.push(out.stats.decode_secs);
        pass.drafted += out.stats.drafted;
        pass.accepted += out.stats.accepted;
        pass.target_calls += out.stats.target_calls;
        pass.outputs.push(out.tokens);
    }
    Ok(pass)
}
