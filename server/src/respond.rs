//! Running a prepared request and answering it: one JSON body, or server-sent events (one
//! chunk per text delta, a last chunk with the finish reason, usage when asked, `[DONE]`).
//! A client that goes away drops the stream, which cancels the request before the next step.

use std::convert::Infallible;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};
use specdec::serve::{CancelHandle, Event, Outcome, Sink};
use specdec::FinishReason;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::error::ApiError;
use crate::params::{Endpoint, Params};
use crate::prepare::{tool_calls, Prepared, Tools};
use crate::State;

/// Cancels the request when dropped (the handler or its stream went away).
struct CancelOnDrop(CancelHandle);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// What every chunk and answer of one request carries.
struct Reply {
    state: Arc<State>,
    endpoint: Endpoint,
    id: String,
    created: u64,
    tools: Tools,
    include_usage: bool,
}

/// Submits the job and answers, streamed or whole.
pub async fn respond(state: Arc<State>, p: Params, prepared: Prepared, endpoint: Endpoint) -> Response {
    let (tx, rx) = unbounded_channel();
    let sink: Sink =
        Box::new(move |e| if tx.send(e).is_ok() { ControlFlow::Continue(()) } else { ControlFlow::Break(()) });
    let cancel = match state.server.submit_with(prepared.job, sink) {
        Ok(c) => CancelOnDrop(c),
        Err(e) => return ApiError::from(e).into_response(),
    };
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{}", state.next());
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let reply = Reply { state, endpoint, id, created, tools: prepared.tools, include_usage: p.include_usage };
    match (p.stream, &reply.tools) {
        (false, _) => match collect(rx).await {
            Ok((text, outcome)) => Json(reply.whole(&text, &outcome)).into_response(),
            Err(e) => e.into_response(),
        },
        // Text streams as it comes; an output read for tool calls streams once it is whole.
        (true, Tools::None) => {
            sse(stream::unfold(Streaming { rx, reply, _cancel: cancel, started: false }, next_chunk).boxed())
        }
        (true, _) => {
            let chunks = match collect(rx).await {
                Ok((text, outcome)) => reply.buffered(&text, &outcome),
                Err(e) => vec![event(&e.body())],
            };
            drop(cancel);
            sse(stream::iter(chunks.into_iter().chain([done()])).boxed())
        }
    }
}

/// Waits for the whole text and the outcome.
async fn collect(mut rx: UnboundedReceiver<Event>) -> Result<(String, Outcome), ApiError> {
    let mut text = String::new();
    while let Some(e) = rx.recv().await {
        match e {
            Event::Delta { text: t, .. } => text.push_str(&t),
            Event::Done(outcome) => return Ok((text, outcome)),
            Event::Failed(e) => return Err(ApiError::server(e.to_string())),
        }
    }
    Err(ApiError::server("the serving thread stopped".into()))
}

/// A streamed answer's state between chunks.
struct Streaming {
    rx: UnboundedReceiver<Event>,
    reply: Reply,
    /// Held for its drop.
    _cancel: CancelOnDrop,
    started: bool,
}

/// The next SSE text: the role chunk first (chat), then one per delta with text, then the end.
async fn next_chunk(mut s: Streaming) -> Option<(String, Streaming)> {
    if !s.started {
        s.started = true;
        if s.reply.endpoint == Endpoint::Chat {
            let first = s.reply.chunk(json!({ "role": "assistant", "content": "" }), None);
            return Some((event(&first), s));
        }
    }
    loop {
        let text = match s.rx.recv().await? {
            Event::Delta { text, .. } if text.is_empty() => continue,
            Event::Delta { text, .. } => event(&s.reply.chunk(s.reply.content(&text), None)),
            Event::Done(outcome) => {
                let last = s.reply.chunk(s.reply.content(""), Some(finish_reason(&outcome, false)));
                let mut out = event(&last);
                if s.reply.include_usage {
                    out.push_str(&event(&s.reply.usage_chunk(&outcome)));
                }
                out.push_str(&done());
                s.rx.close();
                out
            }
            Event::Failed(e) => {
                s.rx.close();
                event(&ApiError::server(e.to_string()).body())
            }
        };
        return Some((text, s));
    }
}

fn sse(chunks: stream::BoxStream<'static, String>) -> Response {
    let body = Body::from_stream(chunks.map(|c| Ok::<_, Infallible>(Bytes::from(c))));
    ([("content-type", "text/event-stream"), ("cache-control", "no-cache")], body).into_response()
}

fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn done() -> String {
    "data: [DONE]\n\n".into()
}

/// OpenAI's finish reason.
fn finish_reason(o: &Outcome, called: bool) -> &'static str {
    match o.finish {
        _ if called => "tool_calls",
        FinishReason::Length => "length",
        _ => "stop",
    }
}

impl Reply {
    /// The whole answer.
    fn whole(&self, text: &str, o: &Outcome) -> Value {
        let (message, called) = self.message(text);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                json!({ "index": 0, "message": message, "finish_reason": finish_reason(o, called), "logprobs": null })
            }
            Endpoint::Completion => {
                json!({ "index": 0, "text": text, "finish_reason": finish_reason(o, false), "logprobs": null })
            }
        };
        let mut v = self.head();
        v["choices"] = json!([choice]);
        v["usage"] = usage(o);
        v["timings"] = timings(o);
        v
    }

    /// A whole answer as stream chunks (an output read for tool calls).
    fn buffered(&self, text: &str, o: &Outcome) -> Vec<String> {
        let (message, called) = self.message(text);
        let mut delta = message;
        if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for (i, c) in calls.iter_mut().enumerate() {
                c["index"] = json!(i);
            }
        }
        let mut out =
            vec![event(&self.chunk(delta, None)), event(&self.chunk(json!({}), Some(finish_reason(o, called))))];
        if self.include_usage {
            out.push(event(&self.usage_chunk(o)));
        }
        out
    }

    /// The assistant's message for `text`, and whether it holds tool calls.
    fn message(&self, text: &str) -> (Value, bool) {
        let mut n = 0;
        let mut ids = || {
            n += 1;
            format!("call_{}_{n}", self.id)
        };
        match tool_calls(text, &self.tools, &mut ids) {
            Some((calls, rest)) => {
                let content = if rest.is_empty() { Value::Null } else { json!(rest) };
                (json!({ "role": "assistant", "content": content, "tool_calls": calls }), true)
            }
            None => (json!({ "role": "assistant", "content": text }), false),
        }
    }

    /// A delta's payload: chat's `delta` or a completion's text.
    fn content(&self, text: &str) -> Value {
        match self.endpoint {
            Endpoint::Chat if text.is_empty() => json!({}),
            Endpoint::Chat => json!({ "content": text }),
            Endpoint::Completion => json!(text),
        }
    }

    /// One stream chunk.
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({ "index": 0, "delta": delta, "finish_reason": finish, "logprobs": null }),
            Endpoint::Completion => json!({ "index": 0, "text": delta, "finish_reason": finish, "logprobs": null }),
        };
        let mut v = self.head_chunk();
        v["choices"] = json!([choice]);
        v
    }

    /// The last chunk of a stream with `include_usage`: no choices, the usage.
    fn usage_chunk(&self, o: &Outcome) -> Value {
        let mut v = self.head_chunk();
        v["choices"] = json!([]);
        v["usage"] = usage(o);
        v["timings"] = timings(o);
        v
    }

    fn head(&self) -> Value {
        let object = if self.endpoint == Endpoint::Chat { "chat.completion" } else { "text_completion" };
        json!({ "id": self.id, "object": object, "created": self.created, "model": self.state.model,
                "system_fingerprint": concat!("specdec-", env!("CARGO_PKG_VERSION")) })
    }

    fn head_chunk(&self) -> Value {
        let mut v = self.head();
        if self.endpoint == Endpoint::Chat {
            v["object"] = json!("chat.completion.chunk");
        }
        v
    }
}

fn usage(o: &Outcome) -> Value {
    json!({ "prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
            "total_tokens": o.prompt_tokens + o.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": o.stats.prefix_hit_tokens } })
}

/// What the server adds to OpenAI's answer: time to first token, decoding speed, and how
/// speculation went.
fn timings(o: &Outcome) -> Value {
    let s = &o.stats;
    let per_s = if s.decode_secs > 0.0 { o.completion_tokens as f64 / s.decode_secs } else { 0.0 };
    let per_call = if s.target_calls > 0 { s.new_tokens as f64 / s.target_calls as f64 } else { 0.0 };
    json!({ "first_token_ms": o.first_token_secs * 1e3, "tokens_per_second": per_s,
            "prompt_tokens": o.prompt_tokens, "cached_tokens": s.prefix_hit_tokens,
            "prefill_tokens": s.prefill_tokens, "prefill_ms": s.prefill_secs * 1e3,
            "prefill_tokens_per_second": s.prefill_tok_s(),
            "acceptance_rate": s.acceptance_rate(), "tokens_per_target_call": per_call,
            "drafted": s.drafted, "accepted": s.accepted, "target_calls": s.target_calls })
}
