//! A request body read into its serde type ([`Body`], `wire.rs`), so that an unknown or
//! mistyped field is a 400 naming it; then checked across fields (what one endpoint takes and
//! the other does not, fields that need another) before the model is consulted.

use serde_json::{json, Value};
use specdec::chat::ChatMessage;
use specdec::LogprobMode;

use crate::error::{ApiError, ErrorKind};
use crate::wire::{Body, Content, LogprobsField, LogprobsMode, Message, Part};

/// Which endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What a request asks for, read from its [`Body`] and checked across fields.
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
    /// Which row they are read from (`logprobs_mode`: `raw`, the default, or `processed`).
    pub logprobs_mode: LogprobMode,
}

impl Params {
    /// Reads a request body.
    ///
    /// # Errors
    /// A 400 for a body that is not a JSON object, an unknown field (or one of the other
    /// endpoint), a field of the wrong type or out of range, a missing `messages` or `prompt`.
    pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<Self, ApiError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let body: Body = serde_path_to_error::deserialize(&mut de).map_err(read_error)?;
        de.end().map_err(|e| ApiError::invalid("", format!("the body is not valid JSON: {}", without_position(&e))))?;
        Self::from_body(body, endpoint)
    }

    fn from_body(b: Body, endpoint: Endpoint) -> Result<Self, ApiError> {
        let others: &[(&str, bool)] = match endpoint {
            Endpoint::Chat => &[("prompt", b.prompt.is_some()), ("echo", b.echo.is_some())],
            Endpoint::Completion => &[
                ("messages", b.messages.is_some()),
                ("max_completion_tokens", b.max_completion_tokens.is_some()),
                ("tools", b.tools.is_some()),
                ("tool_choice", b.tool_choice.is_some()),
                ("parallel_tool_calls", b.parallel_tool_calls.is_some()),
                ("top_logprobs", b.top_logprobs.is_some()),
            ],
        };
        if let Some((key, _)) = others.iter().find(|(_, given)| *given) {
            return Err(ApiError::new(ErrorKind::UnknownParameter, key, format!("unknown field `{key}`")));
        }
        if b.echo == Some(true) {
            return Err(ApiError::invalid("echo", "`echo` is not supported"));
        }
        let stream = b.stream.unwrap_or(false);
        if b.stream_options.is_some() && !stream {
            return Err(ApiError::invalid("stream_options", "`stream_options` needs `stream: true`"));
        }
        let logprobs = match (b.logprobs, b.top_logprobs) {
            (None | Some(LogprobsField::Flag(false)), Some(_)) => {
                return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`"))
            }
            (Some(LogprobsField::Flag(true)), top) => Some(top.map_or(0, |t| t.0)),
            (Some(LogprobsField::Alternatives(n)), _) => Some(n.0),
            _ => None,
        };
        let messages = match (endpoint, b.messages) {
            (Endpoint::Chat, None) => return Err(ApiError::invalid("messages", "`messages` is required")),
            (Endpoint::Chat, Some(m)) if m.is_empty() => {
                return Err(ApiError::invalid("messages", "`messages` is empty"))
            }
            (_, m) => m.unwrap_or_default().into_iter().map(chat_message).collect(),
        };
        let prompt = match (endpoint, b.prompt) {
            (Endpoint::Completion, None) => return Err(ApiError::invalid("prompt", "`prompt` is required")),
            (_, p) => p.map(|p| p.0).unwrap_or_default(),
        };
        Ok(Params {
            model: b.model,
            messages,
            prompt,
            max_tokens: b.max_tokens.or(b.max_completion_tokens).map(|n| n.0),
            temperature: b.temperature.map(|t| t.0),
            top_p: b.top_p.map(|t| t.0),
            top_k: b.top_k,
            min_p: b.min_p.map(|t| t.0),
            seed: b.seed.map(|s| s as u64),
            stop: b.stop.map(|s| s.0).unwrap_or_default(),
            presence_penalty: b.presence_penalty.map(|t| t.0),
            frequency_penalty: b.frequency_penalty.map(|t| t.0),
            repetition_penalty: b.repetition_penalty.map(|t| t.0),
            logit_bias: b.logit_bias.unwrap_or_default().into_iter().map(|(t, bias)| (t, bias.0)).collect(),
            stream,
            include_usage: b.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            n: b.n.map_or(1, |n| n.0),
            response_format: b.response_format,
            tools: b.tools.unwrap_or_default(),
            tool_choice: b.tool_choice,
            logprobs,
            logprobs_mode: match b.logprobs_mode {
                Some(LogprobsMode::Processed) => LogprobMode::Processed,
                _ => LogprobMode::Raw,
            },
        })
    }
}

/// A 400 for a body its type refused, naming the field at fault (the top-level one, as
/// OpenAI's `param` does), `unknown_parameter` for a field the API does not have.
fn read_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let message = without_position(&inner);
    if let Some(name) = message.strip_prefix("unknown field `").and_then(|m| m.split('`').next()) {
        // The path names the field, or the object that holds it.
        let key = match path.trim_start_matches('.') {
            "" => name.to_string(),
            within if within.ends_with(name) => within.to_string(),
            within => format!("{within}.{name}"),
        };
        let param = key.split(['.', '[']).next().unwrap_or(name).to_string();
        return ApiError::new(ErrorKind::UnknownParameter, &param, format!("unknown field `{key}`"));
    }
    let param = path.split(['.', '[']).next().unwrap_or_default();
    if !param.is_empty() && !inner.is_eof() {
        return ApiError::invalid(param, format!("`{path}`: {message}"));
    }
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::invalid("", format!("the body is not valid JSON: {message}"));
    }
    ApiError::invalid("", format!("the body must be a JSON object of the request's fields: {message}"))
}

/// serde_json's message without its " at line L column C".
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// A message as the chat template reads it: text parts joined; an assistant's `tool_calls`
/// written into its content the way Qwen-style templates show them.
fn chat_message(m: Message) -> ChatMessage {
    let mut content = match m.content {
        None => String::new(),
        Some(Content::Text(s)) => s,
        Some(Content::Parts(parts)) => parts.into_iter().map(|Part::Text { text }| text).collect(),
    };
    for call in m.tool_calls.unwrap_or_default() {
        let args = match call.function.arguments {
            Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
            other => other,
        };
        let call = json!({ "name": call.function.name, "arguments": args });
        content.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
    }
    ChatMessage::new(m.role.template_name(), content)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `param` and message of the error `body` gets from the chat endpoint.
    fn refused(body: &str) -> (Option<String>, ErrorKind, String) {
        let e = Params::parse(body.as_bytes(), Endpoint::Chat).expect_err(body);
        (e.param, e.kind, e.message)
    }

    #[test]
    fn each_refused_field_is_named() {
        let chat = |extra: &str| format!(r#"{{"messages": [{{"role": "user", "content": "hi"}}]{extra}}}"#);
        for (extra, param, kind) in [
            (r#", "frobnicate": 1"#, "frobnicate", ErrorKind::UnknownParameter),
            (r#", "prompt": "x""#, "prompt", ErrorKind::UnknownParameter),
            (r#", "stream": true, "stream_options": {"nope": 1}"#, "stream_options", ErrorKind::UnknownParameter),
            (r#", "temperature": "hot""#, "temperature", ErrorKind::Invalid),
            (r#", "temperature": 2.5"#, "temperature", ErrorKind::Invalid),
            (r#", "top_p": 0"#, "top_p", ErrorKind::Invalid),
            (r#", "n": 17"#, "n", ErrorKind::Invalid),
            (r#", "max_tokens": -5"#, "max_tokens", ErrorKind::Invalid),
            (r#", "stop": ["a", "b", "c", "d", "e"]"#, "stop", ErrorKind::Invalid),
            (r#", "logit_bias": {"x": 1}"#, "logit_bias", ErrorKind::Invalid),
            (r#", "logprobs": true, "top_logprobs": 21"#, "top_logprobs", ErrorKind::Invalid),
            (r#", "top_logprobs": 2"#, "top_logprobs", ErrorKind::Invalid),
            (r#", "logprobs_mode": "cooked""#, "logprobs_mode", ErrorKind::Invalid),
            (r#", "stream_options": {"include_usage": true}"#, "stream_options", ErrorKind::Invalid),
        ] {
            let (got, got_kind, message) = refused(&chat(extra));
            assert_eq!((got.as_deref(), got_kind), (Some(param), kind), "{extra}: {message}");
            assert!(!message.contains("line 1") && !message.contains("expected one of"), "{message}");
        }
        let (param, _, message) = refused(r#"{"messages": [{"role": "wizard", "content": "x"}]}"#);
        assert_eq!(param.as_deref(), Some("messages"), "{message}");
        assert_eq!(refused("[1, 2]").0, None);
        assert_eq!(refused("{\"model\": ").0, None);
    }

    #[test]
    fn a_body_reads_into_its_params() -> Result<(), ApiError> {
        let body = r#"{"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
              "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}],
            "max_completion_tokens": 7, "temperature": 0, "stop": "END", "logit_bias": {"5": -100},
            "logprobs": true, "top_logprobs": 4, "logprobs_mode": "processed", "user": "u", "seed": null}"#;
        let p = Params::parse(body.as_bytes(), Endpoint::Chat)?;
        assert_eq!(p.messages[0], ChatMessage::new("system", "Be brief."));
        assert_eq!(p.messages[1].content, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":1}}\n</tool_call>");
        assert_eq!(
            (p.max_tokens, p.temperature, p.stop, p.logit_bias),
            (Some(7), Some(0.0), vec!["END".to_string()], vec![(5, -100.0)])
        );
        assert_eq!((p.logprobs, p.logprobs_mode, p.seed, p.n), (Some(4), LogprobMode::Processed, None, 1));
        let p = Params::parse(br#"{"prompt": ["once"], "logprobs": 3}"#, Endpoint::Completion)?;
        assert_eq!((p.prompt.as_str(), p.logprobs), ("once", Some(3)));
        Ok(())
    }
}
