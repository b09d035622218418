//! Speculative decoding of a llama-family model (Llama, Qwen2/3, Gemma 3, Mistral, Phi-3) with a
//! cheaper draft, streamed, then plain decoding of the same target on the same prompt, and a
//! comparison.
//!
//! With no arguments it uses the local SmolLM2-135M-Instruct GGUF from
//! `scripts/fetch-models.sh` (target: f32, draft: its own Q4_1 weights) when present, else the
//! hub pair SmolLM2-360M-Instruct (target) + SmolLM2-135M-Instruct (draft).
//!
//! `cargo run --release --example llama_spec -- --prompt "Tell me a story" --k 4 --report-json`;
//! JSON output: `-- --json --prompt "A JSON object describing a cat"` (or `--json-schema FILE`,
//! `--regex R`, `--grammar FILE.lark`).

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;
use specdec::draft::suffix_cache::DEFAULT_CAPACITY;
use specdec::grammar::{Grammar, GrammarVocab};
use specdec::{
    Drafter, DrafterSpec, Generation, KPolicy, Llama, ModelFiles, Pair, PlainDecoder, SamplingConfig,
    SpeculativeDecoder, SuffixCache, TextStream, TokenModel, Tokenizer, TreePolicy, WeightFormat,
};

#[derive(Parser)]
struct Args {
    /// Target model: a .gguf file, an HF folder, or a hub id (hf:org/name). Families: llama
    /// (Llama 2/3, SmolLM2, TinyLlama), Qwen2/2.5, Qwen3, Gemma 3, Mistral (HF folders; its
    /// GGUF files are llama), Phi-3 (GGUF).
    #[arg(long)]
    target: Option<String>,
    /// Draft model (same kinds as --target); short for `--drafter model:DRAFT` (with
    /// `--drafter ngram+model`, the model of that pair). Its weights are held compact: types
    /// wider than Q4_1's 5 bits a weight are re-quantized to Q4_1 at load (still exact, and
    /// cheaper); `PATH@stored` keeps the file's, `PATH@q4_0` (or another format) picks one.
    #[arg(long)]
    draft: Option<String>,
    /// Build the draft by quantizing the target's weights (q8_0, q4_0, q4_1, q4k, ...); short
    /// for `--drafter quant:TYPE`.
    #[arg(long)]
    draft_quant: Option<String>,
    /// The drafter: model[:PATH] (default: the target file's weights as stored), ngram
    /// (prompt lookup), ngram+model[:PATH] (lookup where the context repeats itself, the model
    /// elsewhere), suffix (lookup over this request and the earlier ones of --suffix-cache),
    /// suffix+model[:PATH], layerskip:N (the target's first N blocks), quant:TYPE, or a draft head
    /// on the target's hidden states: eagle:PATH, eagle3:PATH, medusa:PATH (a folder with
    /// config.json and safetensors, or a hub id hf:org/name; scripts/train-heads.sh trains them),
    /// or cross:text:PATH / cross:intersection:PATH, a draft model with another tokenizer
    /// (--draft with another tokenizer uses the intersection method by itself).
    #[arg(long, default_value = "model")]
    drafter: String,
    /// Weight format of the target: auto, f32 or stored. auto holds a --target as stored (a
    /// quantized GGUF file stays quantized: the model a user runs) and the default SmolLM2
    /// target in f32 (drafted by its own Q4_1 weights).
    #[arg(long, default_value = "auto")]
    target_format: String,
    /// The prompt. The default asks for a long answer: a one-line answer is over before the
    /// speculation has anything to win.
    #[arg(long, default_value = "Write a short story about a lighthouse keeper who finds a message in a bottle.")]
    prompt: String,
    /// Wrap the prompt in the model's chat template: auto (when it has one and the prompt does
    /// not already contain it), on or off.
    #[arg(long, default_value = "auto")]
    chat: String,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Drafted tokens per round: auto (adaptive, up to 8, plain decoding where drafting does not
    /// pay), auto:MAX, N (fixed), grow, grow:MAX.
    #[arg(long, default_value = "auto")]
    k: String,
    /// Round shape: none (chains), auto or auto:WxDxN[xE] (a tree of drafts when it measures
    /// faster), WxDxN[xE] (always a tree: width, depth, nodes, nodes expanded per level).
    #[arg(long, default_value = "none")]
    tree: String,
    /// Token ids a model draft with a large vocabulary scores: N (its first N, with the
    /// special tokens) or all. Default: 65536, for vocabularies of more than 1.5 times as many.
    #[arg(long)]
    draft_vocab: Option<String>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Top-k filter.
    #[arg(long)]
    top_k: Option<usize>,
    /// Top-p (nucleus) filter.
    #[arg(long)]
    top_p: Option<f32>,

    /// Min-p: drop tokens less likely than this times the most likely one.
    #[arg(long)]
    min_p: Option<f32>,

    /// Repetition penalty (HF / llama.cpp; 1 = none) over prompt and output.
    #[arg(long)]
    repeat_penalty: Option<f32>,

    /// Presence penalty (OpenAI) over the output.
    #[arg(long)]
    presence_penalty: Option<f32>,

    /// Frequency penalty (OpenAI) over the output.
    #[arg(long)]
    frequency_penalty: Option<f32>,

    /// A logit bias, `ID=BIAS` (repeat the flag for several).
    #[arg(long, value_parser = parse_bias)]
    logit_bias: Vec<(u32, f32)>,
    /// Random seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Report each token's log-probability and its N most likely alternatives (0 to 20; the
    /// first tokens' are printed). They are read from the target's rows, plain decoding's
    /// values bit for bit.
    #[arg(long)]
    logprobs: Option<usize>,
    /// How sampled tokens are drawn: coupled (every draw fixed by the seed and the position, so
    /// the text is the same for a seed whatever k or drafter, and equals plain decoding's) or
    /// standard (min(1, p/q) acceptance).
    #[arg(long, default_value = "coupled")]
    sampling: String,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Constrain the output to a JSON object (a grammar; see `specdec::grammar`).
    #[arg(long)]
    json: bool,
    /// Constrain the output to JSON valid under the JSON Schema in FILE.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// Constrain the output to text matching a regular expression.
    #[arg(long, value_name = "R")]
    regex: Option<String>,
    /// Constrain the output to a Lark grammar in FILE (llguidance's dialect).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
    /// A suffix drafter's cache of earlier requests: read at the start when the file exists,
    /// written at the end with this run's request added.
    #[arg(long, value_name = "FILE")]
    suffix_cache: Option<PathBuf>,
    /// End with one JSON line summarizing the run.
    #[arg(long)]
    report_json: bool,
}

const LOCAL_SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default pair: the local SmolLM2 file if fetched, else the hub pair.
fn default_models() -> (String, Option<String>) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dirs = [std::env::var_os("SPECDEC_MODELS").map(PathBuf::from), Some(root.join("models-cache"))];
    match dirs.into_iter().flatten().map(|d| d.join(LOCAL_SMOLLM2)).find(|p| p.is_file()) {
        Some(local) => (local.display().to_string(), None),
        None => {
            ("hf:HuggingFaceTB/SmolLM2-360M-Instruct".into(), Some("hf:HuggingFaceTB/SmolLM2-135M-Instruct".into()))
        }
    }
}

/// Whether sampling runs coupled, as `--sampling` says (greedy runs are neither).
fn coupled(args: &Args) -> Result<bool> {
    match args.sampling.as_str() {
        "coupled" => Ok(args.temperature > 0.0),
        "standard" => Ok(false),
        other => anyhow::bail!("--sampling {other}: expected coupled or standard"),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let device = specdec::device(&args.device)?;
    // The default draft goes with the default target only: another target drafts with its own
    // weights as stored.
    let (target_spec, default_draft) = match &args.target {
        Some(t) => (t.clone(), None),
        None => default_models(),
    };
    let target_files = ModelFiles::resolve(&target_spec)?;
    let target_format: WeightFormat = match (args.target_format.as_str(), &args.target) {
        ("auto", Some(_)) => WeightFormat::Stored,
        ("auto", None) => WeightFormat::F32,
        (format, _) => format.parse()?,
    };
    let (target_w, tokenizer) =
        target_files.load(target_format, &device).with_context(|| format!("loading target {target_spec}"))?;

    let spec: DrafterSpec = match (&args.draft, &args.draft_quant, args.drafter.as_str()) {
        (Some(path), _, "ngram+model") => DrafterSpec::LookupModel(Some(path.clone())),
        (Some(path), _, "suffix+model") => DrafterSpec::SuffixModel(Some(path.clone())),
        (Some(path), _, _) => DrafterSpec::Model(Some(path.clone())),
        (None, Some(q), _) => DrafterSpec::Quant(q.parse()?),
        (None, None, "model") => DrafterSpec::Model(default_draft),
        (None, None, "ngram+model") => DrafterSpec::LookupModel(default_draft),
        (None, None, "suffix+model") => DrafterSpec::SuffixModel(default_draft),
        (None, None, other) => other.parse()?,
    };
    let mut verifier = Llama::new(target_w.clone())?;
    let mut drafter = Drafter::build(&spec, &target_files, &mut verifier, &tokenizer, &device)
        .with_context(|| format!("building drafter {spec}"))?;
    if let Some(rows) = &args.draft_vocab {
        drafter.limit_vocabulary(&tokenizer, if rows == "all" { None } else { Some(rows.parse()?) })?;
    }
    let draft_name = match drafter.note() {
        Some(note) => format!("{spec} ({note})"),
        None => spec.to_string(),
    };
    let k_policy: KPolicy = args.k.parse()?;
    let tree: TreePolicy = args.tree.parse()?;

    let prompt = match args.chat.as_str() {
        "on" => tokenizer.chat_prompt(&args.prompt),
        "auto" if !args.prompt.contains("<|im_start|>") => tokenizer.chat_prompt(&args.prompt),
        _ => args.prompt.clone(),
    };
    let ids = tokenizer.encode(&prompt)?;
    let mut sampling = SamplingConfig::new(args.temperature)?.with_seed(args.seed);
    if coupled(&args)? {
        sampling = sampling.coupled();
    }
    if let Some(k) = args.top_k {
        sampling = sampling.with_top_k(k)?;
    }
    if let Some(p) = args.top_p {
        sampling = sampling.with_top_p(p)?;
    }
    if let Some(p) = args.min_p {
        sampling = sampling.with_min_p(p)?;
    }
    if let Some(p) = args.repeat_penalty {
        sampling = sampling.with_repetition_penalty(p)?;
    }
    if let Some(p) = args.presence_penalty {
        sampling = sampling.with_presence_penalty(p)?;
    }
    if let Some(p) = args.frequency_penalty {
        sampling = sampling.with_frequency_penalty(p)?;
    }
    for &(id, bias) in &args.logit_bias {
        sampling = sampling.with_logit_bias(id, bias)?;
    }
    if let Some(n) = args.logprobs {
        sampling = sampling.with_logprobs(specdec::Logprobs::new(n, specdec::LogprobMode::Raw)?);
    }
    if let Some(grammar) = grammar(&args)? {
        sampling = sampling.with_processor(grammar.compile(&GrammarVocab::new(&tokenizer)?)?);
    }
    let stop = tokenizer.stop_ids();

    let mode = match (args.temperature == 0.0, sampling.is_coupled()) {
        (true, _) => "greedy",
        (false, true) => "coupled sampling",
        (false, false) => "standard sampling",
    };
    eprintln!(
        "target {} ({}), drafter {draft_name}, k {k_policy}, tree {tree}, {mode}, prompt {} tokens",
        target_files.name(),
        target_format,
        ids.len()
    );
    eprintln!("{}", specdec::cpu::kernels());
    let mut spec = SpeculativeDecoder::builder(Pair { target: verifier, draft: drafter })
        .k_policy(k_policy)
        .tree(tree)
        .sampling(sampling.clone())
        .max_new_tokens(args.max_new_tokens)
        .stop_tokens(stop.clone())
        .build()?;
    let mut plain =
        PlainDecoder::new(Llama::new(target_w)?, sampling).max_new_tokens(args.max_new_tokens).stop_tokens(stop);
    // One untimed run of each first, as benchmarks do: the weights and the thread team are
    // warm, and the adaptive k controller has measured this machine's costs (it keeps them
    // from one generation to the next, as it would over a session's requests).
    spec.generate(&ids)?;
    plain.generate(&ids)?;
    // A suffix drafter must not learn the prompt's answer from the warm-up: it starts over
    // from the cache file (or an empty cache).
    let suffix_cache = match spec.draft().suffix_cache() {
        Some(warm) => {
            let cache = match &args.suffix_cache {
                Some(path) if path.exists() => SuffixCache::load(path, warm.vocab(), DEFAULT_CAPACITY)?,
                _ => SuffixCache::new(warm.vocab(), DEFAULT_CAPACITY)?,
            };
            eprintln!("suffix cache: {} earlier requests, {} tokens", cache.requests(), cache.tokens());
            spec.draft_mut().use_suffix_cache(cache.clone())?;
            Some(cache)
        }
        None => None,
    };
    let spec_out = stream(&tokenizer, |on| spec.generate_with(&ids, on))?;
    let plain_out = plain.generate(&ids)?;
    if let (Some(cache), Some(path)) = (suffix_cache, &args.suffix_cache) {
        spec.draft_mut().truncate(0)?; // adds this run's request to the cache
        cache.save(path)?;
        eprintln!("suffix cache saved to {}: {} requests, {} tokens", path.display(), cache.requests(), cache.tokens());
    }
    report(&args, &target_files.name(), &draft_name, &tokenizer, &spec_out, &plain_out)
}

/// The grammar the flags ask for, if any (at most one).
fn grammar(args: &Args) -> Result<Option<Grammar>> {
    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let mut chosen = Vec::new();
    if args.json {
        chosen.push(Grammar::json());
    }
    if let Some(path) = &args.json_schema {
        let schema = serde_json::from_str(&read(path)?).with_context(|| format!("{} is not JSON", path.display()))?;
        chosen.push(Grammar::json_schema(schema));
    }
    if let Some(r) = &args.regex {
        chosen.push(Grammar::regex(r));
    }
    if let Some(path) = &args.grammar {
        chosen.push(Grammar::lark(&read(path)?));
    }
    anyhow::ensure!(chosen.len() <= 1, "--json, --json-schema, --regex and --grammar exclude each other");
    Ok(chosen.pop())
}

/// Runs a generation, printing its text as tokens are accepted.
fn stream(
    tok: &Tokenizer,
    run: impl FnOnce(&mut dyn FnMut(&[u32]) -> ControlFlow<()>) -> specdec::Result<Generation>,
) -> Result<Generation> {
    let mut text = TextStream::new();
    let mut out = std::io::stdout();
    let result = run(&mut |tokens| {
        if let Ok(piece) = text.push(tok, tokens) {
            let _ = write!(out, "{piece}");
            let _ = out.flush();
        }
        ControlFlow::Continue(())
    });
    println!();
    Ok(result?)
}

fn report(
    args: &Args,
    target: &str,
    draft: &str,
    tok: &Tokenizer,
    spec: &Generation,
    plain: &Generation,
) -> Result<()> {
    let (s, p) = (&spec.stats, &plain.stats);
    let speedup = if p.tokens_per_sec() > 0.0 { s.tokens_per_sec() / p.tokens_per_sec() } else { 0.0 };
    // Greedy and coupled runs must print plain decoding's text; other samples differ.
    let coupled = coupled(args)?;
    let same_text = (args.temperature == 0.0 || coupled).then(|| spec.tokens == plain.tokens);
    for (name, g) in [("plain", p), ("speculative", s)] {
        println!(
            "{name:<12}: prefill {} tokens ({} from the prefix cache) at {:.1} tok/s, first token after {:.3} s",
            g.prefill_tokens,
            g.prefix_hit_tokens,
            g.prefill_tok_s(),
            g.first_token_secs
        );
    }
    if let Some(first) = spec.logprobs.first() {
        let same = spec.logprobs == plain.logprobs;
        let shown: Vec<String> = spec
            .logprobs
            .iter()
            .take(5)
            .map(|l| format!("{:?} {:.4}", tok.decode(&[l.token]).unwrap_or_default(), l.logprob))
            .collect();
        println!(
            "logprobs    : {} (the first token's top: {:?}); the same as plain decoding's: {same}",
            shown.join(", "),
            first.top
        );
    }
    println!("plain       : {:6.1} tok/s ({} tokens)", p.tokens_per_sec(), p.new_tokens);
    println!("speculative : {:6.1} tok/s ({} tokens), speedup {speedup:.2}x", s.tokens_per_sec(), s.new_tokens);
    println!(
        "acceptance {:.3} (per position {:.3}), {:.2} tokens per target call, draft/target cost c = {:.3}, predicted S = {:.2}",
        s.acceptance_rate(),
        s.position_acceptance(),
        s.tokens_per_target_call(),
        s.cost_ratio(),
        s.predicted_speedup()
    );
    let by_depth: Vec<String> = s.acceptance_by_depth().iter().map(|a| format!("{a:.2}")).collect();
    println!("acceptance by drafting depth: {}", by_depth.join(" "));
    if grammar(args)?.is_some() {
        let ms = 1e3 * s.process_secs / s.new_tokens.max(1) as f64;
        println!(
            "grammar: {} of {} tokens forced (no model call), {ms:.2} ms a token in the matcher",
            s.forced_tokens, s.new_tokens
        );
        if args.json || args.json_schema.is_some() {
            let text = tok.decode(&spec.tokens)?;
            let valid = serde_json::from_str::<serde_json::Value>(text.trim()).is_ok();
            println!(
                "the output {} JSON",
                if valid { "is valid" } else { "is NOT valid (cut short by --max-new-tokens?)" }
            );
        }
    }
    let mode = if args.temperature == 0.0 { "greedy" } else { "coupled sampling" };
    match same_text {
        Some(true) => println!("{mode}: the speculative text equals plain decoding"),
        Some(false) => println!("{mode}: texts DIFFER\nplain text: {}", tok.decode(&plain.tokens)?),
        None => {
            println!("standard sampling: speculative and plain texts are different samples of the same distribution")
        }
    }
    if args.report_json {
        let summary = json!({
            "target": target, "draft": draft, "k": args.k.parse::<usize>().map_or_else(|_| json!(args.k), |k| json!(k)), "mean_k": s.mean_k(), "temperature": args.temperature,
            "new_tokens": s.new_tokens, "plain_tok_s": p.tokens_per_sec(), "spec_tok_s": s.tokens_per_sec(),
            "speedup": speedup, "acceptance_rate": s.acceptance_rate(), "position_acceptance": s.position_acceptance(),
            "tokens_per_target_call": s.tokens_per_target_call(), "cost_ratio": s.cost_ratio(),
            "predicted_speedup": s.predicted_speedup(), "greedy_match": same_text, "forced_tokens": s.forced_tokens, "coupled": coupled, "device": args.device, "kernels": specdec::cpu::kernels().to_string(),
        });
        println!("{summary}");
    }
    Ok(())
}

/// `ID=BIAS`.
fn parse_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let (id, bias) = s.split_once('=').ok_or_else(|| format!("expected ID=BIAS, got {s:?}"))?;
    Ok((id.trim().parse().map_err(|e| format!("{id}: {e}"))?, bias.trim().parse().map_err(|e| format!("{bias}: {e}"))?))
}
