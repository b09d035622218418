//! Running a prepared request and answering it: one JSON body, or server-sent events (one
//! chunk per text delta, a last chunk with the finish reason, usage when asked, `[DONE]`).
//! A client that goes away drops the stream, which cancels the request before the next step.

use std::convert::Infallible;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde::Serialize;
use specdec::serve::{CancelHandle, Event, Outcome, Sink};
use specdec::{FinishReason, TokenLogprob};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{channel, Receiver, Sender};

use crate::answer::{
    ChatLogprob, Choice, ChoiceBody, Delta, Envelope, Logprobs, Message, PromptDetails, Timings, TokenValue, Usage,
};
use crate::error::{ApiError, ErrorKind};
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
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
}

/// Submits the job (once per choice, choice `i` seeded with the request's seed plus `i`; the
/// later choices find the prompt in the prefix cache) and answers, streamed or whole.
pub async fn respond(state: Arc<State>, p: Params, prepared: Prepared, endpoint: Endpoint) -> Response {
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{}", state.next());
    let n = p.n.max(1);
    let (mut receivers, mut cancels) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let overrun = Arc::new(AtomicBool::new(false));
    for i in 0..n {
        let (tx, rx) = channel(state.stream_buffer.max(1));
        let sink = bounded_sink(tx, overrun.clone());
        let mut job = prepared.job.clone();
        let seed = job.request.sampling.seed().wrapping_add(i as u64);
        job.request.sampling = job.request.sampling.with_seed(seed);
        match state.server.submit_with(job, sink) {
            Ok(c) => cancels.push(CancelOnDrop(c)),
            Err(e) => return ApiError::from(e).into_response(),
        }
        receivers.push(rx);
    }
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let logprobs = p.logprobs.is_some();
    let reply = Arc::new(Reply {
        state,
        endpoint,
        id,
        created,
        tools: prepared.tools,
        include_usage: p.include_usage,
        logprobs,
    });
    match (p.stream, &reply.tools) {
        (false, _) => match collect_all(receivers, &reply.id, &overrun).await {
            Ok(answers) => Json(reply.whole(&answers)).into_response(),
            Err(e) => e.into_response(),
        },
        // Text streams as it comes; an output read for tool calls streams once it is whole.
        (true, Tools::None) => {
            let outcomes = Arc::new(std::sync::Mutex::new(Vec::new()));
            let (finished, last) = (outcomes.clone(), reply.clone());
            let choices = receivers.into_iter().zip(cancels).enumerate().map(|(index, (rx, cancel))| {
                let s = Streaming {
                    rx,
                    reply: reply.clone(),
                    _cancel: cancel,
                    started: false,
                    index,
                    outcomes: outcomes.clone(),
                    logprobs: Vec::new(),
                    overrun: overrun.clone(),
                    ended: false,
                };
                stream::unfold(s, next_chunk).boxed()
            });
            let end = stream::once(async move {
                let outcomes = finished.lock().map(|o| o.clone()).unwrap_or_default();
                match (last.include_usage, outcomes.is_empty()) {
                    (true, false) => event(&last.usage_chunk(&outcomes)) + &done(),
                    _ => done(),
                }
            });
            sse(stream::select_all(choices).chain(end).boxed())
        }
        (true, _) => {
            let chunks = match collect_all(receivers, &reply.id, &overrun).await {
                Ok(answers) => reply.buffered(&answers),
                Err(e) => vec![event(&e.body())],
            };
            drop(cancels);
            sse(stream::iter(chunks.into_iter().chain([done()])).boxed())
        }
    }
}

/// One choice's whole answer.
struct Answer {
    text: String,
    /// Its tokens' log-probabilities, when asked.
    logprobs: Vec<TokenLogprob>,
    outcome: Outcome,
}

/// The sink of one choice: its events into a channel of bounded size. A listener that falls
/// that far behind (a client that stopped reading its stream) ends the request, `overrun`
/// telling it why, rather than growing the server's memory; a listener gone ends it too.
fn bounded_sink(tx: Sender<Event>, overrun: Arc<AtomicBool>) -> Sink {
    Box::new(move |e| match tx.try_send(e) {
        Ok(()) => ControlFlow::Continue(()),
        Err(TrySendError::Full(_)) => {
            overrun.store(true, Ordering::Relaxed);
            ControlFlow::Break(())
        }
        Err(TrySendError::Closed(_)) => ControlFlow::Break(()),
    })
}

/// The error of a request whose client fell too far behind.
fn overrun_error() -> ApiError {
    let message = "the stream was ended: the client fell too far behind reading it (see --stream-buffer)";
    ApiError::new(ErrorKind::Internal, "", message)
}

/// Waits for every choice's whole answer, all at once (each drains its own channel).
async fn collect_all(receivers: Vec<Receiver<Event>>, id: &str, overrun: &AtomicBool) -> Result<Vec<Answer>, ApiError> {
    let answers = futures_util::future::try_join_all(receivers.into_iter().map(|rx| collect(rx, id))).await;
    match answers {
        Err(_) if overrun.load(Ordering::Relaxed) => Err(overrun_error()),
        other => other,
    }
}

/// Waits for the whole text, the log-probabilities and the outcome.
async fn collect(mut rx: Receiver<Event>, id: &str) -> Result<Answer, ApiError> {
    let (mut text, mut logprobs) = (String::new(), Vec::new());
    while let Some(e) = rx.recv().await {
        match e {
            Event::Delta { text: t, logprobs: l, .. } => {
                text.push_str(&t);
                logprobs.extend(l);
            }
            Event::Done(outcome) => return Ok(Answer { text, logprobs, outcome }),
            Event::Failed(e) => return Err(ApiError::failed(id, &e)),
            // Events a later library may add carry nothing these answers show.
            _ => {}
        }
    }
    Err(ApiError::failed(id, &specdec::Error::NotReady("the serving thread stopped")))
}

/// A streamed choice's state between chunks.
struct Streaming {
    rx: Receiver<Event>,
    reply: Arc<Reply>,
    /// Held for its drop.
    _cancel: CancelOnDrop,
    started: bool,
    /// Which choice.
    index: usize,
    /// Where the choices leave their outcomes, for the usage chunk at the end.
    outcomes: Arc<std::sync::Mutex<Vec<Outcome>>>,
    /// Log-probabilities of tokens whose text is still held back, for the next chunk.
    logprobs: Vec<TokenLogprob>,
    /// Set when the request was ended because this client fell too far behind.
    overrun: Arc<AtomicBool>,
    /// Whether the choice's last chunk was sent.
    ended: bool,
}

/// The next SSE text of one choice: the role chunk first (chat), then one per delta with
/// text, then its finish (the stream's end, `[DONE]`, comes after every choice's).
async fn next_chunk(mut s: Streaming) -> Option<(String, Streaming)> {
    if !s.started {
        s.started = true;
        if s.reply.endpoint == Endpoint::Chat {
            return Some((event(&s.reply.role_chunk(s.index)), s));
        }
    }
    loop {
        if s.ended {
            return None;
        }
        let Some(next) = s.rx.recv().await else {
            // The request ended without its outcome: say why, once.
            s.ended = true;
            return s.overrun.load(Ordering::Relaxed).then(|| (event(&overrun_error().body()), s));
        };
        let text = match next {
            Event::Delta { text, logprobs, .. } if text.is_empty() => {
                s.logprobs.extend(logprobs);
                continue;
            }
            Event::Delta { text, logprobs, .. } => {
                s.logprobs.extend(logprobs);
                let logprobs = std::mem::take(&mut s.logprobs);
                event(&s.reply.chunk(s.index, s.reply.piece(&text), None, &logprobs))
            }
            Event::Done(outcome) => {
                let (finish, logprobs) = (Some(finish_reason(&outcome, false)), std::mem::take(&mut s.logprobs));
                let last = s.reply.chunk(s.index, s.reply.piece(""), finish, &logprobs);
                if let Ok(mut o) = s.outcomes.lock() {
                    o.push(outcome);
                }
                s.rx.close();
                event(&last)
            }
            Event::Failed(e) => {
                s.rx.close();
                event(&ApiError::failed(&s.reply.id, &e).body())
            }
            _ => continue,
        };
        return Some((text, s));
    }
}

fn sse(chunks: stream::BoxStream<'static, String>) -> Response {
    let body = Body::from_stream(chunks.map(|c| Ok::<_, Infallible>(Bytes::from(c))));
    ([("content-type", "text/event-stream"), ("cache-control", "no-cache")], body).into_response()
}

fn event(v: &impl Serialize) -> String {
    format!("data: {}\n\n", serde_json::to_string(v).unwrap_or_default())
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
    /// The whole answer: one choice per answer.
    fn whole(&self, answers: &[Answer]) -> Envelope<'_> {
        let choices = (answers.iter().enumerate())
            .map(|(index, a)| {
                let (body, called) = match self.endpoint {
                    Endpoint::Chat => {
                        let (message, called) = self.message(&a.text);
                        (ChoiceBody::Message(message), called)
                    }
                    Endpoint::Completion => (ChoiceBody::Text(a.text.clone()), false),
                };
                let finish = Some(finish_reason(&a.outcome, called));
                Choice { index, body, finish_reason: finish, logprobs: self.logprobs(&a.logprobs) }
            })
            .collect();
        let outcomes: Vec<Outcome> = answers.iter().map(|a| a.outcome.clone()).collect();
        let mut answer = self.envelope(false, choices);
        (answer.usage, answer.timings) = (Some(usage(&outcomes)), outcomes.first().map(timings));
        answer
    }

    /// Whole answers as stream chunks (outputs read for tool calls).
    fn buffered(&self, answers: &[Answer]) -> Vec<String> {
        let mut out = Vec::new();
        for (i, Answer { text, logprobs, outcome: o }) in answers.iter().enumerate() {
            let (message, called) = self.message(text);
            let mut calls = message.tool_calls;
            for (j, call) in calls.iter_mut().flatten().enumerate() {
                call.index = Some(j);
            }
            let delta = Delta { role: Some(message.role), content: message.content, tool_calls: calls };
            out.push(event(&self.chunk(i, ChoiceBody::Delta(delta), None, logprobs)));
            let last = ChoiceBody::Delta(Delta::default());
            out.push(event(&self.chunk(i, last, Some(finish_reason(o, called)), &[])));
        }
        if self.include_usage {
            let outcomes: Vec<Outcome> = answers.iter().map(|a| a.outcome.clone()).collect();
            out.push(event(&self.usage_chunk(&outcomes)));
        }
        out
    }

    /// The assistant's message for `text`, and whether it holds tool calls.
    fn message(&self, text: &str) -> (Message, bool) {
        let mut n = 0;
        let mut ids = || {
            n += 1;
            format!("call_{}_{n}", self.id)
        };
        match tool_calls(text, &self.tools, &mut ids) {
            Some((calls, rest)) => {
                let content = (!rest.is_empty()).then_some(rest);
                (Message { role: "assistant", content, tool_calls: Some(calls) }, true)
            }
            None => (Message { role: "assistant", content: Some(text.to_string()), tool_calls: None }, false),
        }
    }

    /// A chunk's payload for `text`: chat's delta or a completion's text.
    fn piece(&self, text: &str) -> ChoiceBody {
        match self.endpoint {
            Endpoint::Chat => {
                ChoiceBody::Delta(Delta { content: (!text.is_empty()).then(|| text.to_string()), ..Delta::default() })
            }
            Endpoint::Completion => ChoiceBody::Text(text.to_string()),
        }
    }

    /// A chat stream's first chunk: the role.
    fn role_chunk(&self, index: usize) -> Envelope<'_> {
        let delta = Delta { role: Some("assistant"), content: Some(String::new()), tool_calls: None };
        self.chunk(index, ChoiceBody::Delta(delta), None, &[])
    }

    /// One stream chunk of choice `index`, with the log-probabilities of its tokens.
    fn chunk(
        &self,
        index: usize,
        body: ChoiceBody,
        finish: Option<&'static str>,
        logprobs: &[TokenLogprob],
    ) -> Envelope<'_> {
        let choice = Choice { index, body, finish_reason: finish, logprobs: self.logprobs(logprobs) };
        self.envelope(true, vec![choice])
    }

    /// The last chunk of a stream with `include_usage`: no choices, the usage of all of them.
    fn usage_chunk(&self, outcomes: &[Outcome]) -> Envelope<'_> {
        let mut chunk = self.envelope(true, Vec::new());
        (chunk.usage, chunk.timings) = (Some(usage(outcomes)), outcomes.first().map(timings));
        chunk
    }

    /// Tokens' log-probabilities in OpenAI's shape for the endpoint (`None` when not asked;
    /// end-of-turn tokens, which add no text, left out).
    fn logprobs(&self, values: &[TokenLogprob]) -> Option<Logprobs> {
        if !self.logprobs {
            return None;
        }
        let stops = self.state.tokenizer.stop_ids();
        let values: Vec<&TokenLogprob> = values.iter().filter(|v| !stops.contains(&v.token)).collect();
        let bytes = |id: u32| -> Vec<u8> {
            match &self.state.grammar {
                Some(vocab) => vocab.token_bytes(id).to_vec(),
                None => self.state.tokenizer.decode(&[id]).unwrap_or_default().into_bytes(),
            }
        };
        let text = |id: u32| String::from_utf8_lossy(&bytes(id)).into_owned();
        let value = |id: u32, logprob: f32| {
            let bytes = bytes(id);
            TokenValue { token: String::from_utf8_lossy(&bytes).into_owned(), logprob: finite(logprob), bytes }
        };
        Some(match self.endpoint {
            Endpoint::Chat => Logprobs::Chat {
                content: values
                    .iter()
                    .map(|v| ChatLogprob {
                        token: value(v.token, v.logprob),
                        top_logprobs: v.top.iter().map(|&(id, lp)| value(id, lp)).collect(),
                    })
                    .collect(),
            },
            Endpoint::Completion => {
                let tokens: Vec<String> = values.iter().map(|v| text(v.token)).collect();
                let text_offset = tokens
                    .iter()
                    .scan(0, |at, t| {
                        *at += t.len();
                        Some(*at - t.len())
                    })
                    .collect();
                let top_logprobs = values
                    .iter()
                    .map(|v| v.top.iter().map(|&(id, lp)| (text(id), finite(lp).into())).collect())
                    .collect();
                let token_logprobs = values.iter().map(|v| finite(v.logprob)).collect();
                Logprobs::Text { tokens, token_logprobs, top_logprobs, text_offset }
            }
        })
    }

    /// The envelope of an answer (`chunk` false) or a stream chunk.
    fn envelope(&self, chunk: bool, choices: Vec<Choice>) -> Envelope<'_> {
        let object = match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        };
        Envelope {
            id: &self.id,
            object,
            created: self.created,
            model: &self.state.model,
            system_fingerprint: concat!("specdec-", env!("CARGO_PKG_VERSION")),
            choices,
            usage: None,
            timings: None,
        }
    }
}

/// A log-probability JSON can carry: `-inf` (a token the processed law excludes) as -9999,
/// OpenAI's floor.
fn finite(logprob: f32) -> f32 {
    logprob.max(-9999.0)
}

/// The usage of a request's choices: the prompt once, every choice's completion; the cached
/// prompt tokens are the first choice's (the later ones find the prompt it prefilled).
fn usage(outcomes: &[Outcome]) -> Usage {
    let (prompt, cached) = outcomes.first().map_or((0, 0), |o| (o.prompt_tokens, o.stats.prefix_hit_tokens));
    let completion: usize = outcomes.iter().map(|o| o.completion_tokens).sum();
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: PromptDetails { cached_tokens: cached },
    }
}

/// What the server adds to OpenAI's answer: time to first token, decoding speed, and how
/// speculation went.
fn timings(o: &Outcome) -> Timings {
    let s = &o.stats;
    Timings {
        first_token_ms: o.first_token_secs * 1e3,
        tokens_per_second: if s.decode_secs > 0.0 { o.completion_tokens as f64 / s.decode_secs } else { 0.0 },
        prompt_tokens: o.prompt_tokens,
        cached_tokens: s.prefix_hit_tokens,
        prefill_tokens: s.prefill_tokens,
        prefill_ms: s.prefill_secs * 1e3,
        prefill_tokens_per_second: s.prefill_tok_s(),
        acceptance_rate: s.acceptance_rate(),
        tokens_per_target_call: if s.target_calls > 0 { s.new_tokens as f64 / s.target_calls as f64 } else { 0.0 },
        drafted: s.drafted,
        accepted: s.accepted,
        target_calls: s.target_calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta() -> Event {
        Event::Delta { tokens: vec![1], text: "a".into(), logprobs: Vec::new() }
    }

    #[test]
    fn a_client_that_does_not_read_ends_its_request_at_the_bound() {
        let (tx, rx) = channel(2);
        let overrun = Arc::new(AtomicBool::new(false));
        let mut sink = bounded_sink(tx, overrun.clone());
        assert!(sink(delta()).is_continue() && sink(delta()).is_continue());
        assert!(!overrun.load(Ordering::Relaxed));
        assert!(sink(delta()).is_break(), "a third event past a bound of 2");
        assert!(overrun.load(Ordering::Relaxed));
        assert_eq!(rx.len(), 2, "nothing held past the bound");

        let (tx, rx) = channel(2);
        let gone = Arc::new(AtomicBool::new(false));
        let mut sink = bounded_sink(tx, gone.clone());
        drop(rx);
        assert!(sink(delta()).is_break() && !gone.load(Ordering::Relaxed), "a listener gone is not an overrun");
    }
}
