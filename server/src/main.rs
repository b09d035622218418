//! `specdec-server`: an OpenAI-compatible server for one model, speculative by default.
//!
//! ```sh
//! cargo run --release -p specdec-server                     # SmolLM2-135M (f32), its Q4_1 weights drafting
//! cargo run --release -p specdec-server -- \
//!   --target models-cache/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
//!   --draft models-cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use specdec::draft::suffix_cache::DEFAULT_CAPACITY;
use specdec::serve::{ServeConfig, Server};
use specdec::{Drafter, DrafterSpec, KPolicy, Llama, ModelFiles, SuffixCache, WeightFormat};
use specdec_server::{router, State};

#[derive(Parser, Debug)]
#[command(about = "An OpenAI-compatible server on specdec: continuous batching, speculative decoding")]
struct Args {
    /// The target: a GGUF file, a safetensors folder or `hf:org/name` (default: the fetched
    /// SmolLM2-135M-Instruct file in f32, drafting with its own Q4_1 weights).
    #[arg(long)]
    target: Option<String>,
    /// Weight format of the target: auto (as stored; f32 for the default model), stored, f32,
    /// q4_0, q4_1, q8_0, …
    #[arg(long, default_value = "auto")]
    target_format: String,
    /// A draft model file (`PATH@stored` keeps its weights as stored).
    #[arg(long)]
    draft: Option<String>,
    /// How to draft: model, suffix, suffix+model, ngram, ngram+model, plain (no speculation).
    /// Default: model with a draft model, suffix without one.
    #[arg(long)]
    drafter: Option<String>,
    /// k policy: auto (the batch-aware adaptive k), auto:MAX, or a fixed k.
    #[arg(long, default_value = "auto")]
    k: String,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Name clients give as `model` (default: the target file's name).
    #[arg(long)]
    model_name: Option<String>,
    /// Most sequences generating at once.
    #[arg(long, default_value_t = 8)]
    max_running: usize,
    /// Most requests waiting for a slot (past it: 429).
    #[arg(long, default_value_t = 64)]
    max_queued: usize,
    /// Context of a request, prompt and output (default: the model's, at most 8192).
    #[arg(long)]
    ctx: Option<usize>,
    /// `max_tokens` of a request that gives none.
    #[arg(long, default_value_t = 1024)]
    default_max_tokens: usize,
    /// The most text deltas a stream holds for a client that does not read them (beyond the
    /// socket's buffers); a client further behind has its request ended (at least 1).
    #[arg(long, default_value_t = 1024)]
    stream_buffer: usize,
    /// The prefix cache's budget in MiB (0: none): both models' states for earlier prompts
    /// and answers, so that a resent conversation prefills only what is new (same output).
    #[arg(long, default_value_t = 1024)]
    prefix_cache_mb: usize,
    /// Most prompt tokens prefilled per step while other streams decode (0: a prompt is
    /// prefilled whole when admitted, stalling the others meanwhile).
    #[arg(long, default_value_t = 32)]
    prefill_chunk: usize,
    /// A suffix-drafting cache file: loaded at start if it exists, saved at shutdown.
    #[arg(long)]
    suffix_cache: Option<PathBuf>,
    /// Stops after this many seconds without a request (for tests and scripts; 0: never).
    #[arg(long, default_value_t = 0)]
    idle_exit: u64,
    /// Device: cpu, cuda, cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
}

const LOCAL_SMOLLM2: &str = "models-cache/SmolLM2-135M-Instruct.Q4_1.gguf";

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let device = specdec::device(&args.device)?;
    let default_target = args.target.is_none();
    let target_spec = args.target.clone().unwrap_or_else(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        root.join(LOCAL_SMOLLM2).display().to_string()
    });
    let files = ModelFiles::resolve(&target_spec).with_context(|| format!("the target {target_spec}"))?;
    let format: WeightFormat = match (args.target_format.as_str(), default_target) {
        ("auto", true) => WeightFormat::F32,
        ("auto", false) => WeightFormat::Stored,
        (f, _) => f.parse()?,
    };
    let (weights, tokenizer) = files.load(format, &device).with_context(|| format!("loading {target_spec}"))?;
    let spec: DrafterSpec = match (args.drafter.as_deref(), &args.draft) {
        (Some("plain"), _) => DrafterSpec::NGram,
        (Some("suffix+model"), d) => DrafterSpec::SuffixModel(d.clone()),
        (Some("ngram+model"), d) => DrafterSpec::LookupModel(d.clone()),
        (Some("model") | None, Some(d)) => DrafterSpec::Model(Some(d.clone())),
        (Some("model"), None) => DrafterSpec::Model(None),
        (None, None) if default_target => DrafterSpec::Model(None),
        (None, None) => DrafterSpec::Suffix,
        (Some(other), _) => other.parse()?,
    };
    let mut verifier = Llama::new(weights.clone())?;
    let mut proto = Drafter::build(&spec, &files, &mut verifier, &tokenizer, &device)?;
    if let Some(path) = args.suffix_cache.as_ref().filter(|p| p.exists()) {
        let cache = SuffixCache::load(path, weights.config().vocab_size, DEFAULT_CAPACITY)?;
        proto.use_suffix_cache(cache)?;
    }
    let cache = proto.suffix_cache();
    proto.fork().context("the server runs one drafter per sequence")?;
    let policy: KPolicy = if args.drafter.as_deref() == Some("plain") { KPolicy::Plain } else { args.k.parse()? };
    let mut config = ServeConfig::default();
    (config.max_running, config.max_queued, config.policy) = (args.max_running, args.max_queued, policy);
    config.prefix_cache_bytes = args.prefix_cache_mb << 20;
    config.prefill_chunk = (args.prefill_chunk > 0).then_some(args.prefill_chunk);
    let context = args.ctx.unwrap_or(weights.config().max_context.min(8192)).min(weights.config().max_context);
    let vocab = weights.config().vocab_size;
    let models = move || Ok((Llama::new(weights.clone())?, proto.fork()?));
    let server = Server::start(config, Some(tokenizer.clone()), models)?;
    let name = args.model_name.clone().unwrap_or_else(|| files.name());
    let mut state = State::new(server, tokenizer, name.clone(), vocab, context);
    state.default_max_tokens = args.default_max_tokens;
    anyhow::ensure!(args.stream_buffer > 0, "--stream-buffer must be at least 1");
    state.stream_buffer = args.stream_buffer;
    let state = Arc::new(state);

    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await?;
    let addr: SocketAddr = listener.local_addr()?;
    println!(
        "specdec-server: {name}, drafter {spec}, k {}, context {context}, prefix cache {} MiB",
        policy, args.prefix_cache_mb
    );
    println!("listening on http://{addr}");
    let idle = idle_exit(state.clone(), args.idle_exit);
    axum::serve(listener, router(state.clone()))
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = idle => {}
            }
        })
        .await?;
    if let (Some(path), Some(cache)) = (&args.suffix_cache, cache) {
        cache.save(path).with_context(|| format!("saving the suffix cache to {}", path.display()))?;
        println!("suffix cache saved to {} ({} tokens)", path.display(), cache.tokens());
    }
    Ok(())
}

/// Resolves after `secs` seconds with no request running or arriving (never for 0).
async fn idle_exit(state: Arc<State>, secs: u64) {
    if secs == 0 {
        return std::future::pending().await;
    }
    let (mut last, mut quiet) = (u64::MAX, 0);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let m = state.server.metrics();
        if m.requests != last || m.running > 0 || m.queued > 0 {
            (last, quiet) = (m.requests, 0);
        } else {
            quiet += 1;
        }
        if quiet >= secs {
            println!("no request for {secs} s: stopping");
            return;
        }
    }
}
