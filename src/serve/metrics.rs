//! What a server reports about itself: counters, gauges and latency histograms, rendered in
//! Prometheus' text format.

use std::fmt::Write;

use serde::Serialize;

use crate::prefix::PrefixStats;

/// Upper bounds (seconds) of the time-to-first-token buckets.
const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Upper bounds (seconds) of the per-token latency buckets.
const TOKEN_BUCKETS: [f64; 11] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.25, 0.5, 1.0];

/// A histogram with fixed buckets.
#[derive(Debug, Clone, Serialize)]
pub struct Histogram {
    /// The buckets' upper bounds.
    pub bounds: Vec<f64>,
    /// Observations in each bucket (not cumulative), then those above the last bound.
    pub counts: Vec<u64>,
    /// The sum of the observations.
    pub sum: f64,
}

impl Histogram {
    fn new(bounds: &[f64]) -> Self {
        Self { bounds: bounds.to_vec(), counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    /// Adds `n` observations of `value`.
    pub(crate) fn observe(&mut self, value: f64, n: u64) {
        let i = self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len());
        self.counts[i] += n;
        self.sum += value * n as f64;
    }

    /// How many observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Finished requests, by why they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Endings {
    /// At a stop token or stop string.
    pub stop: u64,
    /// At the length limit.
    pub length: u64,
    /// Cancelled by the client (or its listener gone).
    pub cancelled: u64,
    /// Failed (a bad request the queue took, or a failure while generating).
    pub failed: u64,
}

/// Batch steps, by whether some sequence drafted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Steps {
    /// Steps in which some sequence drafted.
    pub drafting: u64,
    /// Steps in which none did.
    pub plain: u64,
}

/// A snapshot of a server's counters (totals since it started) and gauges.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Metrics {
    /// Requests accepted into the queue.
    pub requests: u64,
    /// Requests refused because the queue was full.
    pub rejected: u64,
    /// Finished requests by reason.
    pub finished: Endings,
    /// Prompt tokens of the requests started.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Drafted tokens, and those accepted.
    pub drafted: u64,
    /// Drafted tokens the target accepted.
    pub accepted: u64,
    /// Target calls after the prefills.
    pub target_calls: u64,
    /// Batch steps, with drafts and without.
    pub steps: Steps,
    /// Sequences generating now.
    pub running: usize,
    /// Requests waiting for a slot now.
    pub queued: usize,
    /// Prompt tokens prefilled (those not found in the prefix cache).
    pub prefill_tokens: u64,
    /// The prefix cache's counters and size (all zero without one).
    pub prefix: PrefixStats,
    /// Seconds from a request's arrival to its first token.
    pub time_to_first_token: Histogram,
    /// Seconds per generated token (a step's time over the tokens it gave a sequence).
    pub token_latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: 0,
            rejected: 0,
            finished: Endings::default(),
            prompt_tokens: 0,
            completion_tokens: 0,
            drafted: 0,
            accepted: 0,
            target_calls: 0,
            steps: Steps::default(),
            running: 0,
            queued: 0,
            prefill_tokens: 0,
            prefix: PrefixStats::default(),
            time_to_first_token: Histogram::new(&TTFT_BUCKETS),
            token_latency: Histogram::new(&TOKEN_BUCKETS),
        }
    }
}

impl Metrics {
    /// The snapshot in Prometheus' text exposition format, metric names prefixed `specdec_`.
    pub fn to_prometheus(&self) -> String {
        let mut s = String::new();
        let mut one = |name: &str, kind: &str, help: &str, lines: &[(String, f64)]| {
            let _ = writeln!(s, "# HELP specdec_{name} {help}\n# TYPE specdec_{name} {kind}");
            for (labels, v) in lines {
                let _ = writeln!(s, "specdec_{name}{labels} {v}");
            }
        };
        let plain = |v: f64| vec![(String::new(), v)];
        one("requests_total", "counter", "Requests accepted into the queue.", &plain(self.requests as f64));
        one("requests_rejected_total", "counter", "Requests refused: queue full.", &plain(self.rejected as f64));
        let f = self.finished;
        let reasons = [("stop", f.stop), ("length", f.length), ("cancelled", f.cancelled), ("failed", f.failed)];
        let by_reason: Vec<_> = reasons.iter().map(|(r, n)| (format!("{{reason=\"{r}\"}}"), *n as f64)).collect();
        one("requests_finished_total", "counter", "Finished requests by reason.", &by_reason);
        one("prompt_tokens_total", "counter", "Prompt tokens of started requests.", &plain(self.prompt_tokens as f64));
        let p = &self.prefix;
        let single: [(&str, &str, &str, f64); 9] = [
            (
                "prefill_tokens_total",
                "counter",
                "Prompt tokens prefilled (not from the cache).",
                self.prefill_tokens as f64,
            ),
            ("prefix_cache_lookups_total", "counter", "Prompts looked up in the prefix cache.", p.lookups as f64),
            ("prefix_cache_hits_total", "counter", "Prompts that found a cached prefix.", p.hits as f64),
            (
                "prefix_cache_hit_tokens_total",
                "counter",
                "Prompt tokens the target took from the cache.",
                p.hit_tokens as f64,
            ),
            (
                "prefix_cache_draft_hit_tokens_total",
                "counter",
                "Prompt tokens the draft took from the cache.",
                p.draft_hit_tokens as f64,
            ),
            ("prefix_cache_evictions_total", "counter", "Cache entries evicted.", p.evictions as f64),
            (
                "prefix_cache_evicted_tokens_total",
                "counter",
                "Positions evicted from the cache.",
                p.evicted_tokens as f64,
            ),
            ("prefix_cache_bytes", "gauge", "Bytes the prefix cache holds.", p.bytes as f64),
            ("prefix_cache_budget_bytes", "gauge", "The most bytes the prefix cache holds.", p.budget as f64),
        ];
        for (name, kind, help, value) in &single {
            one(name, kind, help, &plain(*value));
        }
        one("generated_tokens_total", "counter", "Tokens generated.", &plain(self.completion_tokens as f64));
        one("drafted_tokens_total", "counter", "Tokens drafted.", &plain(self.drafted as f64));
        one("accepted_tokens_total", "counter", "Drafted tokens accepted.", &plain(self.accepted as f64));
        one("target_calls_total", "counter", "Target forward calls after prefill.", &plain(self.target_calls as f64));
        let steps = vec![
            ("{speculation=\"on\"}".into(), self.steps.drafting as f64),
            ("{speculation=\"off\"}".into(), self.steps.plain as f64),
        ];
        one("steps_total", "counter", "Batch steps, with and without drafts.", &steps);
        one("running_sequences", "gauge", "Sequences generating.", &plain(self.running as f64));
        one("queued_requests", "gauge", "Requests waiting for a slot.", &plain(self.queued as f64));
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        one(
            "acceptance_rate",
            "gauge",
            "Accepted over drafted tokens, since start.",
            &plain(ratio(self.accepted, self.drafted)),
        );
        let per_call = ratio(self.completion_tokens, self.target_calls);
        one("tokens_per_target_call", "gauge", "Generated tokens per target call, since start.", &plain(per_call));
        histogram(&mut s, "time_to_first_token_seconds", "Arrival to first token.", &self.time_to_first_token);
        histogram(&mut s, "token_latency_seconds", "Seconds per generated token.", &self.token_latency);
        s
    }
}

fn histogram(s: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(s, "# HELP specdec_{name} {help}\n# TYPE specdec_{name} histogram");
    let mut total = 0;
    for (bound, n) in h.bounds.iter().zip(&h.counts) {
        total += n;
        let _ = writeln!(s, "specdec_{name}_bucket{{le=\"{bound}\"}} {total}");
    }
    let _ = writeln!(s, "specdec_{name}_bucket{{le=\"+Inf\"}} {}", h.count());
    let _ = writeln!(s, "specdec_{name}_sum {}\nspecdec_{name}_count {}", h.sum, h.count());
}
