//! Trains draft heads for a target by self-distillation, on the CPU: the target answers a set
//! of prompts, its final hidden states and its own top-1 predictions are recorded, and an
//! EAGLE-1 head (feature regression + cross-entropy, unrolled over a few drafting depths, with
//! noise on the input states) and Medusa-1 heads (cross-entropy per head) learn them. The heads
//! are written in the published formats (`config.json` + `model.safetensors` for EAGLE,
//! `config.json` + `medusa_lm_head.safetensors` for Medusa), with `report.json` holding the
//! training curve. `scripts/train-heads.sh` runs it.
//!
//! `cargo run --release --example train_heads -- --out models-cache/heads --prompts-limit 40`

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use clap::Parser;
use serde_json::json;
use specdec::heads::train::{self, HeadKind, Sample, TrainOptions, Trainable, Vocab};
use specdec::heads::{EagleVersion, TargetParts};
use specdec::models::Linear;
use specdec::models::Tap;
use specdec::{
    Drafter, DrafterSpec, Llama, ModelFiles, Pair, SamplingConfig, SpeculativeDecoder, Tokenizer, WeightFormat,
};

#[derive(Parser)]
struct Args {
    /// The target: a .gguf file or an HF folder (its f32 weights are the teacher).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/models-cache/SmolLM2-135M-Instruct.Q4_1.gguf"))]
    target: String,
    /// One prompt per line.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/train-prompts.txt"))]
    prompts: String,
    /// Use only the first N prompts.
    #[arg(long)]
    prompts_limit: Option<usize>,
    /// Tokens the target writes per prompt.
    #[arg(long, default_value_t = 128)]
    tokens_per_prompt: usize,
    /// Folder for the heads: `eagle/` and `medusa/` are written inside.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/models-cache/heads"))]
    out: PathBuf,
    /// Passes over the training sequences.
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    /// Peak learning rate (linear warm-up over 5 % of the steps, then linear decay).
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Drafting depths the EAGLE loss unrolls.
    #[arg(long, default_value_t = 2)]
    unroll: usize,
    /// Weight of the cross-entropy beside the feature regression (EAGLE uses 0.1).
    #[arg(long, default_value_t = 0.1)]
    ce_weight: f64,
    /// Half-width of the uniform noise added to the target's states the head reads.
    #[arg(long, default_value_t = 0.05)]
    noise: f64,
    /// Passes for the Medusa heads (default: --epochs).
    #[arg(long)]
    medusa_epochs: Option<usize>,
    /// Also train on this many tokens of Markdown text (the crates Cargo.lock names, from the
    /// local cargo registry: the same files on every machine that built this crate), in chunks
    /// of 256 tokens, read by the target in one pass each (no generation): more data than
    /// generation can make in the time.
    #[arg(long, default_value_t = 0)]
    corpus_tokens: usize,
    /// Train nothing: report the held-out accuracy of the heads already in --out (the data come
    /// from --data).
    #[arg(long)]
    eval_only: bool,
    /// Score against the target's top-1 only, not its whole next-token distribution.
    #[arg(long)]
    hard_labels: bool,
    /// Also train an EAGLE-3 head (over the data's tokens as its draft vocabulary).
    #[arg(long)]
    eagle3: bool,
    /// Medusa heads to train (0: none).
    #[arg(long, default_value_t = 3)]
    medusa_heads: usize,
    /// Answers per prompt: the first greedy, the others at temperature 0.8.
    #[arg(long, default_value_t = 1)]
    answers: usize,
    /// A file caching the generated data (read when it exists, written when not).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Every how many sequences one is held out for evaluation.
    #[arg(long, default_value_t = 10)]
    holdout_every: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let device = Device::Cpu;
    let files = ModelFiles::resolve(&args.target)?;
    let (weights, tok) = files.load(WeightFormat::F32, &device).with_context(|| format!("loading {}", args.target))?;
    let parts = TargetParts::from_weights(&weights, &device)?;
    let started = Instant::now();
    let samples = match &args.data {
        Some(path) if path.is_file() => with_prompt_lens(load_samples(path)?, &args, &tok)?,
        data => {
            let samples = generate(&args, &files, &weights, &tok, &device)?;
            if let Some(path) = data {
                save_samples(path, &samples)?;
            }
            samples
        }
    };
    let data_secs = started.elapsed().as_secs_f64();
    let (train, held): (Vec<_>, Vec<_>) =
        samples.into_iter().enumerate().partition(|(i, _)| (i + 1) % args.holdout_every.max(2) != 0);
    let (train, held): (Vec<Sample>, Vec<Sample>) =
        (train.into_iter().map(|p| p.1).collect(), held.into_iter().map(|p| p.1).collect());
    if args.eval_only {
        return evaluate(&args, &weights, &parts, &held);
    }
    let mut train = train;
    if args.corpus_tokens > 0 {
        let t0 = Instant::now();
        let mut teacher = Llama::new(weights.clone())?;
        let chunks = corpus(&tok, args.corpus_tokens)?;
        for c in &chunks {
            train.push(Sample::record(&mut teacher, c, &[Tap::Final])?);
        }
        println!(
            "corpus: {} chunks of Markdown read by the target in {:.0} s",
            chunks.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    let tokens: usize = train.iter().map(|s| s.tokens.len()).sum();
    let held_tokens: usize = held.iter().map(|s| s.tokens.len()).sum();
    println!(
        "data: {} training sequences ({tokens} tokens), {} held out ({held_tokens} tokens), {data_secs:.0} s",
        train.len(),
        held.len()
    );
    let vocab = Vocab::of(&train);
    println!(
        "training softmax over the {} tokens the data holds or the target predicts (of {})",
        vocab.tokens().len(),
        parts.config().vocab_size
    );
    let o = TrainOptions {
        epochs: args.epochs,
        lr: args.lr,
        unroll: args.unroll,
        ce_weight: args.ce_weight,
        noise: args.noise,
        soft: !args.hard_labels,
        seed: args.seed,
    };
    let eagle = train_head(&args, HeadKind::Eagle(EagleVersion::One), &parts, &vocab, &train, &held, &o)?;
    let medusa = match args.medusa_heads {
        0 => None,
        k => Some(train_head(
            &args,
            HeadKind::Medusa(k),
            &parts,
            &vocab,
            &train,
            &held,
            &TrainOptions { epochs: args.medusa_epochs.unwrap_or(args.epochs), ..o },
        )?),
    };
    let eagle3 = match args.eagle3 {
        false => None,
        true => {
            // EAGLE-3 reads three residual streams: record them along the same sequences.
            let mut target = Llama::new(weights.clone())?;
            let l = weights.config().num_layers;
            let taps = [Tap::Residual(2), Tap::Residual(l / 2), Tap::Residual(l - 3)];
            let mut again = |set: &[Sample]| -> Result<Vec<Sample>> {
                set.iter()
                    .map(|s| Ok(Sample { prompt_len: s.prompt_len, ..Sample::record(&mut target, &s.tokens, &taps)? }))
                    .collect()
            };
            let (train3, held3) = (again(&train)?, again(&held)?);
            Some(train_head(&args, HeadKind::Eagle(EagleVersion::Three), &parts, &vocab, &train3, &held3, &o)?)
        }
    };
    let report = json!({
        "target": files.name(), "kernels": specdec::cpu::kernels().to_string(),
        "train_sequences": train.len(), "train_tokens": tokens, "heldout_sequences": held.len(), "heldout_tokens": held_tokens,
        "data_secs": data_secs, "eagle": eagle, "medusa": medusa, "eagle3": eagle3, "args": format!("{:?}", std::env::args().collect::<Vec<_>>()),
    });
    std::fs::write(args.out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    println!("wrote {} ({:.0} s in all)", args.out.display(), started.elapsed().as_secs_f64());
    Ok(())
}

/// The target answers the prompts (greedy, and at temperature 0.8 for further answers;
/// decoded speculatively with its own quantized weights, which leaves the output exact), then
/// one pass over each sequence records its states and its own top-1 predictions.
fn generate(
    args: &Args,
    files: &ModelFiles,
    weights: &std::sync::Arc<specdec::LlamaWeights>,
    tok: &Tokenizer,
    device: &Device,
) -> Result<Vec<Sample>> {
    let text = std::fs::read_to_string(&args.prompts).with_context(|| format!("reading {}", args.prompts))?;
    let prompts: Vec<&str> =
        text.lines().filter(|l| !l.trim().is_empty()).take(args.prompts_limit.unwrap_or(usize::MAX)).collect();
    let stop = tok.stop_ids();
    let mut decoders = Vec::new();
    for temp in [0.0, 0.8] {
        let mut verifier = Llama::new(weights.clone())?;
        let drafter = Drafter::build(&DrafterSpec::Model(None), files, &mut verifier, tok, device)?;
        let dec = SpeculativeDecoder::builder(Pair { target: verifier, draft: drafter })
            .sampling(SamplingConfig::new(temp)?.with_seed(args.seed))
            .max_new_tokens(args.tokens_per_prompt)
            .stop_tokens(stop.clone())
            .build()?;
        decoders.push(dec);
    }
    let mut teacher = Llama::new(weights.clone())?;
    let mut samples = Vec::with_capacity(prompts.len() * args.answers);
    for (i, p) in
        prompts.iter().enumerate().flat_map(|(i, p)| (0..args.answers).map(move |a| (i * args.answers + a, p)))
    {
        let prompt = tok.encode(&tok.chat_prompt(p))?;
        let out = decoders[usize::from(i % args.answers != 0)].generate(&prompt)?;
        let out_len = out.tokens.len();
        let tokens = [prompt, out.tokens].concat();
        let prompt_len = tokens.len() - out_len;
        samples.push(Sample { prompt_len, ..Sample::record(&mut teacher, &tokens, &[Tap::Final])? });
        if (i + 1) % 40 == 0 {
            println!("  {} / {} answers", i + 1, prompts.len() * args.answers);
        }
    }
    Ok(samples)
}

/// Trains one head, printing its held-out accuracy after each pass, and writes it under
/// `--out`. Returns its report: the curve, the file's size and where it is.
#[allow(clippy::too_many_arguments)]
fn train_head(
    args: &Args,
    kind: HeadKind,
    parts: &TargetParts,
    vocab: &Vocab,
    train: &[Sample],
    held: &[Sample],
    o: &TrainOptions,
) -> Result<serde_json::Value> {
    let head = Trainable::new(kind, parts, vocab)?;
    // Training reads the softmax over `vocab`; evaluation the whole vocabulary.
    let cut = match kind {
        HeadKind::Eagle(EagleVersion::Three) => parts.clone(),
        _ => vocab.cut(parts)?,
    };
    let labels: Vec<Vec<u32>> = train.iter().map(|s| vocab.remap(&s.labels)).collect();
    let (name, dir) = match kind {
        HeadKind::Eagle(EagleVersion::One) => ("eagle", "eagle"),
        HeadKind::Eagle(EagleVersion::Three) => ("eagle3", "eagle3"),
        HeadKind::Medusa(_) => ("medusa", "medusa"),
        other => anyhow::bail!("no output folder for {other:?}"),
    };
    let (mut curve, started) = (Vec::new(), Instant::now());
    let mut report = |epoch: usize, loss: f64| -> specdec::Result<()> {
        let acc = match (head.eagle(parts)?, head.medusa(parts)?) {
            (Some(e), _) => train::eagle_accuracy(&e, held, 4)?,
            (_, Some(m)) => train::medusa_accuracy(&m, held)?,
            _ => Vec::new(),
        };
        let point = json!({ "epoch": epoch + 1, "train_loss": loss, "heldout_top1": acc, "secs": started.elapsed().as_secs_f64() });
        println!("{name} {point}");
        curve.push(point);
        Ok(())
    };
    if let Some(e) = head.eagle(&cut)? {
        train::fit(&head, train.len(), o, |i, rng| train::eagle_loss(&e, &train[i], &labels[i], o, rng), &mut report)?;
    } else if let Some(m) = head.medusa(&cut)? {
        let teacher = Linear::from_f32(cut.output(), None)?;
        train::fit(
            &head,
            train.len(),
            o,
            |i, _| train::medusa_loss(&m, &teacher, &train[i], &labels[i], o),
            &mut report,
        )?;
    }
    let path = args.out.join(dir);
    let bytes = head.save(&path)?;
    println!("{name}: {} ({:.1} MB)", path.display(), bytes as f64 / 1e6);
    Ok(json!({ "curve": curve, "file_bytes": bytes, "path": path }))
}

/// Writes the samples as one safetensors file (tokens, labels and states concatenated, with
/// each sample's length).
fn save_samples(path: &std::path::Path, samples: &[Sample]) -> Result<()> {
    let lens: Vec<u32> = samples.iter().map(|s| s.tokens.len() as u32).collect();
    let prompts: Vec<u32> = samples.iter().map(|s| s.prompt_len as u32).collect();
    let tokens: Vec<u32> = samples.iter().flat_map(|s| s.tokens.iter().copied()).collect();
    let labels: Vec<u32> = samples.iter().flat_map(|s| s.labels.iter().copied()).collect();
    let states = Tensor::cat(&samples.iter().map(|s| &s.states).collect::<Vec<_>>(), 0)?;
    let map: HashMap<String, Tensor> = [
        ("lens".to_string(), Tensor::new(&lens[..], &Device::Cpu)?),
        ("prompt_lens".to_string(), Tensor::new(&prompts[..], &Device::Cpu)?),
        ("tokens".to_string(), Tensor::new(&tokens[..], &Device::Cpu)?),
        ("labels".to_string(), Tensor::new(&labels[..], &Device::Cpu)?),
        ("states".to_string(), states),
    ]
    .into();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    candle_core::safetensors::save(&map, path)?;
    Ok(())
}

fn load_samples(path: &std::path::Path) -> Result<Vec<Sample>> {
    let map = candle_core::safetensors::load(path, &Device::Cpu)?;
    let get = |n: &str| map.get(n).with_context(|| format!("{}: no `{n}`", path.display()));
    let lens = get("lens")?.to_vec1::<u32>()?;
    // Files written before prompt lengths were kept count every position.
    let prompts = get("prompt_lens").and_then(|t| Ok(t.to_vec1::<u32>()?)).unwrap_or_else(|_| vec![0; lens.len()]);
    let (tokens, labels, states) = (get("tokens")?.to_vec1::<u32>()?, get("labels")?.to_vec1::<u32>()?, get("states")?);
    let mut at = 0;
    let mut out = Vec::with_capacity(lens.len());
    for (len, prompt_len) in lens.into_iter().map(|l| l as usize).zip(prompts) {
        out.push(Sample {
            prompt_len: prompt_len as usize,
            tokens: tokens[at..at + len].to_vec(),
            labels: labels[at..at + len].to_vec(),
            states: states.narrow(0, at, len)?,
        });
        at += len;
    }
    println!("data: read {} sequences from {}", out.len(), path.display());
    Ok(out)
}

/// Samples read from a file written before prompt lengths were kept get them from the prompts
/// (one answer each, in order).
fn with_prompt_lens(mut samples: Vec<Sample>, args: &Args, tok: &Tokenizer) -> Result<Vec<Sample>> {
    if samples.iter().any(|s| s.prompt_len > 0) {
        return Ok(samples);
    }
    let text = std::fs::read_to_string(&args.prompts)?;
    let prompts: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    for (i, s) in samples.iter_mut().enumerate() {
        if let Some(p) = prompts.get(i / args.answers.max(1)) {
            let ids = tok.encode(&tok.chat_prompt(p))?;
            if s.tokens.starts_with(&ids) {
                s.prompt_len = ids.len();
            }
        }
    }
    Ok(samples)
}

/// Up to `max` tokens of the Markdown files (READMEs, docs; no changelogs or licences) of the
/// crates `Cargo.lock` names, found in the local cargo registry, in sorted order, each file
/// once, cut into chunks of 256 tokens.
fn corpus(tok: &Tokenizer, max: usize) -> Result<Vec<Vec<u32>>> {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))?;
    let mut crates: Vec<String> = Vec::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            crates.push(format!("{n}-{}", v.trim_matches('"')));
        }
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"));
    let mut files = Vec::new();
    for index in std::fs::read_dir(home.join("registry/src"))?.filter_map(|e| e.ok()) {
        for c in &crates {
            markdown_files(&index.path().join(c), &mut files);
        }
    }
    files.sort();
    let (mut seen, mut chunks, mut total) = (std::collections::HashSet::new(), Vec::new(), 0);
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        if !seen.insert(text.clone()) {
            continue;
        }
        for chunk in tok.encode(&text)?.chunks(256).filter(|c| c.len() >= 32) {
            if total >= max {
                return Ok(chunks);
            }
            total += chunk.len();
            chunks.push(chunk.to_vec());
        }
    }
    Ok(chunks)
}

fn markdown_files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(|e| e.ok()) {
        let path = e.path();
        let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        let skip = ["changelog", "license", "licence", "contributing", "code_of_conduct", "security"];
        if path.is_dir() {
            markdown_files(&path, out);
        } else if name.ends_with(".md") && !skip.iter().any(|s| name.contains(s)) {
            out.push(path);
        }
    }
}

/// Held-out top-1 agreement (on the target's own tokens after the prompts) of the heads in
/// `--out`, with the draft vocabularies they carry.
fn evaluate(
    args: &Args,
    weights: &std::sync::Arc<specdec::LlamaWeights>,
    parts: &TargetParts,
    held: &[Sample],
) -> Result<()> {
    use specdec::heads::{EagleHead, HeadFiles, MedusaHead};
    let dir = |k: &str| args.out.join(k).to_string_lossy().into_owned();
    let mut report = serde_json::Map::new();
    if let Ok(files) = HeadFiles::open(&dir("eagle"), &Device::Cpu) {
        let head = EagleHead::load(files, EagleVersion::One, parts, false)?;
        report.insert("eagle".into(), json!(train::eagle_accuracy(&head, held, 4)?));
    }
    if let Ok(files) = HeadFiles::open(&dir("medusa"), &Device::Cpu) {
        report.insert("medusa".into(), json!(train::medusa_accuracy(&MedusaHead::load(files, parts, false)?, held)?));
    }
    if let Ok(files) = HeadFiles::open(&dir("eagle3"), &Device::Cpu) {
        let head = EagleHead::load(files, EagleVersion::Three, parts, false)?;
        let mut target = Llama::new(weights.clone())?;
        let held3: Vec<Sample> = held
            .iter()
            .map(|s| Ok(Sample { prompt_len: s.prompt_len, ..Sample::record(&mut target, &s.tokens, head.taps())? }))
            .collect::<Result<_>>()?;
        report.insert("eagle3".into(), json!(train::eagle_accuracy(&head, &held3, 4)?));
    }
    println!("held-out top-1 by depth/head, on generated tokens: {}", serde_json::Value::Object(report));
    Ok(())
}
