//! The server over HTTP on SmolLM2-135M: chat and completions, streaming, stop strings, seeds,
//! JSON schemas, tools, OpenAI error bodies, cancellation by disconnect, and batch invariance
//! (a request's text is the same alone or among 8).

mod common;

use std::io::Read;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{content, start, streamed_text, TestServer, MODEL};
use serde_json::{json, Value};

const PROMPTS: [&str; 8] = [
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "What is the capital of France?",
    "Explain recursion in one sentence.",
    "Name a colour of the rainbow.",
    "Say hello in Spanish.",
    "What is 2 + 2?",
    "Describe a cat in five words.",
];

/// One server for the tests of this file (8 slots, context 512).
fn server() -> Option<&'static TestServer> {
    static SERVER: OnceLock<Option<TestServer>> = OnceLock::new();
    SERVER.get_or_init(|| start(8, 64, 512)).as_ref()
}

fn chat_body(user: &str, extra: Value) -> Value {
    let mut body = json!({ "model": MODEL, "messages": [{ "role": "user", "content": user }], "max_tokens": 40, "temperature": 0 });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn health_models_and_metrics_answer() {
    let Some(s) = server() else { return };
    assert_eq!(s.get("/health").0, 200);
    let (status, models) = s.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let (status, metrics) = s.get("/metrics");
    assert_eq!(status, 200);
    for name in [
        "specdec_requests_total",
        "specdec_time_to_first_token_seconds_bucket",
        "specdec_token_latency_seconds_count",
        "specdec_running_sequences",
        "specdec_acceptance_rate",
        "specdec_steps_total{speculation=\"on\"}",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics:\n{metrics}");
    }
}

#[test]
fn greedy_chat_is_plain_decodings_text_whole_and_streamed() {
    let Some(s) = server() else { return };
    let expected = s.plain_chat(PROMPTS[0], 40);
    let (status, v) = s.chat(chat_body(PROMPTS[0], json!({})));
    assert_eq!(status, 200, "{v}");
    assert_eq!(content(&v), expected);
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    let usage = &v["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5);
    assert_eq!(
        usage["total_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap()));
    assert!(v["timings"]["tokens_per_target_call"].as_f64().unwrap() >= 1.0, "{v}");

    let chunks = s.stream(
        "/v1/chat/completions",
        chat_body(PROMPTS[0], json!({ "stream": true, "stream_options": { "include_usage": true } })),
    );
    let (text, finish, usage) = streamed_text(&chunks);
    assert_eq!(text, expected);
    assert_eq!(finish, v["choices"][0]["finish_reason"]);
    assert_eq!(usage.expect("a usage chunk")["completion_tokens"], v["usage"]["completion_tokens"]);
    let first: Value = serde_json::from_str(&chunks[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
}

#[test]
fn completions_take_a_raw_prompt() {
    let Some(s) = server() else { return };
    let body = json!({ "model": MODEL, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0 });
    let (status, v) = s.post("/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (t, finish, _) = streamed_text(&s.stream("/v1/completions", streamed));
    assert_eq!(t, text);
    assert_eq!(finish, v["choices"][0]["finish_reason"]);
}

#[test]
fn a_stop_string_cuts_the_text_before_it_even_across_tokens() {
    let Some(s) = server() else { return };
    let full = content(&s.chat(chat_body(PROMPTS[3], json!({}))).1);
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 20, "{full:?}");
    // Three characters from the middle: likely inside a token or across two.
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let before = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let body = chat_body(PROMPTS[3], json!({ "stop": [stop.clone(), "never-there"], "stream": stream }));
        let (text, finish) = if stream {
            let (t, f, _) = streamed_text(&s.stream("/v1/chat/completions", body));
            (t, f)
        } else {
            let v = s.chat(body).1;
            (content(&v), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(text, before, "stop {stop:?}");
        assert_eq!(finish, "stop");
    }
}

#[test]
fn a_seed_gives_the_same_text_and_another_seed_other_text() {
    let Some(s) = server() else { return };
    let run = |seed: u64| {
        content(&s.chat(chat_body(PROMPTS[0], json!({ "temperature": 1.0, "seed": seed, "max_tokens": 32 }))).1)
    };
    let a = run(7);
    assert_eq!(run(7), a);
    assert!((8..12).any(|seed| run(seed) != a), "five seeds gave the same text: {a:?}");
}

#[test]
fn json_schema_output_validates() {
    let Some(s) = server() else { return };
    let schema = json!({ "type": "object", "properties": { "name": { "type": "string", "maxLength": 20 }, "age": { "type": "integer" } },
                         "required": ["name", "age"], "additionalProperties": false });
    let format = json!({ "type": "json_schema", "json_schema": { "name": "person", "schema": schema } });
    let (status, v) =
        s.chat(chat_body("Give me a person as JSON.", json!({ "response_format": format, "max_tokens": 60 })));
    assert_eq!(status, 200, "{v}");
    let out: Value = serde_json::from_str(content(&v).trim()).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(out["name"].is_string() && out["age"].is_i64(), "{out}");
    assert_eq!(out.as_object().unwrap().len(), 2);
    let (status, v) = s.chat(chat_body(
        "Any JSON object.",
        json!({ "response_format": { "type": "json_object" }, "max_tokens": 60, "temperature": 0.7, "seed": 1 }),
    ));
    assert_eq!(status, 200, "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(content(&v).trim()).unwrap().is_object());
    }
}

#[test]
fn a_required_tool_call_follows_the_tools_schema() {
    let Some(s) = server() else { return };
    let tools = json!([{ "type": "function", "function": { "name": "get_weather", "description": "Weather of a city",
        "parameters": { "type": "object", "properties": { "city": { "type": "string", "maxLength": 30 } }, "required": ["city"], "additionalProperties": false } } }]);
    for stream in [false, true] {
        let body = chat_body(
            "What is the weather in Paris?",
            json!({ "tools": tools, "tool_choice": "required", "max_tokens": 60, "stream": stream }),
        );
        let (call, finish) = if stream {
            let chunks = s.stream("/v1/chat/completions", body);
            let v: Value = serde_json::from_str(&chunks[0]).unwrap();
            let last: Value = serde_json::from_str(&chunks[1]).unwrap();
            (v["choices"][0]["delta"]["tool_calls"][0].clone(), last["choices"][0]["finish_reason"].clone())
        } else {
            let (status, v) = s.chat(body);
            assert_eq!(status, 200, "{v}");
            (v["choices"][0]["message"]["tool_calls"][0].clone(), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(finish, "tool_calls");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather", "{call}");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args["city"].is_string(), "{args}");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
    }
}

/// Status, error type, param and code of an error answer; checks its shape.
fn error(s: &TestServer, path: &str, body: &str) -> (u16, String, Value, Value) {
    let (status, v) = s.post(path, body);
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{status}: {v}");
    (status, e["type"].as_str().unwrap().to_string(), e["param"].clone(), e["code"].clone())
}

#[test]
fn bad_requests_get_openai_error_bodies_and_never_a_500() {
    let Some(s) = server() else { return };
    let chat = "/v1/chat/completions";
    let base = chat_body("hi", json!({}));
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b.to_string()
    };
    assert_eq!(error(s, chat, "{\"model\": ").0, 400);
    assert_eq!(error(s, chat, "[1, 2]").0, 400);
    let (status, kind, param, code) = error(s, chat, &with("frobnicate", json!(1)));
    assert_eq!(
        (status, kind.as_str(), param, code),
        (400, "invalid_request_error", json!("frobnicate"), json!("unknown_parameter"))
    );
    assert_eq!(error(s, chat, &with("temperature", json!("hot"))).2, "temperature");
    assert_eq!(error(s, chat, &with("temperature", json!(-1))).2, "temperature");
    assert_eq!(error(s, chat, &with("max_tokens", json!(-5))).2, "max_tokens");
    assert_eq!(error(s, chat, &with("n", json!(17))).2, "n");
    assert_eq!(error(s, chat, &with("n", json!(0))).2, "n");
    assert_eq!(error(s, chat, &with("top_p", json!(1.5))).2, "top_p");
    assert_eq!(error(s, chat, &with("logit_bias", json!({ "99999999": 5 }))).2, "logit_bias");
    assert_eq!(error(s, chat, &with("messages", json!([{ "role": "wizard", "content": "x" }]))).2, "messages");
    assert_eq!(error(s, chat, &with("messages", json!([]))).2, "messages");
    let (status, _, param, code) = error(s, chat, &with("model", json!("gpt-9")));
    assert_eq!((status, param, code), (404, json!("model"), json!("model_not_found")));
    let (status, _, param, code) = error(s, chat, &with("max_tokens", json!(100_000)));
    assert_eq!((status, param, code), (400, json!("max_tokens"), json!("context_length_exceeded")));
    let long = "word ".repeat(700);
    let (status, _, param, code) = error(s, chat, &chat_body(&long, json!({})).to_string());
    assert_eq!((status, param, code), (400, json!("messages"), json!("context_length_exceeded")));
    let bad_schema = json!({ "type": "json_schema", "json_schema": { "name": "x", "schema": { "type": 7 } } });
    assert_eq!(error(s, chat, &with("response_format", bad_schema)).2, "response_format");
    assert_eq!(error(s, chat, &with("tool_choice", json!("required"))).2, "tool_choice");
    assert_eq!(error(s, "/v1/completions", &json!({ "model": MODEL }).to_string()).2, "prompt");
    assert_eq!(error(s, "/v1/nothing", "{}").0, 404);
    let huge = format!("{{\"model\": \"{MODEL}\", \"prompt\": \"{}\"}}", "a".repeat(specdec_server::MAX_BODY));
    assert_eq!(error(s, "/v1/completions", &huge).0, 413);
    // The server still answers.
    assert_eq!(s.chat(chat_body("hi", json!({ "max_tokens": 4 }))).0, 200);
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_slot() {
    // One slot: the next request can only run once the first is cancelled.
    let Some(s) = start(1, 8, 4096) else { return };
    let resp = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .header("content-type", "application/json")
        .send(
            chat_body("Tell a very long story.", json!({ "max_tokens": 3000, "stream": true, "temperature": 0.8 }))
                .to_string(),
        )
        .unwrap();
    let mut reader = resp.into_body().into_reader();
    let mut first = [0u8; 64];
    reader.read_exact(&mut first).unwrap();
    drop(reader);
    let start = Instant::now();
    let (status, v) = s.chat(chat_body(PROMPTS[6], json!({ "max_tokens": 8 })));
    assert_eq!(status, 200, "{v}");
    let waited = start.elapsed();
    let metrics = s.state.server.metrics();
    assert_eq!(metrics.finished.cancelled, 1, "the first request ended as cancelled");
    assert!(metrics.completion_tokens < 3000, "{} tokens: the first request ran on", metrics.completion_tokens);
    eprintln!("the next request answered {:.2} s after the disconnect", waited.as_secs_f64());
    assert!(waited < Duration::from_secs(120));
}

/// The 8 prompts run one at a time, then all at once: the same texts, byte for byte.
fn same_alone_and_together(extra: impl Fn(usize) -> Value + Sync) {
    let Some(s) = server() else { return };
    let body = |i: usize| chat_body(PROMPTS[i], extra(i));
    let alone: Vec<String> = (0..8).map(|i| content(&s.chat(body(i)).1)).collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8).map(|i| scope.spawn(move || content(&s.chat(body(i)).1))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for i in 0..8 {
        assert_eq!(together[i], alone[i], "prompt {i}");
    }
}

#[test]
fn greedy_text_is_the_same_alone_or_among_8() {
    same_alone_and_together(|_| json!({}));
}

#[test]
fn seeded_text_is_the_same_alone_or_among_8() {
    same_alone_and_together(|i| json!({ "temperature": 0.8, "seed": 100 + i }));
}

/// A conversation resent with the model's answer hits the prefix cache (OpenAI's
/// `prompt_tokens_details.cached_tokens`), and sending it again gives the same seeded text
/// from a longer hit.
#[test]
fn a_resent_conversation_hits_the_prefix_cache_with_the_same_text() {
    let Some(s) = server() else { return };
    let (status, first) = s.chat(chat_body(PROMPTS[1], json!({ "max_tokens": 24 })));
    assert_eq!(status, 200, "{first}");
    let messages = json!([
        { "role": "user", "content": PROMPTS[1] },
        { "role": "assistant", "content": content(&first) },
        { "role": "user", "content": "Say it again, in other words." }
    ]);
    let body = chat_body("", json!({ "messages": messages, "temperature": 1.0, "seed": 3, "max_tokens": 24 }));
    let (a, b) = (s.chat(body.clone()).1, s.chat(body).1);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = b["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached(&a) > cached(&first), "{a}");
    assert!(cached(&b) >= prompt - 1, "{b}");
    assert_eq!(content(&a), content(&b));
    let metrics = s.get("/metrics").1;
    assert!(
        metrics.lines().any(|l| l.starts_with("specdec_prefix_cache_hits_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// `n` choices: choice i is what a single request seeded with the seed plus i gives, whole
/// and streamed (chunks carry their choice's index; one `[DONE]` after all).
#[test]
fn n_choices_each_equal_a_single_request_with_its_seed() {
    let Some(s) = server() else { return };
    let single = |seed: u64| {
        content(&s.chat(chat_body(PROMPTS[2], json!({ "temperature": 1.0, "seed": seed, "max_tokens": 16 }))).1)
    };
    let body = chat_body(PROMPTS[2], json!({ "temperature": 1.0, "seed": 40, "max_tokens": 16, "n": 3 }));
    let (status, v) = s.chat(body.clone());
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], json!(i));
        assert_eq!(c["message"]["content"].as_str().unwrap(), single(40 + i as u64), "choice {i}");
    }
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let chunks = s.stream("/v1/chat/completions", streamed);
    assert_eq!(chunks.iter().filter(|c| *c == "[DONE]").count(), 1);
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"));
    let mut texts = vec![String::new(); 3];
    for c in &chunks[..chunks.len() - 1] {
        let v: Value = serde_json::from_str(c).unwrap();
        for choice in v["choices"].as_array().unwrap() {
            let i = choice["index"].as_u64().unwrap() as usize;
            texts[i].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(t, choices[i]["message"]["content"].as_str().unwrap(), "streamed choice {i}");
    }
}

/// A client that reads its stream slowly (one SSE event a second) loses nothing and holds no
/// one back: a request beside it finishes with plain decoding's text while it is still
/// reading, and its own text, once read, is plain decoding's. (Its request runs on at full
/// speed: the socket's buffers and at most `--stream-buffer` events hold what it has not read;
/// a client further behind is ended, which `respond.rs`'s unit test shows.)
#[test]
fn a_slow_reader_loses_nothing_and_holds_no_one_back() {
    use std::io::BufRead;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(s) = server() else { return };
    let (slow_expected, other_expected) = (s.plain_chat(PROMPTS[3], 40), s.plain_chat(PROMPTS[4], 16));
    let other_done = AtomicBool::new(false);
    let (slow_chunks, other_finished_first) = std::thread::scope(|scope| {
        let slow = scope.spawn(|| {
            let body = chat_body(PROMPTS[3], json!({ "stream": true }));
            let resp = ureq::post(&format!("{}/v1/chat/completions", s.base))
                .header("content-type", "application/json")
                .send(body.to_string())
                .unwrap();
            let mut chunks = Vec::new();
            let mut other_finished_first = false;
            for line in std::io::BufReader::new(resp.into_body().into_reader()).lines() {
                let Some(data) = line.unwrap().strip_prefix("data: ").map(str::to_string) else { continue };
                chunks.push(data);
                if other_done.load(Ordering::SeqCst) {
                    other_finished_first |= chunks.last().map(String::as_str) != Some("[DONE]");
                } else {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            (chunks, other_finished_first)
        });
        // The other request starts once the slow one has its first event.
        std::thread::sleep(Duration::from_millis(500));
        let start = Instant::now();
        let (status, v) = s.chat(chat_body(PROMPTS[4], json!({ "max_tokens": 16 })));
        assert_eq!(status, 200, "{v}");
        eprintln!("the request beside a slow reader answered in {:.2} s", start.elapsed().as_secs_f64());
        assert_eq!(content(&v), other_expected);
        other_done.store(true, Ordering::SeqCst);
        slow.join().unwrap()
    });
    assert!(other_finished_first, "the request beside the slow reader finished only after it had read everything");
    assert_eq!(streamed_text(&slow_chunks).0, slow_expected);
}
