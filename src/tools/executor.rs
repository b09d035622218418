//! Runs the predicted call on a worker thread while the agent generates, and serves the agent's
//! actual call from it only when the two are canonically equal.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::Result;
use crate::tools::registry::run_caught;
use crate::tools::{Registry, Safety, Speculator, ToolCall, ToolStats};

/// What [`Executor::speculate`] did with a prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// The call is running on a worker thread.
    Started,
    /// The speculator predicted nothing.
    NoPrediction,
    /// The tool is side-effecting: it is never run before the agent asks for it.
    SideEffecting,
    /// No tool of that name is registered.
    UnknownTool,
}

/// How the actual call was served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// From the speculative run of this very call.
    Hit,
    /// A speculative run of another call was discarded; the call ran normally.
    Miss,
    /// Nothing was running for this turn; the call ran normally.
    NotSpeculated,
    /// The speculative run of this call failed, panicked or timed out (the reason); the call
    /// ran normally.
    Fallback(String),
}

/// The actual call's result and how it was obtained.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    /// The tool's result.
    pub value: Value,
    /// Whether it came from speculation.
    pub outcome: Outcome,
}

/// What a worker sends back: the tool's result (a panic already turned into an error) and the
/// seconds it ran.
struct Finished {
    result: std::result::Result<Value, String>,
    secs: f64,
}

/// A speculative run in flight. Dropping it detaches the worker: its result then goes nowhere.
struct Running {
    call: ToolCall,
    safety: Safety,
    rx: Receiver<Finished>,
    // None when the timeout is too long to represent: wait as long as it takes.
    deadline: Option<Instant>,
}

impl Running {
    /// The run's value and duration, or why there is none by the deadline.
    fn wait(self) -> std::result::Result<(Value, f64), String> {
        let received = match self.deadline {
            Some(deadline) => self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())),
            None => self.rx.recv().map_err(RecvTimeoutError::from),
        };
        match received {
            Ok(Finished { result: Ok(value), secs }) => Ok((value, secs)),
            Ok(Finished { result: Err(reason), .. }) => Err(reason),
            Err(RecvTimeoutError::Timeout) => Err("timed out".into()),
            Err(RecvTimeoutError::Disconnected) => Err("the worker ended without a result".into()),
        }
    }
}

/// One turn: from its start to the dispatch of the speculation, then to the actual call.
struct Turn {
    start: Instant,
    dispatched: Option<Instant>,
    predicted: Option<ToolCall>,
    running: Option<Running>,
}

impl Turn {
    fn new(start: Instant) -> Self {
        Self { start, dispatched: None, predicted: None, running: None }
    }
}

/// Pre-executes predicted tool calls and matches them against the agent's actual calls.
///
/// Per turn: [`speculate`](Self::speculate) (or [`speculate_next`](Self::speculate_next)) while
/// the agent starts generating, then [`execute`](Self::execute) with the call it made. A
/// side-effecting tool is never run speculatively; a speculative result is returned only for a
/// canonically equal call; a failure, panic or timeout of the speculative run only makes the
/// real call run as it would have without speculation. No async runtime: one `std::thread` per
/// speculative call.
///
/// # Example
/// ```
/// use serde_json::json;
/// use specdec::tools::{Executor, Outcome, Registry, Safety, ToolCall};
/// let mut tools = Registry::new();
/// tools.register("echo", Safety::ReadOnly, |args| Ok(args.clone()))?;
/// let mut exec = Executor::new(tools);
/// exec.speculate(&ToolCall::new("echo", json!({"a": 1, "b": 2})))?;
/// // ... the agent generates, then asks for the same call spelled differently ...
/// let done = exec.execute(&ToolCall::new("echo", json!({"b": 2, "a": 1})))?;
/// assert_eq!(done.outcome, Outcome::Hit);
/// assert_eq!(done.value, json!({"a": 1, "b": 2}));
/// # Ok::<(), specdec::Error>(())
/// ```
pub struct Executor {
    registry: Registry,
    timeout: Duration,
    turn: Option<Turn>,
    stats: ToolStats,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("registry", &self.registry)
            .field("timeout", &self.timeout)
            .field("pending", &self.turn.as_ref().and_then(|t| t.running.as_ref()).map(|r| &r.call))
            .field("stats", &self.stats)
            .finish()
    }
}

impl Executor {
    /// An executor over `registry`, giving speculative runs 30 s from dispatch.
    pub fn new(registry: Registry) -> Self {
        Self { registry, timeout: Duration::from_secs(30), turn: None, stats: ToolStats::default() }
    }

    /// How long after its dispatch a speculative run may still serve the actual call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The tools.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The counters and timings so far.
    pub fn stats(&self) -> &ToolStats {
        &self.stats
    }

    /// Starts a new turn now, discarding any speculation still pending. Speculating starts a
    /// turn by itself when none is open; call this when the agent's generation starts before.
    pub fn start_turn(&mut self) {
        self.turn = Some(Turn::new(Instant::now()));
    }

    /// Starts `predicted` on a worker thread if its tool is registered and speculable,
    /// replacing any speculation already pending in this turn.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) when the worker thread cannot be spawned (the turn then
    /// proceeds without speculation).
    pub fn speculate(&mut self, predicted: &ToolCall) -> Result<Dispatch> {
        self.dispatch(Some(predicted.clone()))
    }

    /// Asks `speculator` for the call that follows `trajectory` and speculates on it; the time
    /// this takes is the turn's T_spec.
    ///
    /// # Errors
    /// The speculator's errors and [`speculate`](Self::speculate)'s; either way the turn goes on
    /// without speculation.
    pub fn speculate_next<S: Speculator + ?Sized>(
        &mut self,
        speculator: &mut S,
        trajectory: &[ToolCall],
    ) -> Result<Dispatch> {
        self.turn.get_or_insert_with(|| Turn::new(Instant::now()));
        match speculator.predict(trajectory) {
            Ok(predicted) => self.dispatch(predicted),
            Err(e) => {
                self.dispatch(None)?;
                Err(e)
            }
        }
    }

    fn dispatch(&mut self, predicted: Option<ToolCall>) -> Result<Dispatch> {
        let turn = self.turn.get_or_insert_with(|| Turn::new(Instant::now()));
        // A replaced speculation is detached here, like a miss.
        turn.running = None;
        turn.predicted = predicted.clone();
        let dispatched = match predicted {
            None => Ok(Dispatch::NoPrediction),
            Some(call) => match self.registry.get(call.name()) {
                None => Ok(Dispatch::UnknownTool),
                // The safety gate: whatever the predictor says, side effects wait for the agent.
                Some(tool) if !tool.safety.speculable() => Ok(Dispatch::SideEffecting),
                Some(tool) => {
                    let (tx, rx) = mpsc::sync_channel(1);
                    let (run, args) = (tool.run.clone(), call.args().clone());
                    let spawned = thread::Builder::new()
                        // A fixed name: a tool name with a NUL byte would make `spawn` panic.
                        .name("specdec-tool".into())
                        .spawn(move || {
                            let t = Instant::now();
                            let result = run_caught(&run, &args);
                            // On a miss the receiver is gone and the result is meant to be lost.
                            let _ = tx.send(Finished { result, secs: t.elapsed().as_secs_f64() });
                        });
                    spawned.map(|_| {
                        let deadline = Instant::now().checked_add(self.timeout);
                        turn.running = Some(Running { call, safety: tool.safety, rx, deadline });
                        Dispatch::Started
                    })
                }
            },
        };
        turn.dispatched = Some(Instant::now());
        self.stats.launched += usize::from(matches!(dispatched, Ok(Dispatch::Started)));
        dispatched.map_err(Into::into)
    }

    /// Runs the agent's `actual` call, from the speculative result when it is the speculated
    /// call and that run succeeded in time, and closes the turn.
    ///
    /// On a miss, a speculative run of a read-only tool is abandoned; that of an idempotent tool
    /// is awaited first (up to the timeout), so that the real call's effects land after it.
    ///
    /// # Errors
    /// [`Error::Tool`](crate::Error::Tool) when the real call's tool is not registered, fails or
    /// panics. Never because of the speculative run.
    pub fn execute(&mut self, actual: &ToolCall) -> Result<Execution> {
        let called = Instant::now();
        let turn = self.turn.take().unwrap_or_else(|| Turn::new(called));
        let dispatched = turn.dispatched.unwrap_or(turn.start);
        let stats = &mut self.stats;
        stats.turns += 1;
        stats.spec_secs += dispatched.saturating_duration_since(turn.start).as_secs_f64();
        stats.gen_secs += called.saturating_duration_since(dispatched).as_secs_f64();
        if let Some(predicted) = &turn.predicted {
            stats.predictions += 1;
            stats.matches += usize::from(predicted == actual);
            stats.blocked += usize::from(turn.running.is_none());
        }
        let (outcome, served) = match turn.running {
            Some(run) if run.call == *actual => match run.wait() {
                Ok(served) => (Outcome::Hit, Some(served)),
                Err(reason) => (Outcome::Fallback(reason), None),
            },
            Some(run) => {
                if run.safety == Safety::Idempotent {
                    // Its result is discarded either way; only the ordering of effects matters.
                    let _ = run.wait();
                }
                (Outcome::Miss, None)
            }
            None => (Outcome::NotSpeculated, None),
        };
        match outcome {
            Outcome::Hit => stats.hits += 1,
            Outcome::Miss => stats.misses += 1,
            Outcome::Fallback(_) => stats.failed += 1,
            Outcome::NotSpeculated => {}
        }
        let value = match served {
            Some((value, secs)) => {
                stats.tool_secs += secs;
                Ok(value)
            }
            None => {
                let t = Instant::now();
                let value = self.registry.call(actual);
                stats.tool_secs += t.elapsed().as_secs_f64();
                value
            }
        };
        stats.wait_secs += called.elapsed().as_secs_f64();
        Ok(Execution { value: value?, outcome })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_unrepresentable_timeout_waits_instead_of_panicking() {
        let mut reg = Registry::new();
        reg.register("echo", Safety::ReadOnly, |a| Ok(a.clone())).unwrap();
        let mut exec = Executor::new(reg).timeout(Duration::MAX);
        let call = ToolCall::new("echo", json!([1]));
        assert_eq!(exec.speculate(&call).unwrap(), Dispatch::Started);
        assert!(format!("{exec:?}").contains("echo"));
        let done = exec.execute(&call).unwrap();
        assert_eq!((done.outcome, done.value), (Outcome::Hit, json!([1])));
    }
}
