//! Serving (feature `serve`): one scheduler thread owns a [`BatchDecoder`]; requests come
//! from any thread and each gets a stream of [`Event`]s. Plain threads and channels, no async
//! runtime.
//!
//! Between two steps the scheduler takes in new requests, admits queued ones while fewer than
//! [`ServeConfig::max_running`] sequences run (a sequence joins with its prefill), ends
//! cancelled ones (a [`Stream`] dropped or cancelled frees its slot before the next step),
//! steps the batch, and hands each sequence's new tokens and text out. Past
//! [`ServeConfig::max_queued`] waiting requests, [`Server::submit`] answers [`Error::Busy`]
//! rather than queue without bound. A step that fails (an error or a panic) is repeated for
//! each sequence alone ([`BatchDecoder::step_alone`]): a sequence whose own step fails ends
//! with [`Event::Failed`], the others go on with the tokens they had. Each sequence samples
//! from its own seeded generator, so its text does not depend on the batch it runs in.

mod metrics;
mod text;

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

pub use metrics::{Endings, Histogram, Metrics, Steps};
use text::TextOut;

use crate::adaptive::{CostModel, KPolicy};
use crate::batch::{BatchDecoder, Finished, Request, SeqId};
use crate::error::{Error, Result};
use crate::model::{DraftModel, TargetModel};
use crate::pair::Pair;
use crate::prefix::{PrefixCache, DEFAULT_BUDGET};
use crate::stats::{FinishReason, Stats, TokenLogprob};
use crate::tokenizer::Tokenizer;

/// Limits and the batch's k policy.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeConfig {
    /// The most sequences generating at once (default 8).
    pub max_running: usize,
    /// The most requests waiting for a slot (default 64); past it, [`Error::Busy`].
    pub max_queued: usize,
    /// How the batch picks each sequence's k (default adaptive: the batch-aware k).
    pub policy: KPolicy,
    /// The most bytes the prefix cache holds (default [`DEFAULT_BUDGET`], 1 GiB); 0: no
    /// cache. Requests that resend a conversation prefill only what is new, with the same
    /// output (see [`PrefixCache`]). Beside it, each slot's models keep their own states
    /// (up to `max_running` contexts).
    pub prefix_cache_bytes: usize,
    /// The most prompt tokens prefilled per step while other sequences decode (default 32;
    /// `None`: a prompt is prefilled whole when its request is admitted). Smaller keeps the
    /// running streams' pace; larger brings a long prompt's first token sooner (see
    /// [`BatchDecoder::with_prefill_chunk`]).
    pub prefill_chunk: Option<usize>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            max_running: 8,
            max_queued: 64,
            policy: KPolicy::default(),
            prefix_cache_bytes: DEFAULT_BUDGET,
            prefill_chunk: Some(32),
        }
    }
}

/// A request to serve: the tokens, sampling and stop rule of a batch [`Request`], and stop
/// strings (the text ends before the first of them, even across token boundaries).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Job {
    /// Prompt, sampling settings with their seed, stop tokens and token limit.
    pub request: Request,
    /// Strings that end the text (not included in it).
    pub stop_strings: Vec<String>,
}

impl Job {
    /// A job for `request`, its text ending before the first of `stop_strings`.
    pub fn new(request: Request, stop_strings: Vec<String>) -> Self {
        Self { request, stop_strings }
    }
}

/// What a request's stream carries.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// New tokens, and the text they complete (possibly empty: text held back while it may
    /// begin a stop string, or an unfinished character).
    Delta {
        /// The tokens.
        tokens: Vec<u32>,
        /// Their text.
        text: String,
        /// The tokens' log-probabilities, one per token, when the request's sampling settings
        /// ask for them ([`SamplingConfig::with_logprobs`](crate::SamplingConfig::with_logprobs));
        /// empty otherwise.
        logprobs: Vec<TokenLogprob>,
    },
    /// The request ended; the last event.
    Done(Outcome),
    /// The request failed; the last event. The server goes on.
    Failed(Error),
}

/// How a request ended.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Outcome {
    /// Why it ended (`Stop` also for a stop string).
    pub finish: FinishReason,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (up to a stop string: the tokens it took to see it).
    pub completion_tokens: usize,
    /// Seconds from [`Server::submit`] to the first token.
    pub first_token_secs: f64,
    /// The sequence's statistics (acceptance, target calls, times of the steps it was in).
    pub stats: Stats,
}

/// Where a request's events go: `Break` when nobody listens any more (the request is then
/// cancelled). A sink that panics is taken for one whose listener left: its request ends, the
/// others and the scheduler go on.
pub type Sink = Box<dyn FnMut(Event) -> ControlFlow<()> + Send>;

/// A request's events, in order; dropping it cancels the request.
#[derive(Debug)]
pub struct Stream {
    events: Receiver<Event>,
    cancel: Arc<AtomicBool>,
}

impl Stream {
    /// Cancels the request: it ends with [`FinishReason::Cancelled`] before the next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Iterator for Stream {
    type Item = Event;

    /// The next event, waiting for it; `None` after the last.
    fn next(&mut self) -> Option<Event> {
        self.events.recv().ok()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Cancels a request submitted with [`Server::submit_with`].
#[derive(Debug, Clone)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    /// Cancels the request (see [`Stream::cancel`]).
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A queued request.
struct Queued {
    job: Job,
    sink: Sink,
    cancel: Arc<AtomicBool>,
    arrived: Instant,
}

/// The scheduler's side of a running sequence.
struct Slot {
    id: SeqId,
    sink: Sink,
    cancel: Arc<AtomicBool>,
    arrived: Instant,
    first_token: Option<f64>,
    text: TextOut,
    stop_tokens: Vec<u32>,
    prompt_tokens: usize,
    /// A stop string ended the text.
    stopped: bool,
    /// The sequence's counts already added to the metrics.
    counted: Counted,
}

/// A serving scheduler; see the [module docs](self). Dropping it lets the requests already
/// submitted finish (drop or cancel their streams to end them sooner), then stops the thread.
pub struct Server {
    submit: Option<Sender<Queued>>,
    queued: Arc<AtomicUsize>,
    max_queued: usize,
    metrics: Arc<Mutex<Metrics>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Starts the scheduler thread. `models` makes a target and a draft for a new slot (for
    /// `Llama`, instances over shared weights, so that one pass serves the whole batch); the
    /// models of finished sequences are reused. `tokenizer` turns tokens into text (without
    /// one, deltas carry tokens only, and a job with stop strings fails).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for zero limits (`max_running`, `max_queued`, a prefill
    /// chunk) or a policy out of range.
    pub fn start<T, D, F>(config: ServeConfig, tokenizer: Option<Tokenizer>, models: F) -> Result<Self>
    where
        T: TargetModel + Send + 'static,
        D: DraftModel + Send + 'static,
        F: FnMut() -> Result<(T, D)> + Send + 'static,
    {
        if config.max_running == 0 {
            return Err(Error::setting("max_running", 0, "at least 1"));
        }
        if config.max_queued == 0 {
            return Err(Error::setting("max_queued", 0, "at least 1"));
        }
        let mut batch = BatchDecoder::new(config.policy)?;
        if let Some(tokens) = config.prefill_chunk {
            batch = batch.with_prefill_chunk(tokens)?;
        }
        if config.prefix_cache_bytes > 0 {
            batch = batch.with_prefix_cache(PrefixCache::new(config.prefix_cache_bytes));
        }
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let prefix = batch.prefix_cache().map(PrefixCache::stats).unwrap_or_default();
        let metrics = Arc::new(Mutex::new(Metrics { prefix, ..Metrics::default() }));
        let mut scheduler = Scheduler {
            batch,
            models: Box::new(models),
            pool: Vec::new(),
            tokenizer,
            queue: VecDeque::new(),
            slots: Vec::new(),
            max_running: config.max_running,
            queued: queued.clone(),
            metrics: metrics.clone(),
        };
        let thread = std::thread::Builder::new().name("specdec-serve".into()).spawn(move || scheduler.run(rx))?;
        Ok(Self { submit: Some(tx), queued, max_queued: config.max_queued, metrics, thread: Some(thread) })
    }

    /// Submits a request; its events come on the returned stream.
    ///
    /// # Errors
    /// [`Error::Busy`] when [`ServeConfig::max_queued`] requests already wait.
    pub fn submit(&self, job: Job) -> Result<Stream> {
        let (tx, rx) = mpsc::channel();
        let sink: Sink =
            Box::new(move |e| if tx.send(e).is_ok() { ControlFlow::Continue(()) } else { ControlFlow::Break(()) });
        let cancel = self.submit_with(job, sink)?;
        Ok(Stream { events: rx, cancel: cancel.0 })
    }

    /// Submits a request whose events go to `sink` (called on the scheduler thread: it must
    /// not block; an async server sends them into its own channel). A sink that panics ends
    /// its own request, as one returning `Break` does; the other requests go on.
    ///
    /// # Errors
    /// As [`submit`](Self::submit).
    pub fn submit_with(&self, job: Job, sink: Sink) -> Result<CancelHandle> {
        let taken =
            self.queued.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.max_queued).then_some(n + 1));
        if taken.is_err() {
            self.lock().rejected += 1;
            return Err(Error::Busy { queued: self.max_queued });
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let queued = Queued { job, sink, cancel: cancel.clone(), arrived: Instant::now() };
        let sent = self.submit.as_ref().map(|s| s.send(queued).is_ok()).unwrap_or(false);
        if !sent {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::NotReady("the serving thread has stopped"));
        }
        self.lock().requests += 1;
        Ok(CancelHandle(cancel))
    }

    /// A snapshot of the counters and gauges.
    pub fn metrics(&self) -> Metrics {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Metrics> {
        self.metrics.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.submit.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("queued", &self.queued.load(Ordering::Relaxed)).finish()
    }
}

/// The scheduler thread's state.
struct Scheduler<T, D> {
    batch: BatchDecoder<T, D>,
    models: Box<dyn FnMut() -> Result<(T, D)> + Send>,
    /// Models of finished sequences, for the next ones.
    pool: Vec<(T, D)>,
    tokenizer: Option<Tokenizer>,
    queue: VecDeque<Queued>,
    slots: Vec<Slot>,
    max_running: usize,
    queued: Arc<AtomicUsize>,
    metrics: Arc<Mutex<Metrics>>,
}

impl<T: TargetModel, D: DraftModel> Scheduler<T, D> {
    fn run(&mut self, rx: Receiver<Queued>) {
        if let KPolicy::Adaptive { .. } = self.batch.policy() {
            self.warm_up();
        }
        loop {
            // Wait only when there is nothing to do.
            if self.slots.is_empty() && self.queue.is_empty() {
                match rx.recv() {
                    Ok(q) => self.queue.push_back(q),
                    Err(_) => return,
                }
            }
            while let Ok(q) = rx.try_recv() {
                self.queue.push_back(q);
            }
            self.end_cancelled();
            self.admit();
            if !self.slots.is_empty() {
                self.step();
            }
            self.gauges();
        }
    }

    /// Ends cancelled sequences, and drops cancelled requests from the queue.
    fn end_cancelled(&mut self) {
        let (cancelled, kept): (Vec<Queued>, Vec<Queued>) =
            self.queue.drain(..).partition(|q| q.cancel.load(Ordering::Relaxed));
        self.queue = kept.into();
        self.queued.fetch_sub(cancelled.len(), Ordering::SeqCst);
        for mut q in cancelled {
            self.lock().finished.cancelled += 1;
            let outcome = Outcome {
                finish: FinishReason::Cancelled,
                prompt_tokens: q.job.request.prompt.len(),
                completion_tokens: 0,
                first_token_secs: 0.0,
                stats: Stats::default(),
            };
            let _ = send(&mut q.sink, Event::Done(outcome));
        }
        let cancelled: Vec<SeqId> =
            self.slots.iter().filter(|s| s.cancel.load(Ordering::Relaxed)).map(|s| s.id).collect();
        for id in cancelled {
            if let Ok(f) = self.batch.cancel(id) {
                self.finish(f);
            }
        }
    }

    /// Measures a first estimate of the costs on a new slot's models (which then join the
    /// pool); a failure leaves the batch to learn them from its first steps.
    fn warm_up(&mut self) {
        let warmed = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
            let (mut target, mut draft) = (self.models)()?;
            let costs = CostModel::warm(&mut target, &mut draft)?;
            self.batch.learn_costs(costs);
            self.pool.push((target, draft));
            Ok(())
        }));
        drop(flatten(warmed));
    }

    /// Starts queued requests while slots are free.
    fn admit(&mut self) {
        self.admit_queued();
        // The running and queued gauges move here too (an idle check reads them).
        self.gauges();
    }

    fn admit_queued(&mut self) {
        while self.slots.len() < self.max_running {
            let Some(mut q) = self.queue.pop_front() else { return };
            self.queued.fetch_sub(1, Ordering::SeqCst);
            if self.tokenizer.is_none() && !q.job.stop_strings.is_empty() {
                self.lock().finished.failed += 1;
                let _ = send(
                    &mut q.sink,
                    Event::Failed(Error::setting("stop strings", "given", "a server with a tokenizer")),
                );
                continue;
            }
            let prompt_tokens = q.job.request.prompt.len();
            let stop_tokens = q.job.request.stop.stop_tokens.clone();
            let added = catch_unwind(AssertUnwindSafe(|| {
                let (target, draft) = match self.pool.pop() {
                    Some(m) => m,
                    None => (self.models)()?,
                };
                self.batch.add(Pair { target, draft }, q.job.request.clone())
            }));
            match flatten(added) {
                Ok(id) => {
                    self.lock().prompt_tokens += prompt_tokens as u64;
                    self.slots.push(Slot {
                        id,
                        sink: q.sink,
                        cancel: q.cancel,
                        arrived: q.arrived,
                        first_token: None,
                        text: TextOut::new(std::mem::take(&mut q.job.stop_strings)),
                        stop_tokens,
                        prompt_tokens,
                        stopped: false,
                        counted: Counted::default(),
                    });
                }
                Err(e) => {
                    self.lock().finished.failed += 1;
                    let _ = send(&mut q.sink, Event::Failed(e));
                }
            }
        }
    }

    /// One batch step; after a failure, one step for each sequence alone.
    fn step(&mut self) {
        let start = Instant::now();
        let stepped = catch_unwind(AssertUnwindSafe(|| self.batch.step()));
        match flatten(stepped) {
            Ok(new) => {
                let secs = start.elapsed().as_secs_f64();
                for (id, tokens) in new {
                    self.deliver(id, &tokens, secs);
                }
            }
            Err(_) => {
                let ids: Vec<SeqId> = self.slots.iter().map(|s| s.id).collect();
                for id in ids {
                    let start = Instant::now();
                    match flatten(catch_unwind(AssertUnwindSafe(|| self.batch.step_alone(id)))) {
                        Ok(tokens) => self.deliver(id, &tokens, start.elapsed().as_secs_f64()),
                        Err(e) => self.fail(id, e),
                    }
                }
            }
        }
        self.count_step();
        for f in self.batch.take_finished() {
            self.finish(f);
        }
    }

    /// Hands a sequence's new tokens out; a stop string or a listener gone ends it.
    fn deliver(&mut self, id: SeqId, tokens: &[u32], step_secs: f64) {
        let Some(i) = self.slots.iter().position(|s| s.id == id) else { return };
        if tokens.is_empty() {
            return;
        }
        let slot = &mut self.slots[i];
        let now = slot.arrived.elapsed().as_secs_f64();
        let first = slot.first_token.is_none();
        slot.first_token.get_or_insert(now);
        let shown: Vec<u32> = tokens.iter().copied().filter(|t| !slot.stop_tokens.contains(t)).collect();
        let pushed = match &self.tokenizer {
            Some(tok) => slot.text.push(tok, &shown),
            None => Ok((String::new(), false)),
        };
        let (text, stopped) = match pushed {
            Ok(r) => r,
            Err(e) => return self.fail(id, e),
        };
        slot.stopped |= stopped;
        let logprobs = self
            .batch
            .logprobs(id)
            .map_or(Vec::new(), |all| all.get(all.len().saturating_sub(tokens.len())..).unwrap_or_default().to_vec());
        let flow = send(&mut slot.sink, Event::Delta { tokens: tokens.to_vec(), text, logprobs });
        {
            let mut m = self.lock();
            if first {
                m.time_to_first_token.observe(now, 1);
            }
            m.token_latency.observe(step_secs / tokens.len() as f64, tokens.len() as u64);
        }
        if stopped || flow.is_break() {
            if let Ok(f) = self.batch.cancel(id) {
                self.finish(f);
            }
        }
    }

    /// Ends a failed sequence: its models are dropped, and nothing of it enters the prefix
    /// cache (they may hold a broken state).
    fn fail(&mut self, id: SeqId, e: Error) {
        drop(self.batch.discard(id));
        if let Some(i) = self.slots.iter().position(|s| s.id == id) {
            let mut slot = self.slots.remove(i);
            self.lock().finished.failed += 1;
            self.gauges(); // before the listener hears of it
            let _ = send(&mut slot.sink, Event::Failed(e));
        }
    }

    /// Sends a finished sequence's last text and outcome (`Stop` after a stop string), and
    /// keeps its models for reuse.
    fn finish(&mut self, f: Finished<T, D>) {
        let Some(i) = self.slots.iter().position(|s| s.id == f.id) else { return };
        let mut slot = self.slots.remove(i);
        add_counts(&mut self.lock(), &mut slot.counted, &f.generation.stats);
        self.lock().prefill_tokens += f.generation.stats.prefill_tokens as u64;
        let rest = slot.text.finish();
        if !rest.is_empty() {
            let _ = send(&mut slot.sink, Event::Delta { tokens: Vec::new(), text: rest, logprobs: Vec::new() });
        }
        let finish = if slot.stopped { FinishReason::Stop } else { f.generation.finish };
        let outcome = Outcome {
            finish,
            prompt_tokens: slot.prompt_tokens,
            completion_tokens: f.generation.tokens.len(),
            first_token_secs: slot.first_token.unwrap_or(0.0),
            stats: f.generation.stats,
        };
        {
            let mut m = self.lock();
            let f = &mut m.finished;
            *match finish {
                FinishReason::Stop => &mut f.stop,
                FinishReason::Length => &mut f.length,
                FinishReason::Cancelled => &mut f.cancelled,
            } += 1;
            m.completion_tokens += outcome.completion_tokens as u64;
        }
        self.gauges(); // before the listener hears of it: a client that saw its end sees it counted
        let _ = send(&mut slot.sink, Event::Done(outcome));
        if self.pool.len() < self.max_running {
            self.pool.push((f.target, f.draft));
        }
    }

    /// Adds the running sequences' new drafts to the metrics and counts the step as one with
    /// speculation or without.
    fn count_step(&mut self) {
        let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
        let mut drafted = 0;
        for slot in &mut self.slots {
            if let Some(stats) = self.batch.stats(slot.id) {
                drafted += add_counts(&mut m, &mut slot.counted, stats);
            }
        }
        *if drafted > 0 { &mut m.steps.drafting } else { &mut m.steps.plain } += 1;
        m.prefix = self.batch.prefix_cache().map(PrefixCache::stats).unwrap_or_default();
    }

    fn gauges(&self) {
        let mut m = self.lock();
        m.running = self.slots.len();
        m.queued = self.queue.len();
        m.prefix = self.batch.prefix_cache().map(PrefixCache::stats).unwrap_or_default();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Metrics> {
        self.metrics.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T, D> Drop for Scheduler<T, D> {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            let _ = send(&mut slot.sink, Event::Failed(Error::NotReady("the server stopped")));
        }
        for q in &mut self.queue {
            let _ = send(&mut q.sink, Event::Failed(Error::NotReady("the server stopped")));
        }
    }
}

/// A sequence's drafts, acceptances and target calls already added to the metrics.
#[derive(Debug, Default)]
struct Counted {
    drafted: usize,
    accepted: usize,
    target_calls: usize,
}

/// Adds a sequence's drafts, acceptances and target calls since `counted` to the metrics;
/// returns the new drafts.
fn add_counts(m: &mut Metrics, counted: &mut Counted, stats: &Stats) -> usize {
    let new = |now: usize, old: usize| now.saturating_sub(old);
    let drafted = new(stats.drafted, counted.drafted);
    m.drafted += drafted as u64;
    m.accepted += new(stats.accepted, counted.accepted) as u64;
    m.target_calls += new(stats.target_calls, counted.target_calls) as u64;
    *counted = Counted { drafted: stats.drafted, accepted: stats.accepted, target_calls: stats.target_calls };
    drafted
}

/// Hands `event` to `sink`; a sink that panics counts as one whose listener left (`Break`), so
/// that a callback can end its own request but never the scheduler thread.
fn send(sink: &mut Sink, event: Event) -> ControlFlow<()> {
    catch_unwind(AssertUnwindSafe(|| sink(event))).unwrap_or(ControlFlow::Break(()))
}

/// A result from inside `catch_unwind`, a panic turned into an error with its message.
fn flatten<R>(caught: std::thread::Result<Result<R>>) -> Result<R> {
    caught.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Err(Error::Panicked(message))
    })
}
