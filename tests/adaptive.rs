//! Choosing k each round. First the controller alone, driven by a simulated decoder with
//! synthetic costs: a target call verifying m rows costs `1 + slope·(m − 1)`, a draft call
//! costs `c`, and each drafted position is accepted with probability α until the first
//! rejection (the seed's geometric model). Speedup = tokens / total cost, so plain decoding
//! scores exactly 1. Everything there is seeded and synthetic, hence deterministic: no clock is
//! read. Then the policies through the real decoder on toy models whose calls advance a manual
//! [`Clock`] by set costs (so these too read no wall clock): greedy output unchanged, sampled
//! output exactly the target's, whatever k each round gets.

mod common;

use common::{assert_nudge_rejected, check_windows, nudged_past_the_limit, window_counts};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use specdec::toy::MarkovModel;
use specdec::TokenModel;
use specdec::{
    Clock, DraftModel, KController, KPolicy, Logits, Pair, PlainDecoder, Result, RoundReport, SamplingConfig,
    SpeculativeDecoder, TargetModel,
};

const ROUNDS: usize = 5_000;
const MAX_K: usize = 8;

/// A simulated model pair: acceptance per position, draft cost, verification slope.
#[derive(Clone, Copy, Debug)]
struct World {
    alpha: f64,
    c: f64,
    slope: f64,
}

/// What a simulated run produced: tokens, cost in one-row target calls (plain decoding costs
/// exactly 1 per token), and the k of each round.
#[derive(Debug, Default)]
struct Run {
    tokens: usize,
    cost: f64,
    ks: Vec<usize>,
}

impl Run {
    /// Cost per token relative to plain decoding.
    fn time_per_token(&self) -> f64 {
        self.cost / self.tokens as f64
    }
}

/// Drives `ctl` for up to `rounds` rounds or `max_tokens` tokens (each round's k cut, as the
/// decoder cuts it, so that none come out past the end); `alpha_at(round)` gives each round's
/// acceptance.
fn run(
    ctl: &mut KController,
    world: World,
    alpha_at: impl Fn(usize) -> f64,
    rng: &mut StdRng,
    rounds: usize,
    max_tokens: usize,
) -> Run {
    let mut out = Run::default();
    for round in 0..rounds {
        if out.tokens >= max_tokens {
            break;
        }
        let k = ctl.next_k().min(max_tokens - out.tokens - 1);
        let alpha = alpha_at(round);
        let accepted = (0..k).take_while(|_| rng.random::<f64>() < alpha).count();
        let (draft_secs, target_secs) = (k as f64 * world.c, 1.0 + world.slope * k as f64);
        ctl.observe(&RoundReport { drafted: k, accepted, draft_calls: k, draft_secs, target_rows: k + 1, target_secs });
        out.tokens += accepted + 1;
        out.cost += draft_secs + target_secs;
        out.ks.push(k);
    }
    out
}

/// One generation of `max_tokens` tokens from a new controller, so the priors' start-up counts.
fn generation(policy: KPolicy, world: World, max_tokens: usize, seed: u64) -> Result<Run> {
    let mut ctl = KController::new(policy)?;
    Ok(run(&mut ctl, world, |_| world.alpha, &mut StdRng::seed_from_u64(seed), usize::MAX, max_tokens))
}

/// Runs `ROUNDS` rounds under `policy`; `alpha_at(round)` gives the acceptance of each round.
/// Returns the realized speedup over plain decoding.
fn simulate(policy: KPolicy, world: World, alpha_at: impl Fn(usize) -> f64, seed: u64) -> Result<f64> {
    let mut ctl = KController::new(policy)?;
    let run = run(&mut ctl, world, alpha_at, &mut StdRng::seed_from_u64(seed), ROUNDS, usize::MAX);
    Ok(1.0 / run.time_per_token())
}

/// (best fixed k, its speedup, adaptive speedup, grow/shrink speedup) in `world`.
fn compare(world: World, alpha_at: impl Fn(usize) -> f64 + Copy, seed: u64) -> Result<(usize, f64, f64, f64)> {
    let mut best = (0, f64::MIN);
    for k in 1..=MAX_K {
        let s = simulate(KPolicy::Fixed(k), world, alpha_at, seed)?;
        if s > best.1 {
            best = (k, s);
        }
    }
    let adaptive = simulate(KPolicy::Adaptive { max: MAX_K }, world, alpha_at, seed)?;
    let grow_shrink = simulate(KPolicy::GrowShrink { start: 1, max: MAX_K }, world, alpha_at, seed)?;
    eprintln!(
        "α {:.1} c {:.2} slope {:.2}: best fixed k = {} → {:.3}, adaptive {:.3} ({:+.1} %), grow/shrink {:.3}, plain 1",
        world.alpha,
        world.c,
        world.slope,
        best.0,
        best.1,
        adaptive,
        100.0 * (adaptive / best.1.max(1.0) - 1.0),
        grow_shrink
    );
    Ok((best.0, best.1, adaptive, grow_shrink))
}

#[test]
fn adaptive_k_is_within_5_percent_of_the_best_fixed_k() -> Result<()> {
    for slope in [0.0, 0.1, 0.3] {
        for alpha in [0.5, 0.7, 0.9] {
            for c in [0.05, 0.15, 0.3] {
                let world = World { alpha, c, slope };
                let (_, best, adaptive, _) = compare(world, |_| alpha, 7)?;
                // Plain decoding is one of the adaptive controller's choices, so it is held to
                // the better of the two.
                assert!(adaptive >= 0.95 * best.max(1.0), "{world:?}: adaptive {adaptive:.3}, best fixed {best:.3}");
            }
        }
    }
    Ok(())
}

#[test]
fn with_a_poor_draft_adaptive_k_is_about_as_fast_as_plain_decoding() -> Result<()> {
    // The last world's draft costs as much as the target: its probes are spaced further apart.
    for (c, slope) in [(0.3, 0.0), (0.3, 0.1), (0.3, 0.3), (1.0, 0.3)] {
        let world = World { alpha: 0.1, c, slope };
        let (_, best, adaptive, _) = compare(world, |_| 0.1, 8)?;
        assert!(best < 1.0, "speculation should not pay here ({best:.3})");
        assert!(adaptive >= 0.95, "{world:?}: adaptive {adaptive:.3}");
    }
    Ok(())
}

#[test]
fn adaptive_k_follows_a_change_of_text() -> Result<()> {
    // Easy text turns hard halfway, or hard text easy: no fixed k suits both halves, and after
    // a stretch of plain decoding the probes must notice that drafting pays again.
    for (first, second) in [(0.9, 0.3), (0.1, 0.8)] {
        let world = World { alpha: first, c: 0.2, slope: 0.1 };
        let alpha_at = |round: usize| if round < ROUNDS / 2 { first } else { second };
        let (_, best, adaptive, _) = compare(world, alpha_at, 9)?;
        assert!(adaptive >= best.max(1.0), "α {first} then {second}: adaptive {adaptive:.3}, best fixed {best:.3}");
    }
    Ok(())
}

#[test]
fn with_a_draft_costing_5_target_steps_adaptive_k_is_within_3_percent_of_plain() -> Result<()> {
    // No acceptance makes such a draft pay, so every drafted round is a loss; what is left is
    // the first round (which measures the draft) and the probes before the controller stops.
    for slope in [0.0, 0.1, 0.3] {
        for alpha in [0.0, 0.5, 0.9] {
            for max_tokens in [300, 1_000, 5_000] {
                let world = World { alpha, c: 5.0, slope };
                let worst = (0..5)
                    .map(|seed| Ok(generation(KPolicy::default(), world, max_tokens, seed)?.time_per_token()))
                    .collect::<Result<Vec<f64>>>()?
                    .into_iter()
                    .fold(0.0, f64::max);
                eprintln!(
                    "{world:?}, {max_tokens} tokens: adaptive k takes {worst:.4}× plain decoding's time per token"
                );
                assert!(worst <= 1.03, "{world:?}, {max_tokens} tokens: {worst:.4}× plain");
            }
        }
    }
    Ok(())
}

#[test]
fn a_draft_too_slow_to_pay_is_probed_three_times_then_not_at_all() -> Result<()> {
    for c in [1.5, 5.0, 7.0] {
        let world = World { alpha: 0.9, c, slope: 0.1 };
        let mut ctl = KController::new(KPolicy::default())?;
        let mut rng = StdRng::seed_from_u64(11);
        let first = run(&mut ctl, world, |_| world.alpha, &mut rng, ROUNDS, usize::MAX);
        let drafted: Vec<usize> = first.ks.iter().enumerate().filter(|(_, &k)| k > 0).map(|(i, _)| i).collect();
        // The first round measures with one token; each probe after it waits about twice as
        // long as the one before (the spacing also follows the estimates).
        assert_eq!(first.ks[0], 1, "c {c}");
        assert_eq!(drafted.len(), 3, "c {c}: drafting rounds {drafted:?}");
        assert!(2 * (drafted[2] - drafted[1]) >= 3 * (drafted[1] - drafted[0]), "c {c}: {drafted:?}");
        assert!(ctl.stopped_probing());
        // The verdict is about the pair's costs, so the next generation starts plain.
        let next = run(&mut ctl, world, |_| world.alpha, &mut rng, ROUNDS, usize::MAX);
        assert!(next.ks.iter().all(|&k| k == 0), "c {c}");
        eprintln!("c {c}: drafting rounds {drafted:?}, {:.4}× plain over {ROUNDS} rounds", first.time_per_token());
    }
    Ok(())
}

#[test]
fn a_cheap_draft_is_never_stopped_and_a_good_one_drafts_long_at_once() -> Result<()> {
    // A cheap draft on hard text: its probes lose, but it could pay on easy text, so they go on
    // (`adaptive_k_follows_a_change_of_text` shows the payoff).
    let mut ctl = KController::new(KPolicy::default())?;
    let hard = World { alpha: 0.0, c: 0.05, slope: 0.1 };
    let stretch = run(&mut ctl, hard, |_| hard.alpha, &mut StdRng::seed_from_u64(12), ROUNDS, usize::MAX);
    assert!(!ctl.stopped_probing());
    assert!(stretch.ks[ROUNDS / 2..].contains(&1));
    // A good cheap draft over one short generation: long blocks, close to the best fixed k
    // (the first round drafts one token only, to measure).
    let good = World { alpha: 0.9, c: 0.05, slope: 0.1 };
    let adaptive = generation(KPolicy::default(), good, 300, 13)?;
    let best_fixed = (1..=MAX_K)
        .map(|k| Ok(generation(KPolicy::Fixed(k), good, 300, 13)?.time_per_token()))
        .collect::<Result<Vec<_>>>()?;
    let best_fixed = best_fixed.into_iter().fold(f64::MAX, f64::min);
    let mean_k = adaptive.ks.iter().sum::<usize>() as f64 / adaptive.ks.len() as f64;
    eprintln!(
        "good draft, 300 tokens: adaptive {:.4}× plain (mean k {mean_k:.2}), best fixed k {best_fixed:.4}×",
        adaptive.time_per_token()
    );
    assert!(mean_k >= 4.0, "mean k {mean_k:.2}");
    assert!(adaptive.time_per_token() <= 1.1 * best_fixed, "{:.4} vs {best_fixed:.4}", adaptive.time_per_token());
    Ok(())
}

/// A toy model made expensive by busy work: `fixed` steps per call plus `per_row` per logits
/// row. As a target (a few thousand steps) its draft costs a few percent of it, as a small
/// model beside a large one does; as a draft (a million steps) it costs hundreds of toy target
/// calls, as a draft on a slow path (a CPU without fast kernels for its format) can.
/// A toy model whose calls cost simulated time: each advances `clock` by `fixed + per_row·rows`
/// seconds. Decoders built with the same clock weigh these costs, so the k they choose, and
/// every test below that uses it, is deterministic (no wall clock is read).
#[derive(Clone)]
struct Busy {
    model: MarkovModel,
    clock: Clock,
    fixed: f64,
    per_row: f64,
    /// Seconds per token fed (a draft catching up on many tokens pays for each).
    per_token: f64,
}

/// A costly target (1 ms a call plus 0.1 ms a row) on `clock`.
fn costly(model: MarkovModel, clock: &Clock) -> Busy {
    Busy { model, clock: clock.clone(), fixed: 1e-3, per_row: 1e-4, per_token: 0.0 }
}

/// A draft costing a hundredth of [`costly`]'s step.
fn light(model: MarkovModel, clock: &Clock) -> Busy {
    Busy { model, clock: clock.clone(), fixed: 1e-5, per_row: 0.0, per_token: 0.0 }
}

impl TokenModel for Busy {
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

impl TargetModel for Busy {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        self.clock.advance(self.fixed + self.per_row * rows as f64 + self.per_token * tokens.len() as f64);
        self.model.forward(tokens, rows)
    }
}

#[test]
fn the_default_policy_leaves_a_draft_far_slower_than_its_target() -> Result<()> {
    // A draft call costs 500 target steps on the simulated clock: no draft could be worth it.
    let clock = Clock::manual();
    let target = MarkovModel::random(16, 1, 5);
    let prompt = [1, 2, 3];
    let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(200).generate(&prompt)?;
    let slow =
        Busy { model: target.noisy_copy(0.1, 6), clock: clock.clone(), fixed: 1e-3, per_row: 0.0, per_token: 0.0 };
    let fast = Busy { model: target, clock: clock.clone(), fixed: 2e-6, per_row: 0.0, per_token: 0.0 };
    let mut dec =
        SpeculativeDecoder::builder(Pair { target: fast, draft: slow }).max_new_tokens(200).clock(clock).build()?;
    let mut drafted = 0;
    for _ in 0..20 {
        let out = dec.generate(&prompt)?;
        assert_eq!(out.tokens, plain.tokens);
        drafted += out.stats.drafted;
        if dec.stopped_probing() {
            break;
        }
    }
    assert!(dec.stopped_probing(), "still probing after 20 generations");
    assert_eq!(drafted, 3, "one measuring round and two probes, one token each");
    // From then on the draft is neither called nor fed the prompt.
    let out = dec.generate(&prompt)?;
    assert_eq!(out.tokens, plain.tokens);
    assert_eq!((out.stats.draft_calls, TokenModel::context_len(dec.draft())), (0, 0));
    Ok(())
}

/// One sequence, two engines: the single decoder and a batch of one, on the same toy models,
/// the same simulated times and the same seed, choose the same k every round (the same cost
/// model, fed the same measurements: catch-up priced, the time beside the models, predicted
/// against measured throughput), so they emit the same tokens over the same rounds, and go on
/// doing so over later generations. Five pairs: a draft far cheaper than its target (it
/// drafts), one as costly (it decodes plainly and probes, so its draft falls behind and must
/// catch up, until it stops probing), ones in between, and drafts that pay for each token of a
/// catch-up.
#[test]
fn a_batch_of_one_chooses_the_ks_of_the_single_decoder() -> Result<()> {
    use specdec::{BatchDecoder, Request};
    let target = MarkovModel::random(6, 2, 21);
    let cfg = SamplingConfig::new(1.0)?.with_seed(77);
    // (draft noise, draft seconds a call, a token fed): the last pair's draft pays for each
    // token it catches up on, so pricing the catch-up changes when it starts drafting again.
    for (noise, draft_fixed, draft_token) in
        [(0.3, 1e-5, 0.0), (0.3, 1e-3, 0.0), (0.3, 2e-4, 0.0), (0.8, 1e-5, 2e-4), (0.7, 1e-4, 1e-4)]
    {
        let draft = target.noisy_copy(noise, 22);
        let target_fixed = 1e-3;
        let busy = |model: &MarkovModel, fixed: f64, clock: &Clock| Busy {
            model: model.clone(),
            clock: clock.clone(),
            fixed,
            per_row: if fixed == target_fixed { 1e-4 } else { 0.0 },
            per_token: if fixed == target_fixed { 0.0 } else { draft_token },
        };
        let clock = Clock::manual();
        let single = SpeculativeDecoder::builder(Pair {
            target: busy(&target, target_fixed, &clock),
            draft: busy(&draft, draft_fixed, &clock),
        })
        .clock(clock)
        .k_policy(KPolicy::Adaptive { max: 4 })
        .sampling(cfg.clone())
        .max_new_tokens(300)
        .build()?
        .generate(&PROMPT)?;
        let clock = Clock::manual();
        let mut batch = BatchDecoder::new(KPolicy::Adaptive { max: 4 })?.with_clock(clock.clone());
        let request = Request::new(PROMPT.to_vec()).sampling(cfg.clone()).max_new_tokens(300);
        batch.add(
            Pair { target: busy(&target, target_fixed, &clock), draft: busy(&draft, draft_fixed, &clock) },
            request,
        )?;
        let done = batch.run()?;
        let (b, s) = (&done[0].generation, &single);
        let what = format!("draft noise {noise}, {draft_fixed} s a call, {draft_token} s a token");
        eprintln!("{what}: drafted {} in {} target calls", s.stats.drafted, s.stats.target_calls);
        assert_eq!(b.tokens, s.tokens, "{what}");
        // (Draft calls differ by the prompt: the single decoder feeds it to the draft when the
        // generation starts, the batch with its first drafting step, as a counted call.)
        let counts = |g: &specdec::Generation| (g.stats.drafted, g.stats.accepted, g.stats.target_calls);
        assert_eq!(counts(b), counts(s), "{what}: (drafted, accepted, target calls)");
        // Generation after generation (greedy, so that each run draws nothing): the single
        // decoder carries its estimates and probing state over, the batch its pooled
        // acceptance, costs and latest probing state.
        let clock = Clock::manual();
        let mut single = SpeculativeDecoder::builder(Pair {
            target: busy(&target, target_fixed, &clock),
            draft: busy(&draft, draft_fixed, &clock),
        })
        .clock(clock)
        .k_policy(KPolicy::Adaptive { max: 4 })
        .max_new_tokens(150)
        .build()?;
        let clock = Clock::manual();
        let mut batch = BatchDecoder::new(KPolicy::Adaptive { max: 4 })?.with_clock(clock.clone());
        for generation in 0..3 {
            let s = single.generate(&PROMPT)?;
            let request = Request::new(PROMPT.to_vec()).max_new_tokens(150);
            batch.add(
                Pair { target: busy(&target, target_fixed, &clock), draft: busy(&draft, draft_fixed, &clock) },
                request,
            )?;
            let b = batch.run()?.remove(0).generation;
            assert_eq!(b.tokens, s.tokens, "{what}, greedy generation {generation}");
            assert_eq!(counts(&b), counts(&s), "{what}, greedy generation {generation}");
        }
    }
    Ok(())
}

fn policies() -> [KPolicy; 3] {
    [KPolicy::Adaptive { max: 6 }, KPolicy::GrowShrink { start: 1, max: 6 }, KPolicy::GrowShrink { start: 6, max: 6 }]
}

#[test]
fn greedy_with_a_k_policy_equals_plain_greedy() -> Result<()> {
    for seed in 0..30u64 {
        let vocab = 4 + (seed as usize % 29);
        let target = MarkovModel::random(vocab, 1 + (seed as usize % 2), seed);
        let draft = target.noisy_copy(0.05 + 0.03 * seed as f32, seed + 100);
        let prompt: Vec<u32> = (0..1 + seed % 5).map(|i| ((i * 7 + seed) % vocab as u64) as u32).collect();
        let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(80).generate(&prompt)?;
        for policy in policies() {
            let mut cheap = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
                .k_policy(policy)
                .max_new_tokens(80)
                .build()?;
            let clock = Clock::manual();
            let mut costly = SpeculativeDecoder::builder(Pair {
                target: costly(target.clone(), &clock),
                draft: light(draft.clone(), &clock),
            })
            .k_policy(policy)
            .clock(clock)
            .max_new_tokens(80)
            .build()?;
            // Twice each: the second generation starts from what the controller learned.
            for round in 0..2 {
                assert_eq!(
                    cheap.generate(&prompt)?.tokens,
                    plain.tokens,
                    "seed {seed}, {policy:?}, generation {round}"
                );
                assert_eq!(
                    costly.generate(&prompt)?.tokens,
                    plain.tokens,
                    "costly, seed {seed}, {policy:?}, generation {round}"
                );
            }
        }
    }
    Ok(())
}

const PROMPT: [u32; 3] = [2, 0, 5];

/// Checks adaptive decoding of the order-2 toy target at temperature 1 through `model` (drafted
/// by `draft`, times read on `clock`), and that the controller drafted `mean_k` tokens per round
/// on average (so that the battery exercised the adaptive path it is meant to).
fn check_adaptive<D: DraftModel, T: TargetModel>(
    name: &str,
    (draft, model, clock): (D, T, Clock),
    target: &MarkovModel,
    mean_k: std::ops::RangeInclusive<f64>,
) -> Result<()> {
    let cfg = SamplingConfig::new(1.0)?;
    let mut dec = SpeculativeDecoder::builder(Pair { target: model, draft })
        .clock(clock)
        .k_policy(KPolicy::Adaptive { max: 4 })
        .sampling(cfg.clone())
        .seed(3000)
        .max_new_tokens(7)
        .build()?;
    let total = check_windows(&format!("adaptive k, {name}"), &mut dec, target, &cfg, &PROMPT, 4, 60_000)?;
    eprintln!("adaptive k, {name}: {:.2} drafted per round, α = {:.3}", total.mean_k(), total.position_acceptance());
    assert!(total.accepted > 0 && total.rejections > 0, "adaptive k, {name}: one outcome never seen: {total:?}");
    assert!(mean_k.contains(&total.mean_k()), "adaptive k, {name}: mean k {:.2} not in {mean_k:?}", total.mean_k());
    Ok(())
}

#[test]
fn sequences_with_adaptive_k_follow_the_target() -> Result<()> {
    // k follows the times measured on a manual clock that the models advance, so each run
    // draws the same (exactness holds for any k chosen from the past, at the battery's 1e-6
    // false-alarm rate). With a draft that costs as much as its target the controller mostly
    // decodes plainly and probes; with a target a hundred times the draft's cost it drafts long
    // blocks (k is capped at 4 and the generations at 7 tokens). Both must see both outcomes.
    let target = MarkovModel::random(6, 2, 21);
    let draft = target.noisy_copy(0.3, 22);
    let clock = Clock::manual();
    let even = (light(draft.clone(), &clock), light(target.clone(), &clock), clock);
    check_adaptive("draft as costly as the target", even, &target, 0.0..=0.2)?;
    let clock = Clock::manual();
    let costly_pair = (light(draft, &clock), costly(target.clone(), &clock), clock);
    check_adaptive("costly target", costly_pair, &target, 1.5..=4.0)
}

/// Power near the detection limit of the adaptive battery (60,000 generations): the costly
/// pair again, its target's rows nudged until the first window's law sits at twice the
/// noncentrality the test catches half the time (see `tests/exactness.rs`); the statistic must
/// reject it against the unnudged law.
#[test]
fn the_adaptive_battery_rejects_a_law_just_past_its_detection_limit() -> Result<()> {
    let target = MarkovModel::random(6, 2, 21);
    let cfg = SamplingConfig::new(1.0)?;
    let (nudged, eps, ratio) = nudged_past_the_limit(&target, &cfg, &PROMPT, 0, 60_000);
    assert!(ratio < 3.0 && eps < 0.05, "ε = {eps}, {ratio:.2} times the limit: not near the limit");
    let clock = Clock::manual();
    let mut dec = SpeculativeDecoder::builder(Pair {
        target: costly(nudged.clone(), &clock),
        draft: light(target.noisy_copy(0.3, 22), &clock),
    })
    .clock(clock)
    .k_policy(KPolicy::Adaptive { max: 4 })
    .sampling(cfg.clone())
    .seed(3002)
    .max_new_tokens(7)
    .build()?;
    let (counts, total) = window_counts(&mut dec, 6, &PROMPT, 4, 60_000)?;
    assert!(total.mean_k() >= 1.5, "the adaptive path was not exercised: {total:?}");
    assert_nudge_rejected("adaptive k", &counts[0], (&target, &nudged), &cfg, &PROMPT);
    Ok(())
}

#[test]
fn sequences_with_grow_shrink_k_follow_the_target() -> Result<()> {
    let target = MarkovModel::random(6, 2, 21);
    let draft = target.noisy_copy(0.3, 22);
    let cfg = SamplingConfig::new(1.0)?;
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
        .k_policy(KPolicy::GrowShrink { start: 2, max: 4 })
        .sampling(cfg.clone())
        .seed(3001)
        .max_new_tokens(7)
        .build()?;
    let total = check_windows("grow/shrink k", &mut dec, &target, &cfg, &PROMPT, 4, 60_000)?;
    assert!(total.drafted > total.target_calls, "{total:?}");
    Ok(())
}
