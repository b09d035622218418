//! Runs a model on a device beside the same model on the CPU and reports how far apart they
//! are: the logits of the prompt (every row), of single-token steps, of one k+1-row
//! verification forward, and of that forward again after a rollback. Then greedy plain and
//! greedy speculative decoding (a layer-skip self-draft) on the device, which must agree.
//! Prints a JSON report; exits with 1 when a check fails.
//!
//! It needs no model but the 1.2 MB tinyllamas stories GGUF, so `scripts/gpu-check.sh` can run
//! it on a GPU machine that nothing larger reaches.
//!
//! `cargo run --release --features cuda --example device_check -- --device cuda`

use specdec::TokenModel;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::Parser;
use serde_json::json;
use specdec::sampling::argmax;
use specdec::{
    device, Llama, LlamaWeights, ModelFiles, Pair, PlainDecoder, SamplingConfig, SpeculativeDecoder, TargetModel,
    WeightFormat,
};

#[derive(Parser)]
struct Args {
    /// The device to compare with the CPU: cuda or cuda:N (cpu compares the CPU with itself).
    #[arg(long, default_value = "cuda")]
    device: String,
    /// A .gguf file or an HF folder [default: tinyllamas-stories-260k-f32.gguf from
    /// $SPECDEC_MODELS, ./models-cache or ../shared/models].
    #[arg(long)]
    model: Option<String>,
    /// Weight format on both devices: f32, stored, q8_0, q4_0, ….
    #[arg(long, default_value = "f32")]
    format: WeightFormat,
    /// Prompt text.
    #[arg(long, default_value = "Once upon a time, there was a little")]
    prompt: String,
    /// Drafted tokens per verification.
    #[arg(long, default_value_t = 4)]
    k: usize,
    /// New tokens for the decoding comparison.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Largest allowed difference between two logits, relative to the largest |logit| (at least 1).
    #[arg(long, default_value_t = 1e-3)]
    tolerance: f32,
}

const STORIES: &str = "tinyllamas-stories-260k-f32.gguf";

fn default_model() -> Result<String> {
    let dirs = [
        std::env::var_os("SPECDEC_MODELS").map(PathBuf::from),
        Some("models-cache".into()),
        Some("../shared/models".into()),
    ];
    let found = dirs.into_iter().flatten().map(|d| d.join(STORIES)).find(|p| p.is_file());
    let path = found.with_context(|| format!("{STORIES} not found: pass --model or set SPECDEC_MODELS"))?;
    Ok(path.to_string_lossy().into_owned())
}

/// The largest difference between two logit tables, relative to their largest magnitude.
fn distance(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().chain(b).fold(1f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

struct Checks {
    tolerance: f32,
    report: Vec<serde_json::Value>,
    failed: bool,
}

impl Checks {
    fn logits(&mut self, name: &str, a: &[f32], b: &[f32], vocab: usize) -> Result<()> {
        if a.len() != b.len() {
            bail!("{name}: {} vs {} logits", a.len(), b.len());
        }
        let d = distance(a, b);
        let argmax_same = a.chunks(vocab).zip(b.chunks(vocab)).all(|(x, y)| argmax(x).ok() == argmax(y).ok());
        let ok = d <= self.tolerance && argmax_same;
        self.failed |= !ok;
        self.report.push(json!({ "check": name, "ok": ok, "rel_max_diff": d, "argmax_same": argmax_same }));
        Ok(())
    }

    fn equal(&mut self, name: &str, a: &[u32], b: &[u32], required: bool) {
        let ok = a == b;
        let first_diff = a.iter().zip(b).position(|(x, y)| x != y);
        self.failed |= required && !ok;
        self.report.push(json!({ "check": name, "ok": ok, "required": required, "first_difference": first_diff }));
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => default_model()?,
    };
    let dev = device(&args.device)?;
    let files = ModelFiles::resolve(&model)?;
    let t = Instant::now();
    let (cpu_weights, tokenizer) = files.load(args.format, &Device::Cpu)?;
    let (dev_weights, _) = files.load(args.format, &dev)?;
    let load_secs = t.elapsed().as_secs_f64();
    let vocab = cpu_weights.config().vocab_size;
    let prompt = tokenizer.encode(&args.prompt)?;
    let mut checks = Checks { tolerance: args.tolerance, report: Vec::new(), failed: false };
    let (mut cpu, mut gpu) = (Llama::new(Arc::clone(&cpu_weights))?, Llama::new(Arc::clone(&dev_weights))?);

    // Prefill, every row: the multi-row path with the causal mask.
    let (a, b) = (cpu.forward(&prompt, prompt.len())?, gpu.forward(&prompt, prompt.len())?);
    checks.logits("prompt, all rows", a.as_slice(), b.as_slice(), vocab)?;

    // k+1 single-token steps along the CPU's greedy path: the one-row path.
    let mut next = argmax(a.row(a.rows() - 1))?;
    let (mut path, mut cpu_steps, mut dev_steps) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..=args.k {
        path.push(next);
        let (a, b) = (cpu.forward(&[next], 1)?, gpu.forward(&[next], 1)?);
        cpu_steps.extend_from_slice(a.as_slice());
        dev_steps.extend_from_slice(b.as_slice());
        next = argmax(a.as_slice())?;
    }
    checks.logits("single-token steps", &cpu_steps, &dev_steps, vocab)?;

    // Roll back and verify the same tokens in one forward, twice, as speculative decoding does.
    cpu.truncate(prompt.len())?;
    gpu.truncate(prompt.len())?;
    let (a, b) = (cpu.forward(&path, path.len())?, gpu.forward(&path, path.len())?);
    checks.logits("k+1-row verification", a.as_slice(), b.as_slice(), vocab)?;
    checks.logits("verification vs steps, device", b.as_slice(), &dev_steps, vocab)?;
    gpu.truncate(prompt.len())?;
    let again = gpu.forward(&path, path.len())?;
    checks.logits("verification after rollback, device", again.as_slice(), b.as_slice(), vocab)?;

    // Greedy decoding on the device: speculative must equal plain; the CPU's is reported.
    let (plain, plain_secs) = generate_plain(&dev_weights, &prompt, args.tokens)?;
    let (cpu_plain, _) = generate_plain(&cpu_weights, &prompt, args.tokens)?;
    let layers = dev_weights.config().num_layers;
    let draft = Llama::with_layers(Arc::clone(&dev_weights), (0..layers.div_ceil(2)).collect())?;
    let mut spec = SpeculativeDecoder::builder(Pair { target: Llama::new(Arc::clone(&dev_weights))?, draft })
        .k(args.k)
        .sampling(SamplingConfig::greedy())
        .max_new_tokens(args.tokens)
        .build()?;
    let t = Instant::now();
    let out = spec.generate(&prompt)?;
    let spec_secs = t.elapsed().as_secs_f64();
    checks.equal("greedy speculative == greedy plain, device", &out.tokens, &plain, true);
    checks.equal("greedy plain, device == CPU (near-ties may differ)", &plain, &cpu_plain, false);

    let report = json!({
        "device": args.device,
        "model": files.name(),
        "format": format!("{:?}", args.format),
        "load_secs": load_secs,
        "prompt_tokens": prompt.len(),
        "checks": checks.report,
        "plain_tokens_per_sec": plain.len() as f64 / plain_secs,
        "speculative_tokens_per_sec": out.tokens.len() as f64 / spec_secs,
        "speculative": out.stats.to_json(),
        "text": tokenizer.decode(&plain)?,
        "ok": !checks.failed,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    if checks.failed {
        std::process::exit(1);
    }
    Ok(())
}

fn generate_plain(weights: &Arc<LlamaWeights>, prompt: &[u32], tokens: usize) -> Result<(Vec<u32>, f64)> {
    let mut plain =
        PlainDecoder::new(Llama::new(Arc::clone(weights))?, SamplingConfig::greedy()).max_new_tokens(tokens);
    let t = Instant::now();
    let out = plain.generate(prompt)?;
    Ok((out.tokens, t.elapsed().as_secs_f64()))
}
