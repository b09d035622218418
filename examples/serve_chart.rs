//! Charts `scripts/serve-bench.py --json` rows: aggregate tokens per second against the number
//! of concurrent clients, one line per label, the median where a label and a concurrency were
//! measured more than once.
//!
//!     cargo run --release --example serve_chart -- --svg docs/charts/serving.svg rows.jsonl

#[path = "support/chart.rs"]
mod chart;

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use chart::{line_chart, Series};
use clap::Parser;
use serde_json::Value;

#[derive(Parser)]
struct Args {
    /// Where to write the chart.
    #[arg(long, default_value = "docs/charts/serving.svg")]
    svg: String,
    /// The chart's title.
    #[arg(long, default_value = "Aggregate throughput against concurrent clients")]
    title: String,
    /// Files of serve-bench JSON lines (other lines are skipped).
    files: Vec<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // label -> clients -> tokens per second of each run
    let mut runs: BTreeMap<String, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for file in &args.files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
        for row in text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()) {
            let (Some(label), Some(clients), Some(tok_s)) =
                (row["label"].as_str(), row["clients"].as_u64(), row["tok_s"].as_f64())
            else {
                continue;
            };
            runs.entry(label.to_string()).or_default().entry(clients).or_default().push(tok_s);
        }
    }
    let series: Vec<Series> = runs
        .into_iter()
        .map(|(name, by_clients)| {
            let points = by_clients.into_iter().map(|(c, mut v)| (c as f64, median(&mut v))).collect();
            Series { name, points, dashed: false }
        })
        .collect();
    line_chart(&args.svg, &args.title, "concurrent clients", "tokens/s, all requests", &series, true)?;
    println!("wrote {} ({} lines)", args.svg, series.len());
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
