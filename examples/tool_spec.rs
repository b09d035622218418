//! Tool-call speculation (the seed's "Speculating Tool Calls, Not Tokens"):
//! (a) the seed's table of wall-clock reduction 1 − 1/S,
//! (b) a Monte Carlo check of the closed form,
//! (c) a real-time demo with sleeping tools and a sleeping generator.
//!
//! `cargo run --release --example tool_spec`

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;
use specdec::tools::{
    simulate_speedup, speedup, wall_clock_reduction, Executor, Registry, Safety, Speculator, ToolCall,
};

/// The reported Hit@1 rates (Ji et al. 2026), before and after joint agent-speculator RL.
const HITS: [(&str, f64); 4] =
    [("Qwen3-4B before", 0.441), ("Qwen3-4B after", 0.612), ("Qwen3.5-4B before", 0.489), ("Qwen3.5-4B after", 0.663)];
/// Tool-to-generation latency ratios ρ of the table.
const RHOS: [f64; 5] = [0.25, 0.5, 1.0, 2.0, 4.0];

/// Tool-call speculation: closed form, Monte Carlo check and a real-time demo.
#[derive(Parser)]
struct Args {
    /// Speculation overhead σ = T_spec / T_gen (table, simulation and the demo's speculator).
    #[arg(long, default_value_t = 0.05)]
    sigma: f64,
    /// Simulated turns per Monte Carlo setting.
    #[arg(long, default_value_t = 200_000)]
    turns: usize,
    /// Seed of the Monte Carlo generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Generation time of one agent turn in the demo, in milliseconds.
    #[arg(long, default_value_t = 40)]
    gen_ms: u64,
    /// Turns per setting in the demo.
    #[arg(long, default_value_t = 40)]
    demo_turns: usize,
    /// Hit rate of the demo's speculator.
    #[arg(long, default_value_t = 0.6)]
    alpha: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    table(args.sigma)?;
    monte_carlo(&args)?;
    demo(&args)
}

/// (a) The seed's table, formatted as the seed prints it.
fn table(sigma: f64) -> Result<()> {
    println!("(a) wall-clock reduction 1 - 1/S at sigma = {sigma}\n");
    let header: Vec<String> = RHOS.iter().map(|r| format!("{:>9}", format!("rho={r}"))).collect();
    println!("{:>18} {:>6} {}", "setting", "alpha", header.join(" "));
    for (name, alpha) in HITS {
        let row = RHOS.iter().map(|&r| Ok(format!("{:8.1}%", 100.0 * wall_clock_reduction(alpha, r, sigma)?)));
        let row: Vec<String> = row.collect::<Result<_>>()?;
        println!("{name:>18} {alpha:6.3} {}", row.join(" "));
    }
    Ok(())
}

/// (b) The closed form against a simulated trajectory, for every setting of the table.
fn monte_carlo(args: &Args) -> Result<()> {
    println!("\n(b) closed form vs simulated {}-turn trajectory (sigma = {})\n", args.turns, args.sigma);
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut worst: f64 = 0.0;
    for (_, alpha) in HITS {
        for rho in RHOS {
            let closed = speedup(alpha, rho, args.sigma)?;
            let simulated = simulate_speedup(alpha, rho, args.sigma, args.turns, &mut rng)?;
            let err = 100.0 * (simulated / closed - 1.0);
            worst = worst.max(err.abs());
            println!("  alpha={alpha:.3} rho={rho:<4}  closed={closed:.4}  simulated={simulated:.4}  error={err:+.3}%");
        }
    }
    println!("  largest |error| = {worst:.3}% (tolerance 0.5%)");
    if worst >= 0.5 {
        bail!("the simulation strays {worst:.3}% from the closed form");
    }
    Ok(())
}

/// A speculator that predicts the scripted agent's next call right on a fixed share `alpha` of
/// turns (evenly spread), after spending `cost` (the simulated T_spec).
struct Scripted {
    alpha: f64,
    cost: Duration,
}

impl Speculator for Scripted {
    fn predict(&mut self, trajectory: &[ToolCall]) -> specdec::Result<Option<ToolCall>> {
        thread::sleep(self.cost);
        let turn = trajectory.len();
        let hit = ((turn + 1) as f64 * self.alpha).floor() > (turn as f64 * self.alpha).floor();
        Ok(Some(if hit { script(turn) } else { ToolCall::new("search", json!({"q": "a wrong guess"})) }))
    }
}

/// The agent's calls: a search per turn, with arguments that change every turn.
fn script(turn: usize) -> ToolCall {
    ToolCall::new("search", json!({"q": format!("question {turn}"), "k": 5}))
}

/// (c) Real time: the agent "generates" by sleeping T_gen; the tool sleeps T_tool = ρ·T_gen.
/// "measured S" is serial wall time over speculative wall time; "saved s" and "stats S" are the
/// executor's own accounting ([`specdec::tools::ToolStats`]); "closed S" is the formula at the
/// measured α, ρ and σ.
fn demo(args: &Args) -> Result<()> {
    let gen = Duration::from_millis(args.gen_ms);
    println!(
        "\n(c) real time: T_gen = {} ms, T_spec = {:.1} ms, alpha = {}, {} turns per setting\n",
        args.gen_ms,
        args.sigma * args.gen_ms as f64,
        args.alpha,
        args.demo_turns
    );
    println!(
        "{:>5} {:>6} {:>7} {:>7} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10} {:>8}",
        "rho",
        "alpha",
        "rho_m",
        "sigma_m",
        "serial s",
        "spec s",
        "saved s",
        "stats S",
        "measured S",
        "closed S",
        "error"
    );
    let started = Instant::now();
    let mut worst: f64 = 0.0;
    for rho in [0.5, 1.0, 2.0] {
        let tool = gen.mul_f64(rho);
        let mut tools = Registry::new();
        tools.register("search", Safety::ReadOnly, move |a| {
            thread::sleep(tool);
            Ok(json!({"results": ["..."], "for": a["q"].clone()}))
        })?;

        // Without speculation: generate, then call.
        let t = Instant::now();
        for turn in 0..args.demo_turns {
            thread::sleep(gen);
            tools.call(&script(turn))?;
        }
        let serial = t.elapsed().as_secs_f64();

        // With speculation: predict and dispatch, generate, then call.
        let mut exec = Executor::new(tools);
        let mut speculator = Scripted { alpha: args.alpha, cost: gen.mul_f64(args.sigma) };
        let mut trajectory = Vec::with_capacity(args.demo_turns);
        let t = Instant::now();
        for turn in 0..args.demo_turns {
            exec.speculate_next(&mut speculator, &trajectory)?;
            thread::sleep(gen);
            let actual = script(turn);
            exec.execute(&actual)?;
            trajectory.push(actual);
        }
        let spec = t.elapsed().as_secs_f64();

        let s = exec.stats();
        let measured = serial / spec;
        let closed = speedup(s.hit_rate(), s.rho(), s.sigma())?;
        let err = 100.0 * (measured / closed - 1.0);
        worst = worst.max(err.abs());
        println!(
            "{rho:>5} {:>6.3} {:>7.3} {:>7.3} {serial:>9.3} {spec:>9.3} {:>8.3} {:>8.3} {measured:>10.3} {closed:>10.3} {err:>+7.2}%",
            s.hit_rate(),
            s.rho(),
            s.sigma(),
            s.saved_secs(),
            s.measured_speedup(),
        );
    }
    let verdict = if worst < 10.0 { "within" } else { "NOT within" };
    println!("  largest |error| = {worst:.2}%: {verdict} the 10% tolerance");
    println!("  demo wall time {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
