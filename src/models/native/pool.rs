//! A team of threads that share out one job at a time: the items of the job are cut into chunks
//! that threads claim from a counter, the calling thread included. A transformer forward pass is
//! a few hundred short parallel steps per token, so starting one must cost far less than a
//! general pool's microseconds: idle workers spin briefly before sleeping.
//!
//! Claiming (rather than a fixed split) keeps the team fast on a busy machine: when a worker is
//! descheduled, the caller takes its chunks instead of waiting for it.
//!
//! A panic inside a job never takes the process down: the chunks not yet claimed are skipped,
//! and once every worker has left the job the first panic resumes on the calling thread.

use std::any::Any;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

/// Spins before a waiting thread starts yielding (and an idle worker, sleeping).
const SPINS: u32 = 20_000;
const YIELDS: u32 = 100;
/// `Shared::open` when no job is open.
const CLOSED: usize = usize::MAX;

type Job = dyn Fn(Range<usize>) + Sync;

/// The running job with its lifetime erased; valid while the job is open or a worker is in it.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);

// SAFETY: the pointee is `Sync`, and `Team::run` keeps it alive until no worker can touch it.
unsafe impl Send for JobPtr {}

struct Shared {
    /// Incremented to publish a job.
    epoch: AtomicUsize,
    /// The epoch of the open job, or `CLOSED`.
    open: AtomicUsize,
    job: Mutex<Option<JobPtr>>,
    items: AtomicUsize,
    grain: AtomicUsize,
    /// The next chunk to claim, and the chunks finished.
    next: AtomicUsize,
    done: AtomicUsize,
    /// Workers inside the open job.
    active: AtomicUsize,
    stop: AtomicBool,
    /// Set when a chunk of the open job panicked; `payload` holds the first panic's payload.
    panicked: AtomicBool,
    payload: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Shared {
    /// Claims and runs chunks until none are left. A panic in a chunk is caught here, once per
    /// job and thread (not per chunk), and recorded for `Team::run` to resume.
    fn work(&self, job: &(dyn Fn(Range<usize>) + Sync + '_)) {
        let (items, grain) = (self.items.load(SeqCst), self.grain.load(SeqCst));
        let chunks = items.div_ceil(grain);
        let claim = || loop {
            let c = self.next.fetch_add(1, SeqCst);
            if c >= chunks {
                return;
            }
            #[cfg(feature = "fault-injection")]
            injected_fault();
            job(c * grain..((c + 1) * grain).min(items));
            self.done.fetch_add(1, SeqCst);
        };
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(claim)) {
            // No chunk is claimed after this (claims past `chunks` return at once), so the
            // other threads leave the job after the chunk they are in.
            self.next.fetch_max(chunks, SeqCst);
            let mut first = self.payload.lock().unwrap_or_else(|e| e.into_inner());
            match *first {
                None => *first = Some(payload),
                // A later panic's payload is dropped; its drop may panic in turn, which must not
                // unwind out of a worker.
                Some(_) => drop(panic::catch_unwind(AssertUnwindSafe(move || drop(payload)))),
            }
            self.panicked.store(true, SeqCst);
        }
    }
}

/// A team of threads: the caller plus `threads - 1` workers.
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<(Thread, JoinHandle<()>)>,
    threads: usize,
    /// One job at a time: concurrent callers take turns.
    lock: Mutex<()>,
}

impl Team {
    /// A team of `threads` threads (at least 1; fewer if workers cannot be spawned).
    pub fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            open: AtomicUsize::new(CLOSED),
            job: Mutex::new(None),
            items: AtomicUsize::new(0),
            grain: AtomicUsize::new(1),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            payload: Mutex::new(None),
        });
        let workers: Vec<_> = (1..threads.max(1))
            .filter_map(|id| {
                let s = Arc::clone(&shared);
                let handle = thread::Builder::new().name(format!("specdec-{id}")).spawn(move || worker(&s)).ok()?;
                Some((handle.thread().clone(), handle))
            })
            .collect();
        Self { threads: workers.len() + 1, shared, workers, lock: Mutex::new(()) }
    }

    /// The threads of the team, the caller's included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `job` over `0..items`, cut into chunks of `grain` items that the team's threads
    /// claim, and returns when every chunk is done.
    ///
    /// # Panics
    /// If a chunk panics (on any thread of the team), the chunks not yet claimed are skipped,
    /// and once every thread has left the job the first panic resumes on the calling thread
    /// (`std::panic::resume_unwind`). The team stays usable for the next job.
    pub fn run(&self, items: usize, grain: usize, job: &(dyn Fn(Range<usize>) + Sync)) {
        let grain = grain.max(1);
        if self.threads == 1 || items <= grain {
            #[cfg(feature = "fault-injection")]
            injected_fault();
            job(0..items);
            return;
        }
        let turn = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: (lifetime erasure) the job is closed and every worker has left it before this
        // function returns, so the pointer never outlives `job`.
        let erased: *const Job = unsafe { std::mem::transmute::<&(dyn Fn(Range<usize>) + Sync), &'static Job>(job) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(erased));
        s.items.store(items, SeqCst);
        s.grain.store(grain, SeqCst);
        s.next.store(0, SeqCst);
        s.done.store(0, SeqCst);
        s.panicked.store(false, SeqCst);
        let epoch = s.epoch.load(SeqCst) + 1;
        s.open.store(epoch, SeqCst);
        s.epoch.store(epoch, SeqCst);
        for (t, _) in &self.workers {
            t.unpark();
        }
        s.work(job);
        // A panicked chunk is never done: the flag ends the wait instead.
        let chunks = items.div_ceil(grain);
        wait_until(|| s.done.load(SeqCst) == chunks || s.panicked.load(SeqCst), false);
        s.open.store(CLOSED, SeqCst);
        wait_until(|| s.active.load(SeqCst) == 0, false);
        if s.panicked.load(SeqCst) {
            let payload = s.payload.lock().unwrap_or_else(|e| e.into_inner()).take();
            // Released first, so that the unwinding does not poison the turn.
            drop(turn);
            panic::resume_unwind(payload.unwrap_or_else(|| Box::new("a team job panicked")));
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0;
    loop {
        wait_until(|| s.epoch.load(SeqCst) != seen || s.stop.load(SeqCst), true);
        if s.stop.load(SeqCst) {
            return;
        }
        seen = s.epoch.load(SeqCst);
        // Enter, then check the job is still open: with sequentially consistent operations
        // either `run` sees this worker active and waits for it, or the worker sees it closed.
        s.active.fetch_add(1, SeqCst);
        if s.open.load(SeqCst) == seen {
            let ptr = *s.job.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(JobPtr(ptr)) = ptr {
                // SAFETY: the job is open, so `run` has not returned (see `Team::run`).
                let job: &Job = unsafe { &*ptr };
                s.work(job);
            }
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

/// Spins, then yields, then (if `nap`) sleeps in short naps until `ready()`. Idle workers nap
/// (a new job unparks them); a thread waiting inside a job only spins and yields, as the wait
/// is no longer than a chunk and nobody would wake it early.
fn wait_until(ready: impl Fn() -> bool, nap: bool) {
    let mut n = 0u32;
    while !ready() {
        if n < SPINS {
            std::hint::spin_loop();
        } else if n < SPINS + YIELDS || !nap {
            thread::yield_now();
        } else {
            thread::park_timeout(Duration::from_micros(500));
        }
        n = n.saturating_add(1);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        for (t, handle) in self.workers.drain(..) {
            t.unpark();
            let _ = handle.join();
        }
    }
}

/// Armed by [`panic_after_chunks`]: 0 when disarmed, else one more than the chunks to run
/// before the one that panics.
#[cfg(feature = "fault-injection")]
static FAULT: AtomicUsize = AtomicUsize::new(0);

/// Test-only (feature `fault-injection`): after `Some(n)`, the team's next `n` chunks (a job
/// run on the calling thread alone counts as one) run as usual and the one after them panics,
/// on whichever thread claims it, once; `None` disarms. Lets tests show that a panic in a
/// forward pass reaches the caller and leaves the engine usable.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub fn panic_after_chunks(n: Option<usize>) {
    FAULT.store(n.map_or(0, |n| n.saturating_add(1)), SeqCst);
}

/// Panics in the chunk [`panic_after_chunks`] chose.
#[cfg(feature = "fault-injection")]
fn injected_fault() {
    if FAULT.load(SeqCst) > 0 && FAULT.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)) == Ok(1) {
        panic!("specdec: injected fault in a team job");
    }
}

/// The process-wide team: `SPECDEC_THREADS` threads, or one per available core.
pub fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let n = std::env::var("SPECDEC_THREADS").ok().and_then(|s| s.parse().ok());
        Team::new(n.unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get())))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_item_is_run_exactly_once() {
        for threads in [1, 2, 3] {
            let team = Team::new(threads);
            for (items, grain) in [(0, 4), (1, 4), (5, 1), (1000, 7), (64, 64), (65, 64)] {
                let seen: Vec<AtomicU64> = (0..items).map(|_| AtomicU64::new(0)).collect();
                for _ in 0..50 {
                    team.run(items, grain, &|range| {
                        for i in range {
                            seen[i].fetch_add(1, SeqCst);
                        }
                    });
                }
                assert!(seen.iter().all(|s| s.load(SeqCst) == 50), "threads {threads}, items {items}");
            }
        }
    }

    /// Keeps the default panic hook from printing the panics these tests make on purpose.
    fn quiet() {
        static QUIET: std::sync::Once = std::sync::Once::new();
        QUIET.call_once(|| {
            let hook = panic::take_hook();
            panic::set_hook(Box::new(move |info| {
                if info.payload().downcast_ref::<&str>() != Some(&"item 37") {
                    hook(info);
                }
            }));
        });
    }

    /// Runs a job over `items` that panics in the chunk holding item 37, and returns its
    /// message as the caller caught it.
    fn panicking_job(team: &Team, items: usize, grain: usize, ran: &[AtomicU64]) -> String {
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            team.run(items, grain, &|range| {
                if range.contains(&37) {
                    panic!("item 37");
                }
                for i in range {
                    ran[i].fetch_add(1, SeqCst);
                }
            })
        }));
        let payload = caught.expect_err("the panic reaches the caller");
        payload.downcast_ref::<&str>().map_or_else(|| "?".into(), |m| m.to_string())
    }

    /// A panic in one chunk, on the caller or on a worker (whichever claims it), reaches the
    /// caller with its payload once every worker has left; no chunk runs twice; and the team
    /// then runs a correct job over every item exactly once.
    #[test]
    fn a_panic_in_a_chunk_reaches_the_caller_and_the_team_goes_on() {
        quiet();
        for threads in [1, 2, 3] {
            let team = Team::new(threads);
            for (items, grain) in [(1000, 7), (100, 1), (64, 64), (38, 1)] {
                for _ in 0..20 {
                    let ran: Vec<AtomicU64> = (0..items).map(|_| AtomicU64::new(0)).collect();
                    assert_eq!(panicking_job(&team, items, grain, &ran), "item 37", "threads {threads}");
                    assert!(ran.iter().all(|r| r.load(SeqCst) <= 1), "threads {threads}: an item ran twice");
                    team.run(items, grain, &|range| {
                        for i in range {
                            ran[i].fetch_add(10, SeqCst);
                        }
                    });
                    assert!(
                        ran.iter().all(|r| (10..=11).contains(&r.load(SeqCst))),
                        "threads {threads}, items {items}"
                    );
                }
            }
        }
    }

    /// Made to panic on the calling thread (workers wait in their first chunk until it has),
    /// or on a worker (the caller waits in its chunk until one has): either way the panic
    /// reaches the caller, and the team goes on.
    #[test]
    fn a_panic_on_the_caller_or_on_a_worker_reaches_the_caller() {
        quiet();
        for threads in [2, 3] {
            let team = Team::new(threads);
            for on_caller in [true, false] {
                for _ in 0..20 {
                    let caller = thread::current().id();
                    let thrown = AtomicBool::new(false);
                    let caught = panic::catch_unwind(AssertUnwindSafe(|| {
                        team.run(100, 1, &|_| {
                            if (thread::current().id() == caller) == on_caller {
                                thrown.store(true, SeqCst);
                                panic!("item 37");
                            }
                            wait_until(|| thrown.load(SeqCst), false);
                        })
                    }));
                    assert!(caught.is_err(), "threads {threads}, on the caller: {on_caller}");
                    let count = AtomicU64::new(0);
                    team.run(100, 1, &|r| {
                        count.fetch_add(r.len() as u64, SeqCst);
                    });
                    assert_eq!(count.load(SeqCst), 100);
                }
            }
        }
    }

    /// Once a chunk has panicked, the chunks not yet claimed are skipped.
    #[test]
    fn chunks_after_a_panic_are_skipped() {
        quiet();
        let team = Team::new(2);
        let ran = AtomicU64::new(0);
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            team.run(10_000, 1, &|range| {
                if range.start == 0 {
                    panic!("item 37");
                }
                thread::sleep(Duration::from_micros(100));
                ran.fetch_add(1, SeqCst);
            })
        }));
        assert!(caught.is_err());
        // The other thread may finish the chunk it is in (or a few, before the panic is seen),
        // never the rest: they would take a second.
        assert!(ran.load(SeqCst) < 1_000, "{} chunks ran after the panic", ran.load(SeqCst));
    }

    /// A job run from a thread other than the main one carries its panic to that thread.
    #[test]
    fn a_panic_reaches_a_caller_on_another_thread() {
        quiet();
        let team = Arc::new(Team::new(3));
        let caller = {
            let team = Arc::clone(&team);
            thread::spawn(move || {
                let ran: Vec<AtomicU64> = (0..200).map(|_| AtomicU64::new(0)).collect();
                panicking_job(&team, 200, 3, &ran)
            })
        };
        assert_eq!(caller.join().expect("the caller thread itself does not panic"), "item 37");
        let count = AtomicU64::new(0);
        team.run(200, 3, &|r| {
            count.fetch_add(r.len() as u64, SeqCst);
        });
        assert_eq!(count.load(SeqCst), 200);
    }

    #[test]
    fn concurrent_callers_take_turns() {
        let team = Arc::new(Team::new(2));
        let total = Arc::new(AtomicU64::new(0));
        let callers: Vec<_> = (0..3)
            .map(|_| {
                let (team, total) = (Arc::clone(&team), Arc::clone(&total));
                thread::spawn(move || {
                    for _ in 0..100 {
                        team.run(100, 8, &|r| {
                            total.fetch_add(r.len() as u64, SeqCst);
                        });
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().expect("caller thread");
        }
        assert_eq!(total.load(SeqCst), 3 * 100 * 100);
    }
}
