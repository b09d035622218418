//! Criterion benches. Each comparison sits in one group so that its ratio comes from one run:
//! (a) the accept/reject kernel on vocabulary-sized rows; (b) matrix products and model
//! forwards for 1 versus k + 1 rows; (c) 128-token generations, plain versus speculative for
//! k = 2..6, on toy models and, when `scripts/fetch-models.sh` has run, on SmolLM2-135M
//! (f32 target, its own Q4_1 weights as the draft); (d) eight SmolLM2 sequences decoded one
//! after another against one batch (plain, fixed k, adaptive).
//!
//! `cargo bench` (about 10 minutes here); `cargo bench -- kernel` for one group.

use specdec::TokenModel;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use specdec::adaptive::CostModel;
use specdec::batch::{BatchDecoder, Request};
use specdec::kernel::{self, DraftRow};
use specdec::models::native::matmul::{matmul_parallel, Packed};
use specdec::toy::{MarkovModel, ToyPair};
use specdec::KPolicy;
use specdec::{
    Llama, LlamaWeights, ModelFiles, Pair, PlainDecoder, SamplingConfig, SpeculativeDecoder, TargetModel, WeightFormat,
};

const VOCAB: usize = 49_152;

fn probs(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut p: Vec<f32> = (0..n).map(|_| rng.random::<f32>().powi(8)).collect();
    let total: f32 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    p
}

/// (a) One judged position and a 5-token block on SmolLM2-sized rows; logits → probabilities.
fn kernel_rows(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(1);
    let p: Vec<Vec<f32>> = (0..5).map(|_| probs(&mut rng, VOCAB)).collect();
    let q: Vec<Vec<f32>> = (0..4).map(|_| probs(&mut rng, VOCAB)).collect();
    let logits: Vec<f32> = p[0].iter().map(|x| x.ln().max(-80.0)).collect();
    let mut g = c.benchmark_group("kernel");
    g.sample_size(30).measurement_time(Duration::from_secs(3));
    g.bench_function("judge", |b| b.iter(|| kernel::judge(&p[0], DraftRow::Dense(&q[0]), 7, &mut rng)));
    g.bench_function("verify_block_k4", |b| {
        let rows: Vec<DraftRow> = q.iter().map(|r| DraftRow::Dense(r)).collect();
        b.iter(|| {
            kernel::verify_block(
                &[1, 2, 3, 4],
                &rows,
                |i, buf| {
                    buf.clear();
                    buf.extend_from_slice(&p[i]);
                    Ok(())
                },
                &mut rng,
            )
        })
    });
    let mut out = Vec::new();
    for (name, cfg) in [
        ("probs_t0.8", SamplingConfig::new(0.8).ok()),
        ("probs_top_p0.95", SamplingConfig::new(0.8).and_then(|c| c.with_top_p(0.95)).ok()),
    ] {
        let Some(cfg) = cfg else { continue };
        g.bench_function(name, |b| b.iter(|| cfg.probs(black_box(&logits), &mut out)));
    }
    g.finish();
}

/// (b) The SmolLM2 FFN shape (1536 × 576) for 1 and 5 rows, and whole model forwards.
fn rows_one_vs_many(c: &mut Criterion) {
    let (n, k) = (1536, 576);
    let Ok(w) = Packed::pack(&(0..n * k).map(|i| (i % 97) as f32 / 97.0).collect::<Vec<_>>(), n, k) else {
        return;
    };
    let mut g = c.benchmark_group("matmul_1536x576");
    g.sample_size(50).measurement_time(Duration::from_secs(3));
    for m in [1usize, 5] {
        let x = vec![0.5f32; m * k];
        let mut y = vec![0f32; m * n];
        g.bench_with_input(BenchmarkId::from_parameter(format!("{m}_rows")), &m, |b, &m| {
            b.iter(|| matmul_parallel(&x, m, &w, &mut y, 64))
        });
    }
    g.finish();
    for (name, weights) in real_models() {
        let mut g = c.benchmark_group(format!("forward_{name}"));
        g.sample_size(10).measurement_time(Duration::from_secs(5));
        for rows in [1usize, 5] {
            let Ok(mut model) = Llama::new(weights.clone()) else { continue };
            let context: Vec<u32> = (0..100).collect();
            if model.forward(&context, 0).is_err() {
                continue;
            }
            let fresh: Vec<u32> = (200..200 + rows as u32).collect();
            g.bench_function(format!("{rows}_rows_at_100"), |b| {
                b.iter(|| {
                    let _ = model.forward(&fresh, rows);
                    let _ = model.truncate(100);
                })
            });
        }
        g.finish();
    }
}

/// (b) The quantized products of Qwen2.5-1.5B's FFN shapes in Q4_K, for 1, 5 and 9 rows: up
/// and gate (8960 × 1536) and down (1536 × 8960, whose 5 or 9 quantized activation rows no
/// longer fit the L1 cache). Copies of each matrix, 640 MB in all, take turns, so that the
/// weights come from memory as in a forward pass of a 1.5B model (the L3 cache of a server core
/// may hold hundreds of MB: 480 MiB on the Xeon of the README, where eight copies were served
/// from it at 47 GB/s). A fifth of `up` (1792 × 1536, 1.5 MB), one copy, stays in
/// the L2 caches: its time is the arithmetic alone, and set beside `up`'s it tells whether a
/// number of rows is bound by memory or by the kernel's instructions.
fn quantized_rows(c: &mut Criterion) {
    use candle_core::quantized::{GgmlDType, QTensor};
    use specdec::models::native::quant::{qmatmul_parallel, QActs, QMatrix};
    for (name, n, k, cold) in [("up", 8960, 1536, true), ("down", 1536, 8960, true), ("up_in_cache", 1792, 1536, false)]
    {
        let values: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 2000) as f32 / 1000.0 - 1.0).collect();
        let Ok(bytes) = candle_core::Tensor::from_vec(values, (n, k), &candle_core::Device::Cpu)
            .and_then(|t| QTensor::quantize(&t, GgmlDType::Q4K))
            .and_then(|q| q.data().map(|d| d.to_vec()))
        else {
            continue;
        };
        let Ok(first) = QMatrix::from_ggml(GgmlDType::Q4K, &bytes, n, k) else {
            continue;
        };
        let count = if cold { (640 << 20) / first.size_bytes() + 1 } else { 1 };
        let copies = vec![first; count];
        let mut g = c.benchmark_group(format!("q4k_{name}_{n}x{k}"));
        g.sample_size(30).measurement_time(Duration::from_secs(3));
        for m in [1usize, 5, 9, 16] {
            let mut acts = QActs::default();
            if acts.quantize(&vec![0.5f32; m * k], m, k).is_err() {
                continue;
            }
            let mut y = vec![0f32; m * n];
            let mut turn = 0;
            g.bench_function(format!("{m}_rows"), |b| {
                b.iter(|| {
                    turn = (turn + 1) % copies.len();
                    qmatmul_parallel(&acts, &copies[turn], &mut y, 64)
                })
            });
        }
        g.finish();
    }
}

fn smollm2() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("models-cache/SmolLM2-135M-Instruct.Q4_1.gguf");
    path.is_file().then_some(path)
}

/// The f32 target and the Q4_1 draft of SmolLM2, when the file is present.
fn real_models() -> Vec<(&'static str, Arc<LlamaWeights>)> {
    let Some(path) = smollm2() else { return Vec::new() };
    let files = ModelFiles::Gguf(path);
    let device = candle_core::Device::Cpu;
    [("smollm2_f32", WeightFormat::F32), ("smollm2_q4_1", WeightFormat::Stored)]
        .into_iter()
        .filter_map(|(name, f)| files.load(f, &device).ok().map(|(w, _)| (name, w)))
        .collect()
}

/// (c) 128 new tokens, plain against speculative for k = 2..6.
fn generation(c: &mut Criterion) {
    let ToyPair { target, draft } = MarkovModel::pair(512, 0.1, 3);
    let mut g = c.benchmark_group("generate_toy_128");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    let sampling = SamplingConfig::new(1.0).unwrap_or_default();
    g.bench_function("plain", |b| {
        let mut dec = PlainDecoder::new(target.clone(), sampling.clone()).max_new_tokens(128);
        b.iter(|| dec.generate(&[1, 2, 3]))
    });
    for k in 2..=6 {
        let Ok(mut dec) = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
            .k(k)
            .sampling(sampling.clone())
            .max_new_tokens(128)
            .build()
        else {
            continue;
        };
        g.bench_function(format!("spec_k{k}"), |b| b.iter(|| dec.generate(&[1, 2, 3])));
    }
    g.finish();

    let models = real_models();
    let (Some((_, target)), Some((_, draft))) = (models.first(), models.get(1)) else { return };
    let files = ModelFiles::Gguf(smollm2().unwrap_or_default());
    let Ok((_, tok)) = files.load(WeightFormat::Stored, &candle_core::Device::Cpu) else { return };
    let Ok(prompt) = tok.encode(&tok.chat_prompt("Write a short story about a lighthouse keeper.")) else { return };
    let mut g = c.benchmark_group("generate_smollm2_128");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("plain", |b| {
        let Ok(model) = Llama::new(target.clone()) else { return };
        let mut dec = PlainDecoder::new(model, SamplingConfig::greedy()).max_new_tokens(128);
        b.iter(|| dec.generate(&prompt))
    });
    for k in [2, 4, 6] {
        let (Ok(d), Ok(t)) = (Llama::new(draft.clone()), Llama::new(target.clone())) else { continue };
        let Ok(mut dec) = SpeculativeDecoder::builder(Pair { target: t, draft: d }).k(k).max_new_tokens(128).build()
        else {
            continue;
        };
        g.bench_function(format!("spec_k{k}"), |b| b.iter(|| dec.generate(&prompt)));
    }
    g.finish();
}

/// (d) Eight SmolLM2 sequences of 32 tokens: one after another (plain), and as one batch
/// (plain, fixed k = 2, adaptive): the batch's throughput against sequential decoding.
fn batches(c: &mut Criterion) {
    let models = real_models();
    let (Some((_, target)), Some((_, draft))) = (models.first(), models.get(1)) else { return };
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| vec![1, 100 + i, 200 + 3 * i, 300]).collect();
    let mut g = c.benchmark_group("batch_smollm2_8x32");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("sequential_plain", |b| {
        let Ok(model) = Llama::new(target.clone()) else { return };
        let mut dec = PlainDecoder::new(model, SamplingConfig::greedy()).max_new_tokens(32);
        b.iter(|| prompts.iter().map(|p| dec.generate(p).map(|g| g.tokens.len())).sum::<specdec::Result<usize>>())
    });
    // T(m) measured once, as a server would at start-up (not in every iteration).
    let Ok(mut probe) = Llama::new(target.clone()) else { return };
    let Ok(costs) = CostModel::measure(&mut probe, 1, 128) else { return };
    for policy in [KPolicy::Plain, KPolicy::Fixed(2), KPolicy::default()] {
        g.bench_function(format!("{policy:?}"), |b| {
            b.iter(|| -> specdec::Result<usize> {
                let mut batch = BatchDecoder::with_costs(policy, costs.clone())?;
                for p in &prompts {
                    let request = Request::new(p.clone()).max_new_tokens(32);
                    batch.add(
                        Pair { target: Llama::new(target.clone())?, draft: Llama::new(draft.clone())? },
                        request,
                    )?;
                }
                Ok(batch.run()?.len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, kernel_rows, rows_one_vs_many, quantized_rows, generation, batches);
criterion_main!(benches);
