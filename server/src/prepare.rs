//! From checked fields to a job the scheduler runs: the prompt through the model's chat
//! template, sampling settings, grammars for `response_format` and forced tool calls, the
//! limits of the model's context.

use serde_json::{json, Value};
use specdec::batch::Request;
use specdec::grammar::Grammar;
use specdec::serve::Job;
use specdec::{Logprobs, SamplingConfig};

use crate::answer::{FunctionCall, ToolCall};
use crate::error::{ApiError, ErrorKind};
use crate::params::{Endpoint, Params};
use crate::State;

/// What the output of a request with tools is read as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tools {
    /// No tools: text.
    None,
    /// The model may call tools, in `<tool_call>{json}</tool_call>` blocks (the format of
    /// Qwen-style templates); the text is read for them at the end.
    Auto,
    /// The output is one tool call, `{"name", "arguments"}`, constrained by a grammar.
    Forced,
}

/// A request ready for the scheduler.
pub struct Prepared {
    pub job: Job,
    pub tools: Tools,
}

/// Builds the job for `p`.
///
/// # Errors
/// A 404 for another model; a 400 for a template that fails, a prompt or `max_tokens` past the
/// context, bad tools, a bad `response_format` or schema, a `logit_bias` token outside the
/// vocabulary.
pub fn prepare(state: &State, p: &Params, endpoint: Endpoint) -> Result<Prepared, ApiError> {
    if let Some(model) = p.model.as_deref().filter(|m| *m != state.model) {
        let message = format!("the model `{model}` does not exist: this server serves `{}`", state.model);
        return Err(ApiError::new(ErrorKind::ModelNotFound, "model", message));
    }
    let (tools, tool_grammar) = tool_mode(p)?;
    let text = match endpoint {
        Endpoint::Completion => p.prompt.clone(),
        Endpoint::Chat => {
            let listed = Value::Array(p.tools.clone());
            match (state.tokenizer.chat_template(), tools != Tools::None) {
                (Some(t), true) => t.render_with_tools(&p.messages, Some(&listed), true)?,
                _ => state.tokenizer.chat(&p.messages)?,
            }
        }
    };
    let prompt = state.tokenizer.encode(&text)?;
    let param = if endpoint == Endpoint::Chat { "messages" } else { "prompt" };
    if prompt.is_empty() {
        return Err(ApiError::invalid(param, "the prompt has no tokens"));
    }
    if prompt.len() >= state.context {
        let message = format!("the prompt has {} tokens; the context holds {}", prompt.len(), state.context);
        return Err(ApiError::new(ErrorKind::ContextLengthExceeded, param, message));
    }
    let room = state.context - prompt.len();
    let max_tokens = p.max_tokens.unwrap_or(room.min(state.default_max_tokens));
    if max_tokens > room {
        let message = format!(
            "`max_tokens` is {max_tokens}, but the prompt's {} tokens leave room for {room} in the context of {}",
            prompt.len(),
            state.context
        );
        return Err(ApiError::new(ErrorKind::ContextLengthExceeded, "max_tokens", message));
    }
    let mut sampling = sampling(state, p)?;
    let grammar = match tool_grammar {
        Some(g) => Some(g),
        None => response_format(p.response_format.as_ref())?,
    };
    if let Some(g) = grammar {
        let vocab = state
            .grammar
            .as_ref()
            .ok_or_else(|| ApiError::invalid("response_format", "this model's tokenizer cannot run grammars"))?;
        sampling = sampling.with_processor(g.compile(vocab)?);
    }
    let request =
        Request::new(prompt).sampling(sampling).max_new_tokens(max_tokens).stop_tokens(state.tokenizer.stop_ids());
    Ok(Prepared { job: Job::new(request, p.stop.clone()), tools })
}

/// Sampling settings: greedy at temperature 0 (OpenAI's default is 1). With a seed, sampling
/// is coupled: the text is then the same for the seed whatever the batch and the drafts.
fn sampling(state: &State, p: &Params) -> Result<SamplingConfig, ApiError> {
    let t = p.temperature.unwrap_or(1.0);
    let mut s = if t == 0.0 { SamplingConfig::greedy() } else { SamplingConfig::new(t)? };
    if let Some(k) = p.top_k.filter(|&k| k > 0) {
        s = s.with_top_k(k)?;
    }
    if let Some(top_p) = p.top_p.filter(|&x| x < 1.0) {
        s = s.with_top_p(top_p)?;
    }
    if let Some(min_p) = p.min_p.filter(|&x| x > 0.0) {
        s = s.with_min_p(min_p)?;
    }
    if let Some(x) = p.presence_penalty.filter(|&x| x != 0.0) {
        s = s.with_presence_penalty(x)?;
    }
    if let Some(x) = p.frequency_penalty.filter(|&x| x != 0.0) {
        s = s.with_frequency_penalty(x)?;
    }
    if let Some(x) = p.repetition_penalty.filter(|&x| x != 1.0) {
        s = s.with_repetition_penalty(x)?;
    }
    for &(token, bias) in &p.logit_bias {
        if token as usize >= state.vocab {
            let message = format!("`logit_bias` token {token} is outside the vocabulary of {} tokens", state.vocab);
            return Err(ApiError::invalid("logit_bias", message));
        }
        s = s.with_logit_bias(token, bias)?;
    }
    if let Some(top) = p.logprobs {
        s = s.with_logprobs(Logprobs::new(top, p.logprobs_mode)?);
    }
    Ok(match p.seed {
        Some(seed) => s.with_seed(seed).coupled(),
        None => s.with_seed(state.next_seed()),
    })
}

/// `response_format`: text, any JSON object, or JSON of a schema.
fn response_format(format: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let Some(format) = format else { return Ok(None) };
    let bad = |m: &str| ApiError::invalid("response_format", m.to_string());
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::json())),
        Some("json_schema") => {
            let schema = format.pointer("/json_schema/schema").ok_or_else(|| bad("`json_schema.schema` is missing"))?;
            if !schema.is_object() {
                return Err(bad("`json_schema.schema` must be an object"));
            }
            Ok(Some(Grammar::json_schema(schema.clone())))
        }
        _ => Err(bad("`response_format.type` must be text, json_object or json_schema")),
    }
}

/// How the output is read given `tools` and `tool_choice`, and the grammar of a forced call.
fn tool_mode(p: &Params) -> Result<(Tools, Option<Grammar>), ApiError> {
    let mut names = Vec::new();
    for (i, t) in p.tools.iter().enumerate() {
        let name = t.pointer("/function/name").and_then(Value::as_str);
        match (t.get("type").and_then(Value::as_str), name) {
            (Some("function"), Some(name)) if !name.is_empty() => names.push(name.to_string()),
            _ => {
                return Err(ApiError::invalid(
                    "tools",
                    format!("`tools[{i}]` must be {{\"type\": \"function\", \"function\": {{\"name\", …}}}}"),
                ))
            }
        }
    }
    let choice = match &p.tool_choice {
        None => None,
        Some(Value::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => Some(s.clone()),
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if names.iter().any(|n| n == name) => Some(format!("function:{name}")),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "`tool_choice` must be none, auto, required or a listed function",
                ))
            }
        },
    };
    if names.is_empty() {
        return match choice.as_deref() {
            None | Some("none") | Some("auto") => Ok((Tools::None, None)),
            _ => Err(ApiError::invalid("tool_choice", "`tool_choice` needs `tools`")),
        };
    }
    let calls = |only: Option<&str>| -> Vec<Value> {
        p.tools
            .iter()
            .filter(|t| only.is_none_or(|n| t.pointer("/function/name").and_then(Value::as_str) == Some(n)))
            .map(|t| {
                let params = t.pointer("/function/parameters").cloned().unwrap_or(json!({ "type": "object" }));
                json!({
                    "type": "object",
                    "properties": { "name": { "const": t["function"]["name"] }, "arguments": params },
                    "required": ["name", "arguments"],
                    "additionalProperties": false
                })
            })
            .collect()
    };
    match choice.as_deref() {
        Some("none") => Ok((Tools::None, None)),
        None | Some("auto") => Ok((Tools::Auto, None)),
        Some("required") => Ok((Tools::Forced, Some(Grammar::json_schema(json!({ "anyOf": calls(None) }))))),
        Some(named) => {
            let name = named.trim_start_matches("function:");
            Ok((Tools::Forced, Some(Grammar::json_schema(json!({ "anyOf": calls(Some(name)) })))))
        }
    }
}

/// The tool calls in an output, and the text left: the whole output for a forced call,
/// `<tool_call>` blocks for the others. `None` when the output holds no call.
pub fn tool_calls(text: &str, tools: &Tools, ids: &mut dyn FnMut() -> String) -> Option<(Vec<ToolCall>, String)> {
    let call = |v: Value, id: String| -> Option<ToolCall> {
        let name = v.get("name")?.as_str()?.to_string();
        let arguments = v.get("arguments").cloned().unwrap_or(json!({})).to_string();
        Some(ToolCall { index: None, id, kind: "function", function: FunctionCall { name, arguments } })
    };
    match tools {
        Tools::None => None,
        Tools::Forced => Some((vec![call(serde_json::from_str(text.trim()).ok()?, ids())?], String::new())),
        Tools::Auto => {
            const OPEN: &str = "<tool_call>";
            const CLOSE: &str = "</tool_call>";
            let (mut calls, mut rest, mut tail) = (Vec::new(), String::new(), text);
            while let Some(start) = tail.find(OPEN) {
                rest.push_str(&tail[..start]);
                let body = &tail[start + OPEN.len()..];
                let end = body.find(CLOSE).unwrap_or(body.len());
                match serde_json::from_str(body[..end].trim()).ok().and_then(|v| call(v, ids())) {
                    Some(c) => calls.push(c),
                    None => rest.push_str(&tail[start..start + OPEN.len() + end]),
                }
                tail = body.get(end + CLOSE.len()..).unwrap_or("");
            }
            rest.push_str(tail);
            (!calls.is_empty()).then(|| (calls, rest.trim().to_string()))
        }
    }
}
