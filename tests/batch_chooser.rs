//! The batch's adaptive k against every fixed policy, on a simulated clock (no wall time is
//! read): toy models whose batched calls advance a manual [`Clock`] by the cost of a pass over
//! their rows, memory-bound (flat) up to a knee and compute-bound (linear) past it, as the real
//! kernels are. The costs are chosen so that fixed k = 4 wins at one sequence, fixed k = 2 a few
//! sequences on, and plain batched decoding from about six on; the adaptive policy must come
//! within 3 % of the best of them at every batch size from 1 to 16, starting cold (no costs
//! measured, acceptance at its prior) on 64-token sequences, as the benchmark ran.

use specdec::toy::MarkovModel;
use specdec::{BatchDecoder, Clock, KPolicy, Logits, Pair, Request, Result, SamplingConfig, TargetModel, TokenModel};

/// A toy model whose batched calls cost simulated seconds: `one` for a pass of up to `knee`
/// tokens fed, in proportion past that.
#[derive(Clone)]
struct Sim {
    model: MarkovModel,
    clock: Clock,
    one: f64,
    knee: f64,
}

impl Sim {
    fn cost(&self, tokens: usize) -> f64 {
        self.one * (tokens as f64 / self.knee).max(1.0)
    }
}

impl TokenModel for Sim {
    fn vocab_size(&self) -> usize {
        self.model.vocab()
    }

    fn context_len(&self) -> usize {
        TokenModel::context_len(&self.model)
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        TokenModel::truncate(&mut self.model, len)
    }
}

impl TargetModel for Sim {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        self.clock.advance(self.cost(tokens.len()));
        self.model.forward(tokens, rows)
    }

    /// One pass for the whole batch: its cost is that of all the tokens fed.
    fn forward_batch(models: &mut [&mut Self], calls: &[(&[u32], usize)]) -> Result<Vec<Logits>> {
        if let Some(first) = models.first() {
            first.clock.advance(first.cost(calls.iter().map(|(t, _)| t.len()).sum()));
        }
        models.iter_mut().zip(calls).map(|(m, &(tokens, rows))| m.model.forward(tokens, rows)).collect()
    }
}

/// Tokens per sequence, as the benchmark ran them.
const TOKENS: usize = 64;

/// A pair of toy models, what their calls cost and how they are sampled.
struct World {
    target: MarkovModel,
    draft: MarkovModel,
    /// How far the draft's rows are from the target's (see `MarkovModel::noisy_copy`).
    noise: f32,
    /// Rows of the target's pass from which it turns compute-bound (its one-row pass: 10 ms).
    knee: f64,
    /// Seconds of a draft call.
    draft_secs: f64,
    temperature: f32,
}

/// Tokens per simulated second of `policy` on batches of `b` sequences of `tokens` tokens
/// each, one decoder running batches one after the other until 64 sequences have run (so that
/// every batch size averages as many sampled sequences).
fn throughput(world: &World, b: usize, policy: KPolicy) -> Result<f64> {
    let clock = Clock::manual();
    let target = Sim { model: world.target.clone(), clock: clock.clone(), one: 1e-2, knee: world.knee };
    let draft = Sim { model: world.draft.clone(), clock: clock.clone(), one: world.draft_secs, knee: 64.0 };
    let mut batch = BatchDecoder::new(policy)?.with_clock(clock.clone());
    let (mut emitted, mut secs, mut seqs) = (0, 0.0, 0);
    while seqs < 64 {
        for i in seqs..seqs + b {
            let cfg = match world.temperature {
                0.0 => SamplingConfig::greedy(),
                t => SamplingConfig::new(t)?.with_seed(100 + i as u64),
            };
            let prompt = vec![(i % 5) as u32, 2, 0];
            batch.add(
                Pair { target: target.clone(), draft: draft.clone() },
                Request::new(prompt).sampling(cfg).max_new_tokens(TOKENS),
            )?;
        }
        seqs += b;
        let start = clock.seconds();
        let done = batch.run()?;
        secs += clock.seconds() - start;
        emitted += done.iter().map(|f| f.generation.tokens.len()).sum::<usize>();
        if std::env::var_os("SIM_DEBUG").is_some() {
            let s = &done[0].generation.stats;
            eprintln!(
                "  {policy} b {b}: mean k {:.2} alpha {:.3} calls {} drafted {}",
                s.mean_k(),
                s.position_acceptance(),
                s.target_calls,
                s.drafted
            );
        }
    }
    Ok(emitted as f64 / secs)
}

/// The adaptive policy's worst ratio to the best of plain, fixed k = 2 and fixed k = 4 over
/// batch sizes 1 to 16 in `world`, after checking that each of those wins somewhere.
fn worst_ratio(world: &World) -> Result<f64> {
    let what = format!(
        "draft noise {}, knee {}, draft {} s, temperature {}",
        world.noise, world.knee, world.draft_secs, world.temperature
    );
    let fixed = [KPolicy::Plain, KPolicy::Fixed(2), KPolicy::Fixed(4)];
    let (mut winners, mut worst) = (Vec::new(), f64::INFINITY);
    for b in 1..=16 {
        let mut best = (0.0, KPolicy::Plain);
        let mut row = String::new();
        for policy in fixed {
            let t = throughput(world, b, policy)?;
            row += &format!(" {policy} {t:.0}");
            if t > best.0 {
                best = (t, policy);
            }
        }
        let adaptive = throughput(world, b, KPolicy::Adaptive { max: 8 })?;
        eprintln!("{what}, batch {b:>2}:{row}; adaptive {adaptive:.0} = {:.3}x the best", adaptive / best.0);
        winners.push(best.1);
        worst = worst.min(adaptive / best.0);
    }
    for policy in fixed {
        assert!(winners.contains(&policy), "{what}: {policy} never wins: {winners:?}");
    }
    eprintln!("{what}: winners {winners:?}, adaptive at worst {worst:.3}x the best");
    Ok(worst)
}

fn world(noise: f32, knee: f64, draft_secs: f64, temperature: f32) -> World {
    let target = MarkovModel::random(8, 1, 5);
    let draft = target.noisy_copy(noise, 6);
    World { target, draft, noise, knee, draft_secs, temperature }
}

#[test]
fn the_adaptive_k_is_within_3_percent_of_the_best_policy_at_every_batch_size() -> Result<()> {
    // Sampled at temperature 1: fixed k = 4 wins at one sequence, k = 2 from two to five, plain
    // steps from six on. Greedy with a draft it nearly always accepts: k = 4 at one and two
    // sequences, k = 2 to seven, plain steps from eight on.
    for w in [world(0.25, 8.0, 1e-3, 1.0), world(0.05, 8.0, 1e-3, 0.0)] {
        let worst = worst_ratio(&w)?;
        assert!(worst >= 0.97, "adaptive at {worst:.3}x the best policy");
    }
    Ok(())
}

/// A table where the adaptive policy still falls short (see docs/perf/batch.md): one sequence
/// sampled at 0.8 with a draft accepted about 3 times in 4, where fixed k = 4 beats the k = 3
/// the geometric acceptance model prefers (0.965x): acceptance that varies from state to state
/// rewards longer blocks more than one mean rate says.
#[test]
#[ignore = "a known shortfall of the adaptive k, kept to measure it: see the doc comment"]
fn the_adaptive_k_on_a_table_it_does_not_yet_meet() -> Result<()> {
    let worst = worst_ratio(&world(0.2, 6.0, 2e-3, 0.8))?;
    assert!(worst >= 0.97, "adaptive at {worst:.3}x the best policy");
    Ok(())
}
