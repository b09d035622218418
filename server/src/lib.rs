//! An OpenAI-compatible HTTP server for `specdec`: `POST /v1/chat/completions` and
//! `/v1/completions` (streamed as server-sent events or not), `GET /v1/models`, `/health` and
//! `/metrics` (Prometheus). Requests run on the library's serving scheduler
//! ([`specdec::serve::Server`]): continuous batching with speculation per sequence and the
//! batch-aware k. Errors are OpenAI's error bodies with a 4xx status; a request that fails
//! while running is a 500 for that request alone.

mod answer;
mod error;
mod params;
mod prepare;
mod respond;
mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State as Extract};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use specdec::grammar::GrammarVocab;
use specdec::serve::Server;
use specdec::Tokenizer;

use answer::{Health, Model, ModelList};
pub use error::{ApiError, ErrorKind};
use params::{Endpoint, Params};

/// The largest request body accepted (bytes); larger ones get a 413.
pub const MAX_BODY: usize = 4 << 20;

/// What the handlers share.
pub struct State {
    /// The serving scheduler.
    pub server: Server,
    /// The model's tokenizer (with its chat template).
    pub tokenizer: Tokenizer,
    /// The vocabulary as grammars see it (`None` for a tokenizer they cannot read).
    pub grammar: Option<GrammarVocab>,
    /// The name clients use in `model`.
    pub model: String,
    /// The target's vocabulary size.
    pub vocab: usize,
    /// The context a request's prompt and output share, in tokens.
    pub context: usize,
    /// `max_tokens` when a request gives none (at most the room left in the context).
    pub default_max_tokens: usize,
    /// The most events (text deltas) a request's stream holds for a client that does not
    /// read them (beyond what the socket holds); a client that falls further behind has its
    /// request ended, so that it cannot grow the server's memory (default 1024).
    pub stream_buffer: usize,
    /// Unix seconds at start.
    pub started: u64,
    counter: AtomicU64,
}

impl State {
    /// The state of a server over `server`.
    pub fn new(server: Server, tokenizer: Tokenizer, model: String, vocab: usize, context: usize) -> Self {
        let grammar = GrammarVocab::new(&tokenizer).ok();
        let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Self {
            server,
            tokenizer,
            grammar,
            model,
            vocab,
            context,
            default_max_tokens: 1024,
            stream_buffer: 1024,
            started,
            counter: AtomicU64::new(0),
        }
    }

    /// A fresh number, for ids and the seeds of requests without one.
    fn next(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    /// A seed for a request without one.
    fn next_seed(&self) -> u64 {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64);
        (self.next() << 32) ^ nanos ^ self.started
    }
}

/// The routes over `state`.
pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { Json(Health { status: "ok" }) }))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::new(ErrorKind::NotFound, "", "no such route") })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

async fn chat(Extract(state): Extract<Arc<State>>, body: Result<Bytes, BytesRejection>) -> Response {
    run(state, body, Endpoint::Chat).await
}

async fn completion(Extract(state): Extract<Arc<State>>, body: Result<Bytes, BytesRejection>) -> Response {
    run(state, body, Endpoint::Completion).await
}

/// Reads, checks and runs a request.
async fn run(state: Arc<State>, body: Result<Bytes, BytesRejection>, endpoint: Endpoint) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let error = match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => {
                    ApiError::new(ErrorKind::TooLarge, "", format!("the body is over {MAX_BODY} bytes"))
                }
                _ => ApiError::invalid("", e.body_text()),
            };
            return error.into_response();
        }
    };
    let prepared = Params::parse(&body, endpoint).and_then(|p| {
        let prepared = prepare::prepare(&state, &p, endpoint)?;
        Ok((p, prepared))
    });
    match prepared {
        Ok((p, prepared)) => respond::respond(state, p, prepared, endpoint).await,
        Err(e) => e.into_response(),
    }
}

async fn models(Extract(state): Extract<Arc<State>>) -> Response {
    let model = Model { id: &state.model, object: "model", created: state.started, owned_by: "specdec" };
    Json(ModelList { object: "list", data: [model] }).into_response()
}

async fn metrics(Extract(state): Extract<Arc<State>>) -> impl IntoResponse {
    ([("content-type", "text/plain; version=0.0.4")], state.server.metrics().to_prometheus())
}
