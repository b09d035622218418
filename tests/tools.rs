//! Tool-call speculation: hits, misses, the safety gate, failures that must not leak, the
//! language-model adapter, and the closed form against simulation. No timing assertions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};
use specdec::tools::{
    simulate_speedup, speedup, Dispatch, Executor, HistoryPredictor, ModelSpeculator, Outcome, Registry, Safety,
    Speculator, ToolCall,
};
use specdec::toy::MarkovModel;
use specdec::{Error, Result};

/// Registers `name`, which counts its invocations and echoes its arguments.
fn counting(reg: &mut Registry, name: &str, safety: Safety) -> Result<Arc<AtomicUsize>> {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    reg.register(name, safety, move |args| {
        seen.fetch_add(1, Ordering::SeqCst);
        Ok(args.clone())
    })?;
    Ok(count)
}

/// Registers `name`, whose first invocation (the speculative one) misbehaves as `first` says.
fn flaky(reg: &mut Registry, name: &str, first: fn() -> std::result::Result<Value, String>) -> Result<()> {
    let count = AtomicUsize::new(0);
    reg.register(name, Safety::ReadOnly, move |args| {
        if count.fetch_add(1, Ordering::SeqCst) == 0 {
            first()
        } else {
            Ok(json!({"real": args.clone()}))
        }
    })?;
    Ok(())
}

/// Always predicts the same call, however wrong or dangerous.
struct Always(ToolCall);

impl Speculator for Always {
    fn predict(&mut self, _: &[ToolCall]) -> Result<Option<ToolCall>> {
        Ok(Some(self.0.clone()))
    }
}

#[test]
fn hit_serves_the_speculative_result_without_a_second_run() -> Result<()> {
    let mut reg = Registry::new();
    let count = counting(&mut reg, "search", Safety::ReadOnly)?;
    let mut exec = Executor::new(reg);
    let spelled = ToolCall::new("search", json!({"q": "rust", "opts": {"k": 3, "lang": "en"}}));
    assert_eq!(exec.speculate(&spelled)?, Dispatch::Started);
    assert_eq!(exec.stats().launched, 1, "the worker is counted as it starts");
    let actual = ToolCall::new("search", json!({"opts": {"lang": "en", "k": 3.0}, "q": "rust"}));
    let done = exec.execute(&actual)?;
    assert_eq!(done.outcome, Outcome::Hit);
    assert_eq!(&done.value, actual.args());
    assert_eq!(count.load(Ordering::SeqCst), 1, "the tool ran once, speculatively");
    let s = exec.stats();
    assert_eq!((s.turns, s.predictions, s.matches, s.hits, s.misses), (1, 1, 1, 1, 0));
    assert_eq!(s.hit_rate(), 1.0);
    Ok(())
}

#[test]
fn miss_discards_the_speculative_result_and_runs_the_real_call() -> Result<()> {
    let mut reg = Registry::new();
    let count = counting(&mut reg, "search", Safety::ReadOnly)?;
    let fetches = counting(&mut reg, "fetch", Safety::Idempotent)?;
    let mut exec = Executor::new(reg);
    // Same tool, nearly the same arguments: still a different call.
    exec.speculate(&ToolCall::new("search", json!({"q": "rust"})))?;
    let done = exec.execute(&ToolCall::new("search", json!({"q": "rust "})))?;
    assert_eq!(done.outcome, Outcome::Miss);
    assert_eq!(done.value, json!({"q": "rust "}));
    // An idempotent speculative run is awaited on a miss, so it has run by now.
    exec.speculate(&ToolCall::new("fetch", json!({"id": 1})))?;
    let done = exec.execute(&ToolCall::new("search", json!({"q": "go"})))?;
    assert_eq!((done.outcome, done.value), (Outcome::Miss, json!({"q": "go"})));
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "the idempotent run finished before the real call");
    // No speculation pending: the next turn is plain.
    let done = exec.execute(&ToolCall::new("fetch", json!({"id": 1})))?;
    assert_eq!(done.outcome, Outcome::NotSpeculated);
    let s = exec.stats();
    assert_eq!((s.turns, s.hits, s.misses, s.matches), (3, 0, 2, 0));
    // Detached speculative runs may still finish later; the real calls ran in any case.
    assert!(count.load(Ordering::SeqCst) >= 2);
    Ok(())
}

#[test]
fn side_effecting_tool_is_never_pre_run() -> Result<()> {
    let mut reg = Registry::new();
    let charges = counting(&mut reg, "charge_card", Safety::SideEffecting)?;
    let mut exec = Executor::new(reg);
    let charge = ToolCall::new("charge_card", json!({"amount": 10}));
    let mut oracle = Always(charge.clone());
    for turn in 1..=20 {
        assert_eq!(exec.speculate_next(&mut oracle, &[])?, Dispatch::SideEffecting);
        assert_eq!(exec.speculate(&charge)?, Dispatch::SideEffecting);
        // Counted when a worker starts, not when it runs: no race with the scheduler.
        assert_eq!(exec.stats().launched, 0, "a worker was started before turn {turn}");
        assert_eq!(charges.load(Ordering::SeqCst), turn - 1, "pre-run before turn {turn}");
        let done = exec.execute(&charge)?;
        assert_eq!(done.outcome, Outcome::NotSpeculated);
        assert_eq!(charges.load(Ordering::SeqCst), turn);
    }
    let s = exec.stats();
    assert_eq!((s.turns, s.matches, s.hits, s.blocked), (20, 20, 0, 20));
    assert_eq!(s.hit_rate(), 0.0);
    assert_eq!(s.prediction_accuracy(), 1.0);
    Ok(())
}

#[test]
fn speculative_error_does_not_leak() -> Result<()> {
    let mut reg = Registry::new();
    flaky(&mut reg, "lookup", || Err("transient backend error".into()))?;
    let mut exec = Executor::new(reg);
    let call = ToolCall::new("lookup", json!({"k": 1}));
    exec.speculate(&call)?;
    let done = exec.execute(&call)?;
    assert_eq!(done.outcome, Outcome::Fallback("transient backend error".into()));
    assert_eq!(done.value, json!({"real": {"k": 1}}));
    assert_eq!((exec.stats().failed, exec.stats().hits), (1, 0));
    Ok(())
}

#[test]
fn speculative_panic_does_not_leak() -> Result<()> {
    let mut reg = Registry::new();
    flaky(&mut reg, "lookup", || panic!("speculative run blew up"))?;
    let mut exec = Executor::new(reg);
    let call = ToolCall::new("lookup", json!({"k": 2}));
    exec.speculate(&call)?;
    let done = exec.execute(&call)?;
    assert!(matches!(&done.outcome, Outcome::Fallback(r) if r.contains("speculative run blew up")), "{done:?}");
    assert_eq!(done.value, json!({"real": {"k": 2}}));
    Ok(())
}

#[test]
fn speculative_timeout_does_not_leak() -> Result<()> {
    // The speculative run blocks until the test has its answer, so it cannot finish in time
    // however slow or loaded the machine (no race against the wall clock).
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    let count = AtomicUsize::new(0);
    let mut reg = Registry::new();
    reg.register("slow", Safety::ReadOnly, move |args| {
        if count.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = gate.lock().map(|g| g.recv());
            return Ok(json!("too late"));
        }
        Ok(json!({"real": args.clone()}))
    })?;
    let mut exec = Executor::new(reg).timeout(Duration::from_millis(20));
    let call = ToolCall::new("slow", json!(null));
    exec.speculate(&call)?;
    let done = exec.execute(&call)?;
    let _ = release.send(());
    assert_eq!(done.outcome, Outcome::Fallback("timed out".into()));
    assert_eq!(done.value, json!({"real": null}));
    Ok(())
}

#[test]
fn a_failing_real_call_is_an_error_and_unknown_predictions_are_ignored() -> Result<()> {
    let mut reg = Registry::new();
    reg.register("broken", Safety::ReadOnly, |_| Err("always fails".into()))?;
    let mut exec = Executor::new(reg);
    assert_eq!(exec.speculate(&ToolCall::new("nope", json!(null)))?, Dispatch::UnknownTool);
    assert!(matches!(exec.execute(&ToolCall::new("nope", json!(null))), Err(Error::Tool { .. })));
    let broken = ToolCall::new("broken", json!(null));
    exec.speculate(&broken)?;
    let err = exec.execute(&broken).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("always fails"), "{err}");
    assert_eq!(exec.stats().turns, 2);
    Ok(())
}

#[test]
fn history_predictor_learns_a_cyclic_agent() -> Result<()> {
    let mut reg = Registry::new();
    counting(&mut reg, "search", Safety::ReadOnly)?;
    counting(&mut reg, "fetch", Safety::ReadOnly)?;
    let cycle = [
        ToolCall::new("search", json!({"q": "a"})),
        ToolCall::new("fetch", json!({"id": 1})),
        ToolCall::new("search", json!({"q": "b"})),
        ToolCall::new("fetch", json!({"id": 2})),
    ];
    let mut exec = Executor::new(reg);
    let mut predictor = HistoryPredictor::new();
    let mut trajectory = Vec::new();
    for turn in 0..20 {
        exec.speculate_next(&mut predictor, &trajectory)?;
        let actual = cycle[turn % 4].clone();
        let done = exec.execute(&actual)?;
        assert_eq!(done.value, *actual.args());
        assert_eq!(done.outcome == Outcome::Hit, turn >= 5, "turn {turn}: {:?}", done.outcome);
        predictor.observe(&trajectory, &actual);
        trajectory.push(actual);
    }
    assert_eq!((exec.stats().hits, exec.stats().predictions), (15, 19));
    Ok(())
}

#[test]
fn model_speculator_proposes_the_next_call() -> Result<()> {
    // Tokens 0..4 name tools t0..t3, token 4 ends a call. An order-2 model: after (t, END) comes
    // t + 1 mod 4; after any tool token comes END.
    const END: u32 = 4;
    let mut table = Vec::new();
    for a in 0..5u32 {
        for b in 0..5u32 {
            let next = if b == END { (a + 1) % 4 } else { END };
            table.extend((0..5).map(|t| if t == next { 1.0 } else { 1e-6 }));
        }
    }
    let model = MarkovModel::new(5, 2, table)?;
    let id = |c: &ToolCall| {
        c.name()
            .trim_start_matches('t')
            .parse::<u32>()
            .map_err(|e| Error::Tool { tool: c.name().to_string(), reason: e.to_string() })
    };
    let render = move |calls: &[ToolCall]| Ok(vec![calls.last().map(id).transpose()?.unwrap_or(3), END]);
    let parse = |tokens: &[u32]| match tokens {
        [t] => Some(ToolCall::new(format!("t{t}"), json!({}))),
        _ => None,
    };
    let mut spec = ModelSpeculator::new(model, render, parse, 4)?.stop_tokens([END]);
    let mut reg = Registry::new();
    for t in 0..4 {
        counting(&mut reg, &format!("t{t}"), Safety::ReadOnly)?;
    }
    let mut exec = Executor::new(reg);
    let mut trajectory = Vec::new();
    for turn in 0..8 {
        assert_eq!(exec.speculate_next(&mut spec, &trajectory)?, Dispatch::Started);
        let actual = ToolCall::new(format!("t{}", turn % 4), json!({}));
        assert_eq!(exec.execute(&actual)?.outcome, Outcome::Hit, "turn {turn}");
        trajectory.push(actual);
    }
    assert!(ModelSpeculator::new(MarkovModel::random(4, 1, 0), render, parse, 0).is_err());
    Ok(())
}

#[test]
fn closed_form_matches_simulation() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(2026);
    for alpha in [0.0, 0.441, 0.612, 0.489, 0.663, 1.0] {
        for rho in [0.25, 0.5, 1.0, 2.0, 4.0] {
            let closed = speedup(alpha, rho, 0.05)?;
            let simulated = simulate_speedup(alpha, rho, 0.05, 200_000, &mut rng)?;
            // The standard error is about 0.1 %: 0.5 % is five of them.
            assert!((simulated / closed - 1.0).abs() < 0.005, "α={alpha} ρ={rho}: {simulated} vs {closed}");
        }
    }
    Ok(())
}
