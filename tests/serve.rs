//! The serving scheduler on toy models: every request gets what plain decoding with its
//! settings gives, whatever else runs beside it; a request that panics or errs fails alone
//! and the server goes on, and so does one whose callback panics; a full queue is a typed
//! `Busy`; a dropped stream frees its slot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use specdec::batch::Request;
use specdec::sampling::{History, LogitsProcessor, ProcessorFactory};
use specdec::serve::{Event, Job, ServeConfig, Server, Stream};
use specdec::toy::{MarkovModel, ToyPair};
use specdec::{Error, FinishReason, KPolicy, PlainDecoder, Result, SamplingConfig};

const VOCAB: usize = 16;

fn server(max_running: usize, max_queued: usize) -> Result<Server> {
    let ToyPair { target, draft } = MarkovModel::pair(VOCAB, 0.2, 7);
    let mut config = ServeConfig::default();
    (config.max_running, config.max_queued, config.policy) = (max_running, max_queued, KPolicy::Fixed(3));
    Server::start(config, None, move || Ok((target.clone(), draft.clone())))
}

fn job(prompt: Vec<u32>, sampling: SamplingConfig, n: usize) -> Job {
    Job::new(Request::new(prompt).sampling(sampling).max_new_tokens(n), Vec::new())
}

/// A stream's tokens and its last event.
fn drain(stream: Stream) -> (Vec<u32>, Event) {
    let mut tokens = Vec::new();
    for e in stream {
        match e {
            Event::Delta { tokens: t, .. } => tokens.extend(t),
            last => return (tokens, last),
        }
    }
    panic!("the stream ended without a last event")
}

fn plain(prompt: &[u32], sampling: SamplingConfig, n: usize) -> Result<Vec<u32>> {
    let ToyPair { target, .. } = MarkovModel::pair(VOCAB, 0.2, 7);
    Ok(PlainDecoder::new(target, sampling).max_new_tokens(n).generate(prompt)?.tokens)
}

/// Settings for request `i`: greedy, and coupled sampling with a seed of its own.
fn settings(i: u64) -> Result<SamplingConfig> {
    Ok(if i.is_multiple_of(2) { SamplingConfig::greedy() } else { SamplingConfig::new(0.9)?.with_seed(i).coupled() })
}

#[test]
fn every_request_gets_what_plain_decoding_gives_it() -> Result<()> {
    let server = server(4, 64)?;
    let streams: Vec<Stream> =
        (0..10u64).map(|i| server.submit(job(vec![1 + i as u32 % 7, 3], settings(i)?, 40))).collect::<Result<_>>()?;
    for (i, s) in streams.into_iter().enumerate() {
        let (tokens, last) = drain(s);
        let Event::Done(outcome) = last else { panic!("request {i}: {last:?}") };
        assert_eq!(outcome.completion_tokens, tokens.len());
        assert_eq!(tokens, plain(&[1 + i as u32 % 7, 3], settings(i as u64)?, 40)?, "request {i}");
    }
    let m = server.metrics();
    assert_eq!((m.requests, m.finished.length, m.completion_tokens), (10, 10, 400));
    assert!(m.drafted > 0 && m.accepted > 0 && m.steps.drafting > 0, "{m:?}");
    assert!(m.to_prometheus().contains("specdec_generated_tokens_total 400"));
    Ok(())
}

/// A processor that panics, or errs, once the output is `at` tokens long.
#[derive(Debug)]
struct Faulty {
    at: usize,
    panics: bool,
}

impl LogitsProcessor for Faulty {
    fn process(&mut self, history: &History, _logits: &mut [f32]) -> Result<()> {
        if history.output().count() >= self.at {
            if self.panics {
                panic!("a faulty processor");
            }
            return Err(Error::Grammar("a faulty processor".into()));
        }
        Ok(())
    }
}

fn faulty(panics: bool) -> ProcessorFactory {
    Arc::new(move || Box::new(Faulty { at: 5, panics }))
}

#[test]
fn a_request_that_panics_or_errs_fails_alone_and_the_server_goes_on() -> Result<()> {
    let server = server(4, 64)?;
    for panics in [true, false] {
        let bad = server.submit(job(vec![2, 3], SamplingConfig::greedy().with_processor(faulty(panics)), 30))?;
        let good: Vec<Stream> =
            (0..3u64).map(|i| server.submit(job(vec![4 + i as u32], settings(i)?, 30))).collect::<Result<_>>()?;
        let (_, last) = drain(bad);
        match (panics, last) {
            (true, Event::Failed(Error::Panicked(m))) => assert!(m.contains("faulty"), "{m}"),
            (false, Event::Failed(Error::Grammar(_))) => {}
            (_, other) => panic!("panics {panics}: {other:?}"),
        }
        for (i, s) in good.into_iter().enumerate() {
            let (tokens, last) = drain(s);
            assert!(matches!(last, Event::Done(_)), "{last:?}");
            assert_eq!(tokens, plain(&[4 + i as u32], settings(i as u64)?, 30)?);
        }
    }
    let (tokens, _) = drain(server.submit(job(vec![5], SamplingConfig::greedy(), 12))?);
    assert_eq!(tokens, plain(&[5], SamplingConfig::greedy(), 12)?);
    assert_eq!(server.metrics().finished.failed, 2);
    Ok(())
}

#[test]
fn a_sink_that_panics_ends_its_own_request_and_the_server_goes_on() -> Result<()> {
    let server = server(4, 64)?;
    // A callback that panics at its third event (beside three requests read as streams).
    let (tx, rx) = mpsc::channel();
    let mut events = 0;
    let sink: specdec::serve::Sink = Box::new(move |e| {
        events += 1;
        if events == 3 {
            panic!("a faulty sink");
        }
        let _ = tx.send(e);
        std::ops::ControlFlow::Continue(())
    });
    server.submit_with(job(vec![2, 3], SamplingConfig::greedy(), 30), sink)?;
    let good: Vec<Stream> =
        (0..3u64).map(|i| server.submit(job(vec![4 + i as u32], settings(i)?, 30))).collect::<Result<_>>()?;
    for (i, s) in good.into_iter().enumerate() {
        let (tokens, last) = drain(s);
        assert!(matches!(last, Event::Done(_)), "{last:?}");
        assert_eq!(tokens, plain(&[4 + i as u32], settings(i as u64)?, 30)?, "request {i}");
    }
    // The faulty request heard two events, panicked at the third, and was cancelled, as if
    // its listener had left: its last event says so.
    let heard: Vec<Event> = rx.iter().collect();
    assert_eq!(heard.len(), 3, "{heard:?}");
    assert!(matches!(&heard[2], Event::Done(o) if o.finish == FinishReason::Cancelled), "{heard:?}");
    let (tokens, _) = drain(server.submit(job(vec![5], SamplingConfig::greedy(), 12))?);
    assert_eq!(tokens, plain(&[5], SamplingConfig::greedy(), 12)?, "a new request after the panic");
    let m = server.metrics();
    assert_eq!((m.finished.length, m.finished.cancelled), (4, 1), "four whole requests and the cancelled one");
    Ok(())
}

/// A processor that tells `entered` when first called, then waits until `open`.
#[derive(Debug)]
struct Gate {
    entered: Mutex<Option<mpsc::Sender<()>>>,
    open: Arc<AtomicBool>,
}

impl LogitsProcessor for Gate {
    fn process(&mut self, _: &History, _: &mut [f32]) -> Result<()> {
        if let Some(tx) = self.entered.lock().unwrap().take() {
            let _ = tx.send(());
        }
        while !self.open.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}

#[test]
fn a_full_queue_is_busy_and_the_queued_requests_still_run() -> Result<()> {
    let server = server(1, 2)?;
    let (tx, entered) = mpsc::channel();
    let open = Arc::new(AtomicBool::new(false));
    let (gate_open, tx) = (open.clone(), Mutex::new(Some(tx)));
    let tx = Arc::new(tx);
    let gate: ProcessorFactory =
        Arc::new(move || Box::new(Gate { entered: Mutex::new(tx.lock().unwrap().take()), open: gate_open.clone() }));
    let first = server.submit(job(vec![1], SamplingConfig::greedy().with_processor(gate), 8))?;
    entered.recv_timeout(Duration::from_secs(60)).expect("the first request runs");
    let queued: Vec<Stream> =
        (0..2).map(|i| server.submit(job(vec![2 + i], SamplingConfig::greedy(), 8))).collect::<Result<_>>()?;
    assert!(matches!(server.submit(job(vec![9], SamplingConfig::greedy(), 8)), Err(Error::Busy { queued: 2 })));
    assert_eq!(server.metrics().rejected, 1);
    open.store(true, Ordering::Relaxed);
    assert!(matches!(drain(first).1, Event::Done(_)));
    for s in queued {
        assert!(matches!(drain(s).1, Event::Done(_)));
    }
    Ok(())
}

#[test]
fn a_dropped_stream_frees_its_slot() -> Result<()> {
    let server = server(1, 8)?;
    let mut long = server.submit(job(vec![1], SamplingConfig::greedy(), 5_000_000))?;
    assert!(matches!(long.next(), Some(Event::Delta { .. })));
    drop(long);
    let start = Instant::now();
    let (tokens, last) = drain(server.submit(job(vec![3], SamplingConfig::greedy(), 10))?);
    assert_eq!(tokens.len(), 10, "{last:?}");
    let m = server.metrics();
    assert_eq!(m.finished.cancelled, 1, "the dropped request ended as cancelled");
    assert!(m.completion_tokens < 5_000_000, "{} tokens: the slot was not freed", m.completion_tokens);
    eprintln!("the next request finished {:.3} s after the drop", start.elapsed().as_secs_f64());
    // A cancelled stream ends with its outcome.
    let s = server.submit(job(vec![1], SamplingConfig::greedy(), 5_000_000))?;
    s.cancel();
    match drain(s).1 {
        Event::Done(o) => assert_eq!(o.finish, FinishReason::Cancelled),
        other => panic!("{other:?}"),
    }
    Ok(())
}
