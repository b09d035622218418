//! Reproduces the seed's Section 3 on toy Markov models: (a) single-step exactness, (b) a
//! noise sweep of acceptance and speedup at k = 4, (c) a sweep over k with the best k marked;
//! then (d) the k policies of Section 6 on the geometric model: the best fixed k against the
//! grow/shrink schedule and the adaptive controller.
//!
//! Speedup here is the seed's cost model (a draft call costs `c` target calls), not wall time.
//!
//! `cargo run --release --example simulate [-- --plot docs/charts/simulate-k-sweep.svg]`

#[path = "support/chart.rs"]
mod chart;

use anyhow::Result;
use chart::{line_chart, Series};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use specdec::kernel::{self, DraftRow, Judgement};
use specdec::sampling::sample;
use specdec::stats::{expected_tokens_per_call, predicted_speedup};
use specdec::toy::{MarkovModel, ToyPair};
use specdec::{KController, KPolicy, Pair, RoundReport, SamplingConfig, SpeculativeDecoder, Stats};

#[derive(Parser)]
struct Args {
    /// Single-step trials for table (a).
    #[arg(long, default_value_t = 200_000)]
    samples: usize,
    /// Speculative rounds per row of tables (b) and (c).
    #[arg(long, default_value_t = 6_000)]
    rounds: usize,
    /// Cost of a draft call in target calls.
    #[arg(long, default_value_t = 0.15)]
    cost_ratio: f64,
    /// Table (d): extra cost of verifying each additional row, in target calls.
    #[arg(long, default_value_t = 0.1)]
    verify_slope: f64,
    /// Write an SVG plot of speedup against k to this file.
    #[arg(long)]
    plot: Option<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    single_step(args.samples)?;
    println!("\n(b) noise sweep, k = 4, vocab 32, c = {}", args.cost_ratio);
    println!(
        "{:>6} {:>7} {:>7} {:>9} {:>10} {:>11} {:>8}",
        "noise", "alpha", "a_pos", "tok/call", "predicted", "pred(a_pos)", "speedup"
    );
    for noise in [0.0, 0.1, 0.2, 0.4, 0.7] {
        let (s, speedup) = trial(noise, 4, args.rounds, args.cost_ratio)?;
        println!(
            "{noise:6.1} {:7.3} {:7.3} {:9.3} {:10.3} {:11.3} {speedup:8.3}",
            s.acceptance_rate(),
            s.position_acceptance(),
            s.tokens_per_target_call(),
            expected_tokens_per_call(4.0, s.acceptance_rate()),
            expected_tokens_per_call(4.0, s.position_acceptance()),
        );
    }
    println!("\n(c) k sweep, noise 0.1");
    println!("{:>3} {:>7} {:>7} {:>9} {:>8} {:>10}", "k", "alpha", "a_pos", "tok/call", "speedup", "S(k,a,c)");
    let mut rows = Vec::new();
    for k in 1..=8 {
        let (s, speedup) = trial(0.1, k, args.rounds, args.cost_ratio)?;
        let predicted = predicted_speedup(k as f64, s.position_acceptance(), args.cost_ratio);
        rows.push((k, s.acceptance_rate(), s.position_acceptance(), s.tokens_per_target_call(), speedup, predicted));
    }
    let best = rows.iter().map(|r| r.4).fold(f64::MIN, f64::max);
    for &(k, a, a_pos, tpc, sp, pred) in &rows {
        println!(
            "{k:3} {a:7.3} {a_pos:7.3} {tpc:9.3} {sp:8.3} {pred:10.3}{}",
            if sp == best { "  <- best" } else { "" }
        );
    }
    println!("\nalpha = drafted tokens accepted (the seed's measure); a_pos = accepted / (accepted + rejections),");
    println!(
        "the per-position rate the geometric closed form assumes: pred(a_pos) tracks tok/call, 'predicted' does not."
    );
    if let Some(path) = args.plot {
        let line = |name: &str, dashed: bool, column: usize| Series {
            name: name.into(),
            points: rows.iter().map(|r| (r.0 as f64, if column == 4 { r.4 } else { r.5 })).collect(),
            dashed,
        };
        let series = [line("measured", false, 4), line("S(k, a_pos, c)", true, 5)];
        let title = format!("speedup vs k: toy model, noise 0.1, c = {}", args.cost_ratio);
        line_chart(&path, &title, "k", "speedup (cost in target calls)", &series, false)?;
        println!("wrote {path}");
    }
    policies(args.rounds, args.verify_slope)?;
    Ok(())
}

/// Table (d): speedups of the k policies when a draft call costs c, verifying m rows costs
/// 1 + slope·(m − 1) and each drafted position passes with probability α.
fn policies(rounds: usize, slope: f64) -> Result<()> {
    println!("\n(d) k policies, geometric model, {rounds} rounds, verification slope {slope}");
    println!("{:>5} {:>5} {:>7} {:>9} {:>12} {:>9}", "alpha", "c", "best k", "fixed", "grow/shrink", "adaptive");
    for (alpha, c) in [(0.5, 0.05), (0.5, 0.3), (0.7, 0.05), (0.7, 0.15), (0.9, 0.05), (0.9, 0.3), (0.1, 0.3)] {
        let run = |policy| policy_speedup(policy, alpha, c, slope, rounds);
        let fixed = (1..=8).map(|k| Ok((k, run(KPolicy::Fixed(k))?))).collect::<Result<Vec<_>>>()?;
        let (k, fixed) = fixed.into_iter().fold((0, 0.0), |best, r| if r.1 > best.1 { r } else { best });
        let (grow, adaptive) = (run(KPolicy::GrowShrink { start: 1, max: 8 })?, run(KPolicy::Adaptive { max: 8 })?);
        println!("{alpha:5.1} {c:5.2} {k:7} {fixed:9.3} {grow:12.3} {adaptive:9.3}");
    }
    println!("speedup = tokens / cost in target calls; plain decoding is 1.000.");
    Ok(())
}

fn policy_speedup(policy: KPolicy, alpha: f64, c: f64, slope: f64, rounds: usize) -> Result<f64> {
    let mut ctl = KController::new(policy)?;
    let mut rng = StdRng::seed_from_u64(42);
    let (mut tokens, mut cost) = (0.0, 0.0);
    for _ in 0..rounds {
        let k = ctl.next_k();
        let accepted = (0..k).take_while(|_| rng.random::<f64>() < alpha).count();
        let (draft_secs, target_secs) = (k as f64 * c, 1.0 + slope * k as f64);
        ctl.observe(&RoundReport { drafted: k, accepted, draft_calls: k, draft_secs, target_rows: k + 1, target_secs });
        tokens += (accepted + 1) as f64;
        cost += draft_secs + target_secs;
    }
    Ok(tokens / cost)
}

/// Table (a): the seed's misaligned (p, q), one speculative step at a time.
fn single_step(n: usize) -> Result<()> {
    let p = [0.40f32, 0.25, 0.15, 0.10, 0.07, 0.03];
    let q = [0.10f32, 0.10, 0.30, 0.30, 0.15, 0.05];
    let mut rng = StdRng::seed_from_u64(0);
    let (mut counts, mut accepted) = ([0usize; 6], 0);
    for _ in 0..n {
        let t = sample(&q, &mut rng)?;
        let emitted = match kernel::judge(&p, DraftRow::Dense(&q), t, &mut rng)? {
            Judgement::Accept => {
                accepted += 1;
                t
            }
            Judgement::Reject(r) => r,
        };
        counts[emitted as usize] += 1;
    }
    let emp: Vec<f64> = counts.iter().map(|&c| c as f64 / n as f64).collect();
    let err = p.iter().zip(&emp).map(|(&a, b)| (a as f64 - b).abs()).fold(0.0, f64::max);
    println!("(a) single step, N = {n}");
    println!("target p   : {}", fmt_row(p.iter().map(|&x| x as f64)));
    println!("empirical  : {}", fmt_row(emp.into_iter()));
    println!("max abs err: {err:.4}");
    println!(
        "accept rate: {:.4} (theory: sum min(p, q) = {:.4})",
        accepted as f64 / n as f64,
        kernel::acceptance_rate(&p, &q)
    );
    Ok(())
}

fn fmt_row(xs: impl Iterator<Item = f64>) -> String {
    xs.map(|x| format!("{x:.4}")).collect::<Vec<_>>().join(" ")
}

/// `rounds` speculative rounds at temperature 1 on the seed's 32-token pair; returns the
/// statistics and the cost-model speedup: tokens / (target calls + c · draft calls).
fn trial(noise: f32, k: usize, rounds: usize, c: f64) -> Result<(Stats, f64)> {
    let ToyPair { target, draft } = MarkovModel::pair(32, noise, 7);
    let mut dec = SpeculativeDecoder::builder(Pair { target, draft })
        .k(k)
        .sampling(SamplingConfig::new(1.0)?)
        .seed(42)
        .max_new_tokens(usize::MAX / 2)
        .build()?;
    dec.start(&[0])?;
    for _ in 0..rounds {
        dec.step()?;
    }
    let s = dec.stats().clone();
    let cost = s.target_calls as f64 + c * s.draft_calls as f64;
    Ok((s.clone(), s.new_tokens as f64 / cost))
}
