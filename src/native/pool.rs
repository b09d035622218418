//! A team of threads that runs one job on every thread at once, with a cheap barrier between
//! phases: the shape of a transformer forward pass, where each layer is a few short parallel
//! steps. A general pool (rayon) costs microseconds per parallel call; here a job start and a
//! barrier cost a few hundred nanoseconds, because idle threads spin briefly before sleeping.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

/// Spins before a waiting thread starts yielding, then sleeping.
const SPINS: u32 = 20_000;
const YIELDS: u32 = 200;

/// What each thread of a running job sees.
pub struct Ctx<'a> {
    /// This thread's index, 0 for the caller.
    pub id: usize,
    /// Threads in the team.
    pub threads: usize,
    barrier: &'a SpinBarrier,
}

impl Ctx<'_> {
    /// Waits until every thread of the team reaches this point.
    pub fn barrier(&self) {
        self.barrier.wait(self.threads);
    }

    /// This thread's share of `n` items, in `grain`-sized chunks: a contiguous range.
    pub fn share(&self, n: usize, grain: usize) -> std::ops::Range<usize> {
        let chunks = n.div_ceil(grain.max(1));
        let per = chunks.div_ceil(self.threads);
        let start = (self.id * per * grain).min(n);
        let end = ((self.id + 1) * per * grain).min(n);
        start..end
    }
}

/// A sense-reversing spin barrier.
struct SpinBarrier {
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    fn wait(&self, threads: usize) {
        let gen = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
        } else {
            wait_until(|| self.generation.load(Ordering::Acquire) != gen, false);
        }
    }
}

/// Spins, then yields, then (if `nap`) sleeps in short naps until `ready()`. Idle workers nap
/// (a new job unparks them); a thread waiting on others inside a job only spins and yields, as
/// the wait is no longer than the job and nobody would wake it early.
fn wait_until(ready: impl Fn() -> bool, nap: bool) {
    let mut n = 0u32;
    while !ready() {
        if n < SPINS {
            std::hint::spin_loop();
        } else if n < SPINS + YIELDS || !nap {
            thread::yield_now();
        } else {
            thread::park_timeout(Duration::from_micros(200));
        }
        n = n.saturating_add(1);
    }
}

type Job = dyn Fn(&Ctx) + Sync;

/// The running job with its lifetime erased; valid while `Shared::pending > 0`.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);

// SAFETY: the pointee is `Sync`, and `Team::run` keeps it alive until every worker is done.
unsafe impl Send for JobPtr {}

struct Shared {
    /// Incremented to start a job; workers compare it with the last one they ran.
    epoch: AtomicUsize,
    job: Mutex<Option<JobPtr>>,
    pending: AtomicUsize,
    stop: AtomicBool,
    barrier: SpinBarrier,
    threads: usize,
}

/// A team of `threads` threads (the caller plus `threads - 1` workers).
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<(Thread, JoinHandle<()>)>,
    /// One job at a time: concurrent callers take turns.
    lock: Mutex<()>,
}

impl Team {
    /// A team of `threads` threads (at least 1).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: Mutex::new(None),
            pending: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            barrier: SpinBarrier { arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0) },
            threads,
        });
        let workers = (1..threads)
            .filter_map(|id| {
                let shared = Arc::clone(&shared);
                let handle = thread::Builder::new().name(format!("specdec-{id}")).spawn(move || worker(&shared, id)).ok()?;
                Some((handle.thread().clone(), handle))
            })
            .collect::<Vec<_>>();
        // If a worker could not be spawned, run with the threads we have.
        let spawned = workers.len() + 1;
        if spawned != threads {
            return Self::new(spawned);
        }
        Self { shared, workers, lock: Mutex::new(()) }
    }

    /// Threads in the team.
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Runs `job` on every thread of the team and returns when all are done. A panic in the job
    /// on a worker aborts the process (as it would leave the team inconsistent); jobs here are
    /// arithmetic on slices checked beforehand.
    pub fn run(&self, job: &(dyn Fn(&Ctx) + Sync)) {
        let _turn = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &self.shared;
        if s.threads == 1 {
            job(&Ctx { id: 0, threads: 1, barrier: &s.barrier });
            return;
        }
        // SAFETY (lifetime erasure): this function does not return before every worker is done
        // with the job, so the pointer never outlives it.
        let erased: *const Job = unsafe { std::mem::transmute::<&(dyn Fn(&Ctx) + Sync), &'static Job>(job) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(erased));
        s.pending.store(s.threads - 1, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::Release);
        for (t, _) in &self.workers {
            t.unpark();
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&Ctx { id: 0, threads: s.threads, barrier: &s.barrier })));
        if ran.is_err() {
            // The workers may be waiting at a barrier this thread will never reach.
            eprintln!("specdec: a parallel job panicked; aborting");
            std::process::abort();
        }
        wait_until(|| s.pending.load(Ordering::Acquire) == 0, false);
    }
}

fn worker(s: &Shared, id: usize) {
    let mut seen = 0;
    loop {
        wait_until(|| s.epoch.load(Ordering::Acquire) != seen || s.stop.load(Ordering::Relaxed), true);
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        seen = s.epoch.load(Ordering::Acquire);
        let Some(JobPtr(ptr)) = *s.job.lock().unwrap_or_else(|e| e.into_inner()) else { continue };
        // SAFETY: see `Team::run`; the pointer was published before the epoch moved.
        let job: &Job = unsafe { &*ptr };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&Ctx { id, threads: s.threads, barrier: &s.barrier })));
        if ran.is_err() {
            eprintln!("specdec: a parallel job panicked; aborting");
            std::process::abort();
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
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
    fn every_thread_runs_its_share_and_barriers_order_phases() {
        let team = Team::new(3);
        let sum = AtomicU64::new(0);
        let phase_two = AtomicU64::new(0);
        for _ in 0..200 {
            sum.store(0, Ordering::Relaxed);
            team.run(&|ctx| {
                let r = ctx.share(1000, 7);
                sum.fetch_add(r.map(|i| i as u64).sum(), Ordering::Relaxed);
                ctx.barrier();
                // Every thread sees the whole sum after the barrier.
                assert_eq!(sum.load(Ordering::Relaxed), 999 * 1000 / 2);
                ctx.barrier();
                phase_two.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(phase_two.load(Ordering::Relaxed), 600);
    }

    #[test]
    fn shares_cover_the_range_once() {
        let barrier = SpinBarrier { arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0) };
        for threads in 1..5 {
            for n in [0, 1, 5, 63, 64, 1000] {
                let mut covered = vec![0; n];
                for id in 0..threads {
                    for i in (Ctx { id, threads, barrier: &barrier }).share(n, 4) {
                        covered[i] += 1;
                    }
                }
                assert!(covered.iter().all(|&c| c == 1), "threads {threads}, n {n}");
            }
        }
    }
}
