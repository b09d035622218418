//! # specdec: exact speculative decoding on candle
//!
//! A small, cheap **draft** proposes `k` tokens; the **target** scores all `k + 1` positions in
//! one forward pass; each drafted token `t ~ q` is accepted with probability `min(1, p(t)/q(t))`;
//! at the first rejection a replacement is drawn from the residual `max(0, p − q)/Σ`; if all `k`
//! pass, one bonus token comes from the target's last row. The tokens emitted are distributed
//! exactly as if the target had sampled alone, so the only change is speed.
//!
//! References: Leviathan, Kalman and Matias, *Fast Inference from Transformers via Speculative
//! Decoding*, ICML 2023 (arXiv 2211.17192); Chen et al., *Accelerating Large Language Model
//! Decoding with Speculative Sampling*, 2023 (arXiv 2302.01318).
//!
//! ## Quick start (toy models)
//! ```
//! use specdec::{toy::MarkovModel, SamplingConfig, SpeculativeDecoder};
//!
//! // A target and a noisy copy of it as the draft, over 32 tokens (a `Pair`).
//! let pair = MarkovModel::pair(32, 0.1, 42);
//! let sampling = SamplingConfig::new(0.8)?.with_top_p(0.95)?.with_seed(7);
//! let mut decoder = SpeculativeDecoder::builder(pair)
//!     .k(4)
//!     .sampling(sampling)
//!     .max_new_tokens(64)
//!     .build()?;
//! let out = decoder.generate(&[0, 5, 9])?;
//! assert_eq!(out.tokens.len(), 64);
//! println!("α = {:.2}, {:.2} tokens per target call", out.stats.acceptance_rate(),
//!          out.stats.tokens_per_target_call());
//! # Ok::<(), specdec::Error>(())
//! ```
//!
//! ## Real models
//! ```no_run
//! use std::ops::ControlFlow;
//!
//! use specdec::{
//!     Drafter, DrafterSpec, Llama, ModelFiles, Pair, SamplingConfig, SpeculativeDecoder, TextStream, WeightFormat,
//! };
//!
//! // A GGUF file, an HF folder (config.json, tokenizer.json, *.safetensors) or a hub id
//! // written `hf:org/name`.
//! let files = ModelFiles::resolve("models-cache/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let device = specdec::device("cpu")?;
//! let (target, tokenizer) = files.load(WeightFormat::F32, &device)?;
//! let mut target = Llama::new(target)?;
//! // The draft: the file's own quantized weights (or "ngram", "layerskip:12", "quant:q8_0",
//! // or a head on the target's hidden states: "eagle:DIR", "eagle3:DIR", "medusa:DIR").
//! let drafter = Drafter::build(&"model".parse::<DrafterSpec>()?, &files, &mut target, &tokenizer, &device)?;
//! // k adapts by default: up to 8, plain decoding where drafting does not pay.
//! let mut decoder = SpeculativeDecoder::builder(Pair { target, draft: drafter })
//!     .sampling(SamplingConfig::new(0.8)?.with_seed(7))
//!     .stop_tokens(tokenizer.stop_ids())
//!     .build()?;
//! let prompt = tokenizer.encode(&tokenizer.chat_prompt("Tell me about the sea."))?;
//! // Text by `TextStream`, which holds back the bytes of unfinished characters (a chunk decoded
//! // alone can end inside one); `ControlFlow::Break(())` stops the generation.
//! let mut text = TextStream::new();
//! let out = decoder.generate_with(&prompt, |new: &[u32]| match text.push(&tokenizer, new) {
//!     Ok(piece) => {
//!         print!("{piece}");
//!         ControlFlow::Continue(())
//!     }
//!     Err(_) => ControlFlow::Break(()),
//! })?;
//! println!("\n{} tokens", out.tokens.len());
//! # Ok::<(), specdec::Error>(())
//! ```
//!
//! ## Where things are
//! - [`kernel`]: the accept/reject rule on probability rows (pure, RNG passed in).
//! - [`sampling`]: temperature, top-k, top-p, applied alike to draft and target; coupled noise.
//! - [`tree`]: trees of drafts ([`DraftTree`], [`TreeBudget`]) and a tree call's layout
//!   ([`TreeShape`]).
//! - [`model`]: the [`TargetModel`] and [`DraftModel`] traits, and [`Vocabulary`] (a
//!   tokenizer as a cross-vocabulary drafter reads it).
//! - [`decoder`]: [`SpeculativeDecoder`]; [`plain`]: [`PlainDecoder`], the baseline; [`stop`]:
//!   [`StopRule`].
//! - [`batch`]: [`BatchDecoder`], several sequences per target pass, and [`KPolicy`], the
//!   k of each that pays at the batch's size.
//! - [`draft`]: [`NGramDraft`] (prompt lookup), [`LookupOr`] (lookup where it matches, a
//!   model elsewhere) and [`CrossVocabDraft`] (a draft model with another tokenizer).
//! - [`prefix`]: [`PrefixCache`], the models' states for prompts and outputs seen before,
//!   so that a resent conversation is prefilled once.
//! - [`adaptive`]: choosing k each round ([`KPolicy`], [`KController`]).
//! - [`stats`]: counters, timings, the [`Clock`] they are read on, and the seed's speedup
//!   formulas.
//! - `models`: the llama-family model, `Llama`, on two engines: `models::native` (our own CPU
//!   kernels: small-M f32 and quantized products, a thread team) and candle (any device).
//! - `loading`, `tokenizer`: GGUF, safetensors folders, the hub cache; tokenizers.
//! - `heads`: EAGLE-1/2, EAGLE-3 and Medusa draft heads on the target's hidden states.
//! - `drafter`: `Drafter`, the drafter chosen at run time from a `DrafterSpec`.
//! - `tools`: tool-call speculation for agent loops.
//! - `serve`: a scheduler thread owning a [`BatchDecoder`], requests from any thread with
//!   streams of events, limits, metrics (the HTTP server is the `specdec-server` crate).
//! - [`toy`]: Markov-chain models for tests and simulation.
//!
//! ## Layers
//! Each module imports only the modules listed before it (tests aside; `tests/layers.rs`
//! checks this list against the sources):
//! 1. `error`, `cpu`, `stats`, `math`, `stop`, `pair`;
//! 2. `sampling`, then `kernel`, then `tree`, then `model` (the traits), then `prefix` (the
//!    prefix cache), then `toy`;
//! 3. `adaptive`, `draft`;
//! 4. `decoder` (with `Sequence`, the sequence engine every decoder runs), then `plain` and
//!    `batch`;
//! 5. `models`, `chat`, `tokenizer`, then `grammar`, `loading`, then `heads`, then `drafter`;
//! 6. `tools`, `serve`.
//!
//! ## Features
//! All on by default, so that the README's commands work as written:
//! - `models`: `Llama` on candle and the native engine (candle-core, candle-nn);
//! - `llama`: loading GGUF files and safetensors folders, tokenizers, `Drafter` (tokenizers,
//!   safetensors);
//! - `hub`: models and heads named by a hub id, `hf:org/name` (hf-hub);
//! - `heads`: draft heads; `train`: training them;
//! - `tools`: tool-call speculation;
//! - `grammar`: grammars as logits processors (llguidance);
//! - `serve`: the serving scheduler;
//! - `cuda` (off by default): candle's CUDA backend.
//!
//! With `default-features = false` the crate is the decoders, the kernel, the traits, the
//! n-gram drafters and the toy models, built without candle, tokenizers or hf-hub.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[macro_use]
pub(crate) mod math;

pub mod adaptive;
pub mod batch;
#[cfg(feature = "llama")]
pub mod chat;
pub mod cpu;
pub mod decoder;
pub mod draft;
#[cfg(feature = "llama")]
pub mod drafter;
pub mod error;
#[cfg(feature = "grammar")]
pub mod grammar;
#[cfg(feature = "heads")]
pub mod heads;
pub mod kernel;
#[cfg(feature = "llama")]
pub mod loading;
pub mod model;
#[cfg(feature = "models")]
pub mod models;
mod pair;
pub mod plain;
pub mod prefix;
pub mod sampling;
#[cfg(feature = "serve")]
pub mod serve;
pub mod stats;
pub mod stop;
#[cfg(feature = "llama")]
pub mod tokenizer;
#[cfg(feature = "tools")]
pub mod tools;
pub mod toy;
pub mod tree;

pub use adaptive::{KController, KPolicy, RoundReport, ShapeChooser, TreePolicy};
pub use batch::{BatchDecoder, Request, SeqId};
pub use decoder::{DecoderBuilder, SpeculativeDecoder};
pub use draft::{CrossMethod, CrossVocabDraft, LookupOr, NGramDraft, SuffixCache, SuffixDraft, VocabMap, VocabPair};
#[cfg(feature = "llama")]
pub use drafter::{Drafter, DrafterSpec, DRAFT_VOCAB};
pub use error::{Error, Result};
#[cfg(feature = "llama")]
pub use loading::{check_compatible, device, ModelFiles};
pub use model::{DraftModel, KvRows, Logits, Proposal, TargetModel, TokenModel, Vocabulary};
#[cfg(feature = "models")]
pub use models::{Engine, Llama, LlamaConfig, LlamaWeights, WeightFormat};
pub use pair::Pair;
pub use plain::PlainDecoder;
pub use prefix::{PrefixCache, PrefixStats};
pub use sampling::{History, LogitsProcessor, LogprobMode, Logprobs, SamplingConfig};
pub use stats::{Clock, FinishReason, Generation, Stats, TokenLogprob};
pub use stop::StopRule;
#[cfg(feature = "llama")]
pub use tokenizer::{TextStream, Tokenizer};
pub use tree::{DraftTree, TreeBudget, TreeCall, TreeShape};

/// The README's Rust code, compiled as doctests so that it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's Rust code (docs/guide.md), compiled as doctests too.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;
