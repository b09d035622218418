//! A server on SmolLM2-135M (f32, drafting with its own Q4_1 weights, as `specdec-server`
//! runs by default) on an ephemeral port of 127.0.0.1, and a small HTTP client.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use specdec::serve::{ServeConfig, Server};
use specdec::{Drafter, DrafterSpec, Llama, ModelFiles, PlainDecoder, SamplingConfig, Tokenizer, WeightFormat};
use specdec_server::{router, State};

pub const MODEL: &str = "smollm2";
const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../models-cache/SmolLM2-135M-Instruct.Q4_1.gguf");

/// A running server.
pub struct TestServer {
    pub base: String,
    pub state: Arc<State>,
    pub target: Arc<specdec::LlamaWeights>,
    pub tokenizer: Tokenizer,
}

/// Starts a server with `max_running` slots, `max_queued` queue places and a context of
/// `ctx` tokens; `None` when the model file is missing (a failure under CI).
pub fn start(max_running: usize, max_queued: usize, ctx: usize) -> Option<TestServer> {
    start_with(config(max_running, max_queued), ctx)
}

/// A server as [`start`] makes it, that decodes plainly (`--drafter plain`).
pub fn start_plain(max_running: usize, max_queued: usize, ctx: usize) -> Option<TestServer> {
    let mut config = config(max_running, max_queued);
    config.policy = specdec::KPolicy::Plain;
    start_with(config, ctx)
}

/// The default settings with these limits.
fn config(max_running: usize, max_queued: usize) -> ServeConfig {
    let mut config = ServeConfig::default();
    (config.max_running, config.max_queued) = (max_running, max_queued);
    config
}

/// A server with `config` and a context of `ctx` tokens.
pub fn start_with(config: ServeConfig, ctx: usize) -> Option<TestServer> {
    if !std::path::Path::new(FILE).is_file() {
        assert!(std::env::var_os("CI").is_none(), "{FILE} is missing: run scripts/fetch-models.sh");
        eprintln!("skipped: {FILE} is missing (scripts/fetch-models.sh fetches it)");
        return None;
    }
    let files = ModelFiles::resolve(FILE).unwrap();
    let device = specdec::device("cpu").unwrap();
    let (weights, tokenizer) = files.load(WeightFormat::F32, &device).unwrap();
    let mut verifier = Llama::new(weights.clone()).unwrap();
    let proto = Drafter::build(&DrafterSpec::Model(None), &files, &mut verifier, &tokenizer, &device).unwrap();
    let w = weights.clone();
    let server =
        Server::start(config, Some(tokenizer.clone()), move || Ok((Llama::new(w.clone())?, proto.fork()?))).unwrap();
    let vocab = weights.config().vocab_size;
    let state = Arc::new(State::new(server, tokenizer.clone(), MODEL.into(), vocab, ctx));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    let app = router(state.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    Some(TestServer { base, state, target: weights, tokenizer })
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

impl TestServer {
    /// POSTs `body` (any text) to `path`: the status and the body as JSON (`Null` if not JSON).
    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let mut resp = agent()
            .post(&format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(body)
            .expect("the server answers");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// GETs `path`: the status and the body text.
    pub fn get(&self, path: &str) -> (u16, String) {
        let mut resp = agent().get(&format!("{}{path}", self.base)).call().expect("the server answers");
        (resp.status().as_u16(), resp.body_mut().read_to_string().expect("a body"))
    }

    /// A chat completion: status and body.
    pub fn chat(&self, body: Value) -> (u16, Value) {
        self.post("/v1/chat/completions", &body.to_string())
    }

    /// A streamed request: every `data:` payload in order (the last is `[DONE]`).
    pub fn stream(&self, path: &str, body: Value) -> Vec<String> {
        let resp = agent()
            .post(&format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(body.to_string())
            .expect("the server answers");
        assert_eq!(resp.status().as_u16(), 200);
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        let reader = BufReader::new(resp.into_body().into_reader());
        let mut out = Vec::new();
        for line in reader.lines() {
            let line = line.expect("a line");
            if let Some(data) = line.strip_prefix("data: ") {
                out.push(data.to_string());
            } else {
                assert!(line.is_empty(), "not an SSE line: {line:?}");
            }
        }
        out
    }

    /// What plain decoding gives for these chat messages, greedy, `n` tokens, as text.
    pub fn plain_chat(&self, user: &str, n: usize) -> String {
        let messages = [specdec::chat::ChatMessage::new("user", user)];
        let prompt = self.tokenizer.encode(&self.tokenizer.chat(&messages).unwrap()).unwrap();
        let out = PlainDecoder::new(Llama::new(self.target.clone()).unwrap(), SamplingConfig::greedy())
            .max_new_tokens(n)
            .stop_tokens(self.tokenizer.stop_ids())
            .generate(&prompt)
            .unwrap();
        self.tokenizer.decode(&out.tokens).unwrap()
    }
}

/// The content of a chat answer.
pub fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("no content: {v}")).to_string()
}

/// The text of a streamed chat: the deltas' contents joined; checks the chunks' shape.
pub fn streamed_text(chunks: &[String]) -> (String, Value, Option<Value>) {
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"), "{chunks:?}");
    let (mut text, mut finish, mut usage) = (String::new(), Value::Null, None);
    for c in &chunks[..chunks.len() - 1] {
        let v: Value = serde_json::from_str(c).unwrap_or_else(|e| panic!("{e}: {c}"));
        assert!(v.get("error").is_none(), "{v}");
        if let Some(u) = v.get("usage") {
            usage = Some(u.clone());
            continue;
        }
        let choice = &v["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str().or_else(|| choice["text"].as_str()) {
            text.push_str(t);
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    (text, finish, usage)
}
