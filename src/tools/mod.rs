//! Tool-call speculation: run an agent's predicted next tool call while the agent is still
//! generating, and use the result only if the agent then makes exactly that call.
//!
//! Ji et al. (2026), *Speculate While You Reason* (arXiv 2607.25816), lift speculation from
//! tokens to tool calls. On a hit the tool's latency hides behind generation; on a miss the
//! speculative result is discarded and the real call runs, so the agent's actions are unchanged.
//! With hit rate α, ρ = T_tool/T_gen and σ = T_spec/T_gen the expected speedup is
//! S = (1 + ρ) / (1 + ρ + σ − α·min(1, ρ)) ([`speedup`]).
//!
//! Pre-execution is sound only for calls without side effects or safely replayable ones, so
//! every tool carries a [`Safety`] annotation and side-effecting tools are never pre-run.
//!
//! - [`call`]: [`ToolCall`], a name and canonical JSON arguments.
//! - [`registry`]: [`Registry`] of tools with their [`Safety`].
//! - [`speculator`]: the [`Speculator`] trait, [`HistoryPredictor`], [`ModelSpeculator`].
//! - [`executor`]: [`Executor`], which runs speculative calls on worker threads.
//! - [`stats`]: [`ToolStats`] and the closed form.
//!
//! # Example
//! ```
//! use serde_json::json;
//! use specdec::tools::{Executor, HistoryPredictor, Outcome, Registry, Safety, Speculator, ToolCall};
//!
//! let mut tools = Registry::new();
//! tools.register("search", Safety::ReadOnly, |args| Ok(json!(["doc for", args["q"].clone()])))?;
//! let mut exec = Executor::new(tools);
//! let mut predictor = HistoryPredictor::new();
//! let mut trajectory = Vec::new();
//! for _ in 0..3 {
//!     exec.speculate_next(&mut predictor, &trajectory)?;
//!     let actual = ToolCall::new("search", json!({"q": "rust"})); // what the agent generated
//!     let done = exec.execute(&actual)?;
//!     predictor.observe(&trajectory, &actual);
//!     trajectory.push(actual);
//!     println!("{:?}: {}", done.outcome, done.value);
//! }
//! assert_eq!(exec.stats().hits, 2); // the first turn had nothing to go on
//! # Ok::<(), specdec::Error>(())
//! ```

pub mod call;
pub mod executor;
pub mod registry;
pub mod speculator;
pub mod stats;

pub use call::ToolCall;
pub use executor::{Dispatch, Execution, Executor, Outcome};
pub use registry::{Registry, Safety, Tool, ToolFn};
pub use speculator::{HistoryPredictor, ModelSpeculator, Speculator};
pub use stats::{simulate_speedup, speedup, wall_clock_reduction, ToolStats};
