//! The tools an agent may call, each with the safety annotation that decides whether it may run
//! before the agent has asked for it.

use std::collections::HashMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tools::ToolCall;

/// What running a tool does to the world, and so whether it may be run speculatively.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Safety {
    /// No side effects (search, retrieval, pure computation): safe to run and discard.
    ReadOnly,
    /// Side effects that a repeat leaves unchanged (a PUT of the same value): safe to replay.
    Idempotent,
    /// Side effects a miss would leave behind (payments, messages, inserts): never pre-run.
    SideEffecting,
}

impl Safety {
    /// Whether a call of a tool so annotated may be executed before the agent asks for it.
    pub fn speculable(self) -> bool {
        matches!(self, Safety::ReadOnly | Safety::Idempotent)
    }
}

/// A tool's body: arguments in, a JSON result or an error message out. It may run on a worker
/// thread, hence `Send + Sync`.
pub type ToolFn = Arc<dyn Fn(&Value) -> std::result::Result<Value, String> + Send + Sync>;

/// A registered tool: its body and its safety annotation.
#[derive(Clone)]
pub struct Tool {
    /// Whether the tool may run speculatively.
    pub safety: Safety,
    /// The body.
    pub run: ToolFn,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool").field("safety", &self.safety).finish_non_exhaustive()
    }
}

/// Tools by name.
///
/// # Example
/// ```
/// use serde_json::json;
/// use specdec::tools::{Registry, Safety, ToolCall};
/// let mut tools = Registry::new();
/// tools.register("add", Safety::ReadOnly, |args| {
///     let n = |k: &str| args[k].as_i64().ok_or(format!("`{k}` must be an integer"));
///     Ok(json!(n("a")? + n("b")?))
/// })?;
/// assert_eq!(tools.call(&ToolCall::new("add", json!({"a": 2, "b": 3})))?, json!(5));
/// assert!(tools.call(&ToolCall::new("add", json!({"a": 2}))).is_err());
/// # Ok::<(), specdec::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Registry {
    tools: HashMap<String, Tool>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `run` as the tool `name`.
    ///
    /// # Errors
    /// [`Error::Tool`] when the name is empty or already taken.
    pub fn register<F>(&mut self, name: impl Into<String>, safety: Safety, run: F) -> Result<&mut Self>
    where
        F: Fn(&Value) -> std::result::Result<Value, String> + Send + Sync + 'static,
    {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::Tool { tool: name, reason: "a tool needs a non-empty name".into() });
        }
        if self.tools.contains_key(&name) {
            return Err(Error::Tool { tool: name, reason: "a tool of this name is already registered".into() });
        }
        self.tools.insert(name, Tool { safety, run: Arc::new(run) });
        Ok(self)
    }

    /// The tool called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }

    /// The safety annotation of `name`, if registered.
    pub fn safety(&self, name: &str) -> Option<Safety> {
        self.get(name).map(|t| t.safety)
    }

    /// Runs `call` on this thread.
    ///
    /// # Errors
    /// [`Error::Tool`] when the tool is not registered, returns an error, or panics (the panic is
    /// caught so that a faulty tool cannot take the agent loop down).
    pub fn call(&self, call: &ToolCall) -> Result<Value> {
        let tool = self.get(call.name()).ok_or_else(|| not_registered(call))?;
        run_caught(&tool.run, call.args()).map_err(|reason| Error::Tool { tool: call.name().to_string(), reason })
    }
}

fn not_registered(call: &ToolCall) -> Error {
    Error::Tool { tool: call.name().to_string(), reason: "no tool of this name is registered".into() }
}

/// Runs a tool body, turning a panic into an error message.
pub(crate) fn run_caught(run: &ToolFn, args: &Value) -> std::result::Result<Value, String> {
    // A tool's state is its own business; we only promise not to unwind through the caller.
    catch_unwind(AssertUnwindSafe(|| run(args))).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".into());
        Err(format!("panicked: {msg}"))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_are_checked_and_panics_caught() {
        let mut reg = Registry::new();
        reg.register("ok", Safety::ReadOnly, |a| Ok(a.clone())).unwrap();
        reg.register("boom", Safety::Idempotent, |_| panic!("kaboom")).unwrap();
        assert!(reg.register("ok", Safety::ReadOnly, |a| Ok(a.clone())).is_err());
        assert!(reg.register("", Safety::ReadOnly, |a| Ok(a.clone())).is_err());
        assert_eq!(reg.safety("boom"), Some(Safety::Idempotent));
        assert_eq!(reg.call(&ToolCall::new("ok", json!(1))).unwrap(), json!(1));
        let err = reg.call(&ToolCall::new("boom", json!(null))).unwrap_err().to_string();
        assert!(err.contains("panicked: kaboom"), "{err}");
        assert!(reg.call(&ToolCall::new("absent", json!(null))).is_err());
        assert!(!Safety::SideEffecting.speculable() && Safety::ReadOnly.speculable());
    }
}
