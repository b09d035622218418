//! Load: 64 streamed requests from 16 concurrent clients against SmolLM2-135M all complete,
//! well-formed and without error, in bounded time; afterwards the server is idle and its
//! memory is back near its level after a warm-up load.

mod common;

use std::time::Instant;

use common::{start, streamed_text, MODEL};
use serde_json::json;

/// The resident memory of this process (the server runs in it), in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb =
        status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok());
    kb.unwrap_or(0.0) / 1024.0
}

/// `requests` streamed chats from `clients` threads; returns the completion tokens.
fn load(s: &common::TestServer, clients: usize, requests: usize) -> u64 {
    let per = requests / clients;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                scope.spawn(move || {
                    let mut tokens = 0;
                    for r in 0..per {
                        let body = json!({ "model": MODEL, "stream": true, "stream_options": { "include_usage": true },
                            "max_tokens": 24, "temperature": 0.7, "seed": c * 100 + r,
                            "messages": [{ "role": "user", "content": format!("Request {r} of client {c}: name an animal.") }] });
                        let (text, finish, usage) = streamed_text(&s.stream("/v1/chat/completions", body));
                        assert!(finish == "stop" || finish == "length", "{finish}");
                        let usage = usage.expect("a usage chunk");
                        assert!(finish == "stop" || usage["completion_tokens"] == 24, "{usage}");
                        assert!(finish == "stop" || !text.is_empty());
                        tokens += usage["completion_tokens"].as_u64().unwrap();
                    }
                    tokens
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a client")).sum()
    })
}

#[test]
fn sixty_four_streams_from_sixteen_clients_all_complete_and_memory_returns() {
    let Some(s) = start(8, 64, 1024) else { return };
    load(&s, 16, 16); // warm-up: every slot's buffers allocated once
    let idle = rss_mib();
    let t = Instant::now();
    let tokens = load(&s, 16, 64);
    let secs = t.elapsed().as_secs_f64();
    let m = s.state.server.metrics();
    assert_eq!((m.running, m.queued), (0, 0));
    assert_eq!(m.finished.stop + m.finished.length, 80, "{m:?}");
    assert_eq!(m.finished.failed, 0, "no request failed");
    let after = rss_mib();
    eprintln!("64 requests, {tokens} tokens in {secs:.1} s ({:.1} tok/s); memory {idle:.0} MiB after warm-up, {after:.0} MiB after the load", tokens as f64 / secs);
    assert!(secs < 600.0, "the load took {secs:.0} s");
    assert!(after < idle * 1.15 + 32.0, "memory grew from {idle:.0} MiB to {after:.0} MiB");
}
