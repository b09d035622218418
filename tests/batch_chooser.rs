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
/// batch sizes 1 to 16 in `world`, after checking that each of those wins somewhere (where
/// `all_win`).
fn worst_ratio(world: &World, all_win: bool) -> Result<f64> {
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
    if all_win {
        for policy in fixed {
            assert!(winners.contains(&policy), "{what}: {policy} never wins: {winners:?}");
        }
    }
    eprintln!("{what}: winners {winners:?}, adaptive at worst {worst:.3}x the best");
    Ok(worst)
}

fn world(noise: f32, knee: f64, draft_secs: f64, temperature: f32) -> World {
    seeded_world(noise, knee, draft_secs, temperature, 0)
}

/// As [`world`], its models drawn from seeds `seed` further on.
fn seeded_world(noise: f32, knee: f64, draft_secs: f64, temperature: f32, seed: u64) -> World {
    let target = MarkovModel::random(8, 1, 5 + seed);
    let draft = target.noisy_copy(noise, 6 + seed);
    World { target, draft, noise, knee, draft_secs, temperature }
}

#[test]
fn the_adaptive_k_is_within_3_percent_of_the_best_policy_at_every_batch_size() -> Result<()> {
    // Sampled at temperature 1: fixed k = 4 wins at one sequence, k = 2 from two to five, plain
    // steps from six on. Greedy with a draft it nearly always accepts: k = 4 at one and two
    // sequences, k = 2 to seven, plain steps from eight on.
    for w in [world(0.25, 8.0, 1e-3, 1.0), world(0.05, 8.0, 1e-3, 0.0)] {
        let worst = worst_ratio(&w, true)?;
        assert!(worst >= 0.97, "adaptive at {worst:.3}x the best policy");
    }
    Ok(())
}

/// Sampled at 0.8 with a draft accepted about 3 times in 4, one sequence: fixed k = 4 wins
/// there, k = 2 at 2 and 3 sequences, plain steps from 4 on. (Once a known shortfall at 0.965,
/// where the chooser's k stayed below 4; 0.990 on the code of 2026-12-07's last stop, which
/// change moved it not traced: docs/perf/batch.md.)
#[test]
fn the_adaptive_k_at_temperature_0_8_with_a_draft_right_3_times_in_4() -> Result<()> {
    let worst = worst_ratio(&world(0.2, 6.0, 2e-3, 0.8), true)?;
    assert!(worst >= 0.97, "adaptive at {worst:.3}x the best policy");
    Ok(())
}

/// A world where the adaptive policy still falls short (docs/perf/batch.md): greedy, the
/// models drawn from the next seed. A greedy walk on these 8-token models ends in a cycle,
/// here 4, 5, 0, and after 0 the draft proposes 7 where the target takes 4; how many drafts a
/// round keeps then depends on the block length itself, by where blocks fall in the cycle:
/// k = 2 keeps 98 % of its drafts (each block starts at the same place), k = 4 67 %, k = 1
/// 50 %. No estimate of a rate per drafted position can see that (the chooser, drafting k = 1, learns 0.5 and never
/// tries 2): from 3 to 6 sequences it runs k = 1 or plain steps where k = 2 wins by 19–31 %
/// (0.62–0.84x), and at one sequence k = 4 where k = 2 yields as many tokens (0.86x). Tokens
/// per round learned per block length would; real text rarely loops so exactly.
#[test]
#[ignore = "a known shortfall of the adaptive k, kept to measure it: see the doc comment"]
fn the_adaptive_k_on_a_greedy_cycle() -> Result<()> {
    let worst = worst_ratio(&seeded_world(0.05, 8.0, 1e-3, 0.0, 1), false)?;
    assert!(worst >= 0.97, "adaptive at {worst:.3}x the best policy");
    Ok(())
}

/// Beyond the two tables above: sampled worlds whose models are drawn from 8 more seeds, at
/// temperature 1 (draft noise 0.25) and 0.8 (noise 0.2), whichever policies win there. (Greedy
/// worlds are not drawn: a greedy walk on these models ends in a short cycle, see the ignored
/// test above, and 3 of 8 seeds give cycles the policy cannot yet read.) Before the round that
/// times the draft stopped teaching the batch's pooled acceptance, one world at temperature 1
/// gave 0.934 (a batch of 7 drafting where plain steps win).
#[test]
fn the_adaptive_k_is_within_3_percent_on_sampled_worlds_of_8_more_seeds() -> Result<()> {
    let mut worst = (f64::INFINITY, 0, 0.0);
    for seed in 1..=8 {
        for (noise, knee, draft_secs, temperature) in [(0.25, 8.0, 1e-3, 1.0), (0.2, 6.0, 2e-3, 0.8)] {
            let w = worst_ratio(&seeded_world(noise, knee, draft_secs, temperature, seed), false)?;
            if w < worst.0 {
                worst = (w, seed, temperature);
            }
        }
    }
    let (w, seed, t) = worst;
    assert!(w >= 0.97, "adaptive at {w:.3}x the best policy (seed {seed}, temperature {t})");
    Ok(())
}
