//! A team of threads that share out one job at a time: the items of the job are cut into chunks
//! that threads claim from a counter, the calling thread included. A transformer forward pass is
//! a few hundred short parallel steps per token, so starting one must cost far less than a
//! general pool's microseconds: idle workers spin briefly before sleeping.
//!
//! Claiming (rather than a fixed split) keeps the team fast on a busy machine: when a worker is
//! descheduled, the caller takes its chunks instead of waiting for it.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
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
    stop: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Claims and runs chunks until none are left.
    fn work(&self, job: &(dyn Fn(Range<usize>) + Sync + '_)) {
        let (items, grain) = (self.items.load(SeqCst), self.grain.load(SeqCst));
        let chunks = items.div_ceil(grain);
        loop {
            let c = self.next.fetch_add(1, SeqCst);
            if c >= chunks {
                return;
            }
            job(c * grain..((c + 1) * grain).min(items));
            self.done.fetch_add(1, SeqCst);
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
            stop: std::sync::atomic::AtomicBool::new(false),
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

    /// Runs `job` over `0..items`, cut into chunks of `grain` items that the team's threads
    /// claim, and returns when every chunk is done. A panic inside the job aborts the process
    /// (other threads may hold parts of it); jobs here are arithmetic on slices checked before.
    pub fn run(&self, items: usize, grain: usize, job: &(dyn Fn(Range<usize>) + Sync)) {
        let grain = grain.max(1);
        if self.threads == 1 || items <= grain {
            job(0..items);
            return;
        }
        let _turn = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: (lifetime erasure) the job is closed and every worker has left it before this
        // function returns, so the pointer never outlives `job`.
        let erased: *const Job = unsafe { std::mem::transmute::<&(dyn Fn(Range<usize>) + Sync), &'static Job>(job) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(erased));
        s.items.store(items, SeqCst);
        s.grain.store(grain, SeqCst);
        s.next.store(0, SeqCst);
        s.done.store(0, SeqCst);
        let epoch = s.epoch.load(SeqCst) + 1;
        s.open.store(epoch, SeqCst);
        s.epoch.store(epoch, SeqCst);
        for (t, _) in &self.workers {
            t.unpark();
        }
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.work(job))).is_err() {
            eprintln!("specdec: a parallel job panicked; aborting");
            std::process::abort();
        }
        let chunks = items.div_ceil(grain);
        wait_until(|| s.done.load(SeqCst) == chunks, false);
        s.open.store(CLOSED, SeqCst);
        wait_until(|| s.active.load(SeqCst) == 0, false);
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
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.work(job))).is_err() {
                    eprintln!("specdec: a parallel job panicked; aborting");
                    std::process::abort();
                }
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
