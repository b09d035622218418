//! A request body read field by field, so that an unknown or mistyped field is a 400 naming
//! it; then checked against the model (context, vocabulary) before any work starts.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use specdec::chat::ChatMessage;
use specdec::sampling::MAX_TOP_LOGPROBS;
use specdec::LogprobMode;

use crate::error::{ApiError, ErrorKind};

/// The fields both endpoints take.
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "stream",
    "stream_options",
    "n",
    "user",
    "logprobs",
    "logprobs_mode",
    "response_format",
];
/// The fields only chat completions take.
const CHAT: &[&str] =
    &["messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs"];
/// The fields only text completions take.
const COMPLETION: &[&str] = &["prompt", "echo"];

/// Which endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// The most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 16;

/// What a request asks for, its fields read and checked one by one.
#[derive(Debug, Default)]
pub struct Params {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub prompt: String,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Vec<(u32, f32)>,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices to generate (OpenAI's `n`; 0 read as 1).
    pub n: usize,
    pub response_format: Option<Value>,
    pub tools: Vec<Value>,
    pub tool_choice: Option<Value>,
    /// Log-probabilities asked for: the alternatives per token (chat's `logprobs: true` with
    /// `top_logprobs`, or a completion's `logprobs: N`).
    pub logprobs: Option<usize>,
    /// Chat's `top_logprobs`, until it is checked against `logprobs`.
    top_logprobs: Option<usize>,
    /// Which row they are read from (`logprobs_mode`: `raw`, the default, or `processed`).
    pub logprobs_mode: LogprobMode,
}

/// Reads field `key` as a `T`.
fn field<T: DeserializeOwned>(key: &str, value: &Value) -> Result<T, ApiError> {
    serde_json::from_value(value.clone()).map_err(|e| ApiError::invalid(key, format!("`{key}`: {e}")))
}

/// A number field within `range`.
fn number(key: &str, value: &Value, lo: f32, hi: f32) -> Result<f32, ApiError> {
    let v: f32 = field(key, value)?;
    if !v.is_finite() || v < lo || v > hi {
        return Err(ApiError::invalid(key, format!("`{key}` is {v}: expected a number from {lo} to {hi}")));
    }
    Ok(v)
}

impl Params {
    /// Reads a request body.
    ///
    /// # Errors
    /// A 400 for a body that is not a JSON object, an unknown field, a field of the wrong
    /// type or out of range, a missing `messages` or `prompt`.
    pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid("", format!("the body is not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(ApiError::invalid("", "the body must be a JSON object"));
        };
        let own = if endpoint == Endpoint::Chat { CHAT } else { COMPLETION };
        if let Some(key) = map.keys().find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str())) {
            return Err(ApiError::new(ErrorKind::UnknownParameter, key, format!("unknown field `{key}`")));
        }
        let mut p = Params::default();
        for (key, v) in &map {
            if v.is_null() {
                continue;
            }
            p.read(key, v, &map)?;
        }
        match (p.logprobs, p.top_logprobs) {
            (None, Some(_)) => return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
            (Some(_), Some(top)) => p.logprobs = Some(top),
            _ => {}
        }
        match endpoint {
            Endpoint::Chat if !map.contains_key("messages") => {
                Err(ApiError::invalid("messages", "`messages` is required"))
            }
            Endpoint::Chat if p.messages.is_empty() => Err(ApiError::invalid("messages", "`messages` is empty")),
            Endpoint::Completion if !map.contains_key("prompt") => {
                Err(ApiError::invalid("prompt", "`prompt` is required"))
            }
            _ => Ok(p),
        }
    }

    fn read(&mut self, key: &str, v: &Value, map: &Map<String, Value>) -> Result<(), ApiError> {
        match key {
            "model" => self.model = Some(field(key, v)?),
            "messages" => self.messages = messages(v)?,
            "prompt" => self.prompt = prompt(v)?,
            "max_tokens" | "max_completion_tokens" => {
                let n: usize = field(key, v)?;
                if n == 0 {
                    return Err(ApiError::invalid(key, format!("`{key}` must be at least 1")));
                }
                self.max_tokens = Some(n);
            }
            "temperature" => self.temperature = Some(number(key, v, 0.0, 2.0)?),
            "top_p" => {
                let p = number(key, v, 0.0, 1.0)?;
                if p == 0.0 {
                    return Err(ApiError::invalid(key, "`top_p` must be above 0"));
                }
                self.top_p = Some(p);
            }
            "top_k" => self.top_k = Some(field(key, v)?),
            "min_p" => self.min_p = Some(number(key, v, 0.0, 1.0)?),
            "seed" => self.seed = Some(field::<i64>(key, v)? as u64),
            "stop" => {
                self.stop = match v {
                    Value::String(s) => vec![s.clone()],
                    _ => field(key, v)?,
                };
                if self.stop.len() > 4 {
                    return Err(ApiError::invalid(key, "`stop` takes at most 4 strings"));
                }
            }
            "presence_penalty" => self.presence_penalty = Some(number(key, v, -2.0, 2.0)?),
            "frequency_penalty" => self.frequency_penalty = Some(number(key, v, -2.0, 2.0)?),
            "repetition_penalty" => self.repetition_penalty = Some(number(key, v, 0.01, 10.0)?),
            "logit_bias" => {
                let bias: Map<String, Value> = field(key, v)?;
                for (token, b) in &bias {
                    let id = token
                        .parse::<u32>()
                        .map_err(|_| ApiError::invalid(key, format!("`logit_bias` key {token:?} is not a token id")))?;
                    self.logit_bias.push((id, number(key, b, -100.0, 100.0)?));
                }
            }
            "stream" => self.stream = field(key, v)?,
            "stream_options" => {
                let o: Map<String, Value> = field(key, v)?;
                if !map.get("stream").and_then(Value::as_bool).unwrap_or(false) {
                    return Err(ApiError::invalid(key, "`stream_options` needs `stream: true`"));
                }
                for (k, x) in &o {
                    match k.as_str() {
                        "include_usage" => self.include_usage = field("stream_options.include_usage", x)?,
                        other => {
                            return Err(ApiError::invalid(
                                "stream_options",
                                format!("unknown field `stream_options.{other}`"),
                            ))
                        }
                    }
                }
            }
            "n" => match field::<usize>(key, v)? {
                n @ 1..=MAX_CHOICES => self.n = n,
                _ => return Err(ApiError::invalid(key, format!("`n` must be between 1 and {MAX_CHOICES}"))),
            },
            // Chat's `logprobs: true`, or a completion's number of alternatives.
            "logprobs" => match v {
                Value::Bool(asked) => self.logprobs = asked.then_some(0),
                _ => self.logprobs = Some(alternatives(key, v)?),
            },
            "top_logprobs" => self.top_logprobs = Some(alternatives(key, v)?),
            "logprobs_mode" => {
                self.logprobs_mode = match field::<String>(key, v)?.as_str() {
                    "raw" => LogprobMode::Raw,
                    "processed" => LogprobMode::Processed,
                    other => {
                        return Err(ApiError::invalid(
                            key,
                            format!("`logprobs_mode` is {other:?}: expected raw or processed"),
                        ))
                    }
                }
            }
            "response_format" => self.response_format = Some(v.clone()),
            "tools" => self.tools = field(key, v)?,
            "tool_choice" => self.tool_choice = Some(v.clone()),
            // Accepted and without effect: `user`, `parallel_tool_calls`, `echo` false.
            "echo" if field::<bool>(key, v)? => return Err(ApiError::invalid(key, "`echo` is not supported")),
            _ => {}
        }
        Ok(())
    }
}

/// A count of alternatives per token: 0 to 20.
fn alternatives(key: &str, v: &Value) -> Result<usize, ApiError> {
    match field::<usize>(key, v)? {
        n @ 0..=MAX_TOP_LOGPROBS => Ok(n),
        n => Err(ApiError::invalid(key, format!("`{key}` is {n}: expected 0 to {MAX_TOP_LOGPROBS}"))),
    }
}

/// `messages`: role and content (a string or text parts); an assistant's `tool_calls` are
/// written into its content the way Qwen-style templates show them.
fn messages(v: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let list: Vec<Map<String, Value>> = field("messages", v)?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |what: &str| ApiError::invalid("messages", format!("`messages[{i}]`: {what}"));
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| at("`role` is missing"))?;
            if !["system", "developer", "user", "assistant", "tool"].contains(&role) {
                return Err(at(&format!("unknown role {role:?}")));
            }
            let mut content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => Ok(t),
                        _ => Err(at("only text content parts are supported")),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .concat(),
                Some(_) => return Err(at("`content` must be a string or a list of text parts")),
            };
            if let Some(Value::Array(calls)) = m.get("tool_calls") {
                for call in calls {
                    let f = &call["function"];
                    let args = match &f["arguments"] {
                        Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
                        other => other.clone(),
                    };
                    let call = serde_json::json!({ "name": f["name"], "arguments": args });
                    content.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
                }
            }
            let role = if role == "developer" { "system" } else { role };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// `prompt`: a string, or a list of one string.
fn prompt(v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => Ok(a[0].as_str().unwrap_or_default().to_string()),
        _ => Err(ApiError::invalid("prompt", "`prompt` must be a string (or a list of one string)")),
    }
}
