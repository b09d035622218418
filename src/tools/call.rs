//! A tool call in canonical form, so that "the same call" means the same thing everywhere.

use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use crate::error::{Error, Result};

/// A tool name and its JSON arguments, canonicalized when built.
///
/// Canonical form sorts object keys recursively and writes integral floats (`2.0`, `-0.0`) as
/// integers, so two calls that mean the same thing compare equal however a model or an agent
/// happened to spell them. Equality and hashing are on the name and the canonical arguments.
///
/// # Example
/// ```
/// use serde_json::json;
/// use specdec::tools::ToolCall;
/// let a = ToolCall::new("search", json!({"q": "rust", "opts": {"b": 1, "a": 2.0}}));
/// let b = ToolCall::new("search", json!({"opts": {"a": 2, "b": 1}, "q": "rust"}));
/// assert_eq!(a, b);
/// assert_ne!(a, ToolCall::new("fetch", json!({"q": "rust", "opts": {"a": 2, "b": 1}})));
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "RawCall", into = "RawCall")]
pub struct ToolCall {
    name: String,
    args: Value,
    // The canonical JSON text of `args`: what equality and hashing compare.
    key: String,
}

/// The wire form: `{"name": "...", "arguments": {...}}`, the shape chat models emit.
#[derive(Serialize, Deserialize)]
struct RawCall {
    name: String,
    #[serde(default)]
    arguments: Value,
}

impl ToolCall {
    /// The call of tool `name` with arguments `args` (canonicalized here).
    pub fn new(name: impl Into<String>, args: Value) -> Self {
        let args = canonical(args);
        // Serializing a `Value` cannot fail: its keys are strings and its numbers finite.
        let key = serde_json::to_string(&args).unwrap_or_default();
        Self { name: name.into(), args, key }
    }

    /// Parses `{"name": "...", "arguments": {...}}` (arguments optional, default null).
    ///
    /// # Errors
    /// [`Error::Tool`] when `text` is not JSON of that shape or the name is empty.
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text)
            .map_err(|e| Error::Tool { tool: String::new(), reason: format!("bad call JSON: {e}") })
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The canonical arguments.
    pub fn args(&self) -> &Value {
        &self.args
    }

    /// The canonical JSON text of the arguments.
    pub fn canonical_args(&self) -> &str {
        &self.key
    }
}

impl PartialEq for ToolCall {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.key == other.key
    }
}

impl Eq for ToolCall {}

impl Hash for ToolCall {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.key.hash(state);
    }
}

impl std::fmt::Display for ToolCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.name, self.key)
    }
}

impl TryFrom<RawCall> for ToolCall {
    type Error = String;

    fn try_from(raw: RawCall) -> std::result::Result<Self, String> {
        if raw.name.is_empty() {
            return Err("the tool name is empty".into());
        }
        Ok(Self::new(raw.name, raw.arguments))
    }
}

impl From<ToolCall> for RawCall {
    fn from(call: ToolCall) -> Self {
        Self { name: call.name, arguments: call.args }
    }
}

/// Sorts object keys recursively and turns integral floats into integers.
fn canonical(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            // serde_json may be built with `preserve_order`, so sort explicitly.
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, canonical(v))).collect::<Map<_, _>>())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        Value::Number(n) => Value::Number(canonical_number(n)),
        other => other,
    }
}

fn canonical_number(n: Number) -> Number {
    match n.as_f64() {
        // 2^53 bounds the floats that are exact integers with a unique integer spelling.
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 => {
            if f >= 0.0 {
                Number::from(f as u64)
            } else {
                Number::from(f as i64)
            }
        }
        _ => n,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn key_order_and_number_spelling_do_not_matter() {
        let a = ToolCall::new("t", json!({"b": 1, "a": [{"y": 1.0, "x": -0.0}]}));
        let b = ToolCall::new("t", json!({"a": [{"x": 0, "y": 1}], "b": 1.0}));
        assert_eq!(a, b);
        assert_eq!(a.canonical_args(), r#"{"a":[{"x":0,"y":1}],"b":1}"#);
        assert_ne!(a, ToolCall::new("t", json!({"a": [{"x": 0, "y": 1.5}], "b": 1})));
        // Array order is meaningful.
        assert_ne!(ToolCall::new("t", json!([1, 2])), ToolCall::new("t", json!([2, 1])));
    }

    #[test]
    fn json_round_trip() {
        let call = ToolCall::from_json(r#"{"name": "search", "arguments": {"q": "x", "k": 3.0}}"#).unwrap();
        assert_eq!(call, ToolCall::new("search", json!({"k": 3, "q": "x"})));
        let text = serde_json::to_string(&call).unwrap();
        assert_eq!(ToolCall::from_json(&text).unwrap(), call);
        assert!(ToolCall::from_json(r#"{"name": ""}"#).is_err());
        assert!(ToolCall::from_json("not json").is_err());
        assert_eq!(ToolCall::from_json(r#"{"name": "now"}"#).unwrap().args(), &Value::Null);
    }
}
