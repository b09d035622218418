//! Batches: several sequences scored in one forward pass give the rows each would get alone;
//! the batch decoder's greedy output equals each sequence's plain decoding, whatever joins and
//! leaves; its sampled output follows the target's law per sequence (chi-square at 1e-6, with
//! a power check); bad input is a typed error and a failed step leaves the batch usable.

mod common;

use candle_core::Device;
use common::faulty::{Fault, Faulty};
use common::models::{model_path, STORIES};
use common::{assert_fits, assert_nudge_rejected, assert_rejects, cell, exact_window, nudged_past_the_limit, settings};
#[cfg(feature = "fault-injection")]
use specdec::batch::Fault as BatchFault;
use specdec::batch::{BatchDecoder, Request};
use specdec::toy::{MarkovModel, ToyPair};
use specdec::KPolicy;
use specdec::TokenModel;
use specdec::{
    Engine, Error, Llama, LlamaWeights, Logits, ModelFiles, Pair, PlainDecoder, Result, SamplingConfig, TargetModel,
    WeightFormat,
};
use std::sync::Arc;

fn stories(format: WeightFormat, engine: Engine) -> Result<Option<Arc<LlamaWeights>>> {
    let Some(path) = model_path(STORIES) else { return Ok(None) };
    Ok(Some(ModelFiles::Gguf(path).load_with(format, &Device::Cpu, engine)?.0))
}

const PROMPTS: [&[u32]; 4] = [&[1, 365, 176], &[1, 32, 470, 414, 2, 90], &[1, 129], &[1, 73, 74, 75, 76, 77, 78, 79]];

#[test]
fn batched_rows_equal_rows_scored_one_sequence_at_a_time() -> Result<()> {
    for engine in [Engine::Native, Engine::Candle] {
        for format in [WeightFormat::F32, "q8_0".parse()?, "q4_1".parse()?] {
            let Some(w) = stories(format, engine)? else { return Ok(()) };
            let mut batch: Vec<Llama> = (0..4).map(|_| Llama::new(w.clone())).collect::<Result<_>>()?;
            let mut alone: Vec<Llama> = (0..4).map(|_| Llama::new(w.clone())).collect::<Result<_>>()?;
            for (m, p) in batch.iter_mut().chain(alone.iter_mut()).zip(PROMPTS.iter().cycle()) {
                m.forward(p, 0)?;
            }
            // Two rounds: different lengths and row counts, then a roll-back and new tokens.
            let rounds: [[(&[u32], usize); 4]; 2] = [
                [(&[5], 1), (&[7, 8, 9], 3), (&[11, 12, 13, 14, 15], 2), (&[3, 4], 0)],
                [(&[20, 21], 2), (&[22], 1), (&[23, 24, 25], 3), (&[26], 1)],
            ];
            for (r, calls) in rounds.iter().enumerate() {
                if r == 1 {
                    for m in batch.iter_mut().chain(alone.iter_mut()) {
                        let len = m.context_len();
                        m.truncate(len - 1)?;
                    }
                }
                let mut refs: Vec<&mut Llama> = batch.iter_mut().collect();
                let got = Llama::forward_batch(&mut refs, calls)?;
                for ((m, &(tokens, rows)), g) in alone.iter_mut().zip(calls).zip(&got) {
                    let want = m.forward(tokens, rows)?;
                    assert_eq!(g.rows(), rows);
                    assert!(close(g, &want), "{engine:?} {format:?} round {r}");
                }
                for (b, a) in batch.iter().zip(&alone) {
                    assert_eq!(b.context_len(), a.context_len());
                }
            }
        }
    }
    Ok(())
}

fn close(a: &Logits, b: &Logits) -> bool {
    let scale = b.as_slice().iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    a.as_slice().len() == b.as_slice().len()
        && a.as_slice().iter().zip(b.as_slice()).all(|(x, y)| (x - y).abs() <= 1e-5 * scale)
}

#[test]
fn batched_calls_check_their_models() -> Result<()> {
    let Some(w) = stories(WeightFormat::F32, Engine::Native)? else { return Ok(()) };
    let Some(other) = stories(WeightFormat::F32, Engine::Native)? else { return Ok(()) };
    let (mut a, mut b) = (Llama::new(w.clone())?, Llama::new(other)?);
    let err = Llama::forward_batch(&mut [&mut a, &mut b], &[(&[1], 1), (&[1], 1)]);
    assert!(matches!(err, Err(Error::InvalidSetting { .. })), "{err:?}");
    let mut c = Llama::new(w)?;
    let err = Llama::forward_batch(&mut [&mut a, &mut c], &[(&[1], 1)]);
    assert!(matches!(err, Err(Error::InvalidSetting { .. })), "{err:?}");
    // A bad token in one call fails the batch and grows no context.
    let err = Llama::forward_batch(&mut [&mut a, &mut c], &[(&[1], 1), (&[1_000_000], 1)]);
    assert!(matches!(err, Err(Error::TokenOutOfRange { .. })), "{err:?}");
    assert_eq!((a.context_len(), c.context_len()), (0, 0));
    Ok(())
}

/// Each request's plain greedy output on its own.
fn plain_outputs(w: &Arc<LlamaWeights>, requests: &[Request]) -> Result<Vec<Vec<u32>>> {
    let mut out = Vec::new();
    for r in requests {
        let mut plain = PlainDecoder::new(Llama::new(w.clone())?, SamplingConfig::greedy())
            .max_new_tokens(r.stop.max_new_tokens)
            .stop_tokens(r.stop.stop_tokens.clone());
        out.push(plain.generate(&r.prompt)?.tokens);
    }
    Ok(out)
}

#[test]
fn greedy_batches_equal_plain_decoding_of_each_sequence() -> Result<()> {
    let Some(target) = stories(WeightFormat::F32, Engine::Native)? else { return Ok(()) };
    let Some(draft) = stories("q4_1".parse()?, Engine::Native)? else { return Ok(()) };
    let mut requests: Vec<Request> =
        PROMPTS.iter().zip([24, 37, 12, 30]).map(|(p, n)| Request::new(p.to_vec()).max_new_tokens(n)).collect();
    // One sequence stops at the token plain decoding emits sixth.
    let sixth = plain_outputs(&target, &requests[1..2])?[0][5];
    requests[1] = requests[1].clone().stop_tokens([sixth]);
    // One drafts a fixed 2 whatever the policy, one decodes plainly.
    requests[2] = requests[2].clone().k(2);
    requests.push(Request::new(PROMPTS[0].to_vec()).max_new_tokens(20).plain());
    let want = plain_outputs(&target, &requests)?;
    assert_eq!(want[1].len(), 6);
    for policy in [KPolicy::Plain, KPolicy::Fixed(3), KPolicy::Adaptive { max: 5 }] {
        let mut batch = BatchDecoder::new(policy)?;
        let mut ids = Vec::new();
        // Three join at once, two after a few steps (continuous batching).
        for (i, r) in requests.iter().enumerate() {
            if i == 3 {
                for _ in 0..3 {
                    batch.step()?;
                }
            }
            ids.push(
                batch
                    .add(Pair { target: Llama::new(target.clone())?, draft: Llama::new(draft.clone())? }, r.clone())?,
            );
        }
        let mut done = batch.run()?;
        assert_eq!(batch.active(), 0);
        done.sort_by_key(|f| f.id);
        assert_eq!(done.len(), requests.len());
        for ((f, want), id) in done.iter().zip(&want).zip(&ids) {
            assert_eq!(f.id, *id);
            assert_eq!(&f.generation.tokens, want, "{policy:?}, sequence {id:?}");
        }
        // Under the plain policy only the sequence with its own k = 2 drafts; k = 0 never does.
        let drafted: Vec<usize> = done.iter().map(|f| f.generation.stats.drafted).collect();
        assert!(drafted[2] > 0 && drafted[4] == 0, "{policy:?} drafted {drafted:?}");
        match policy {
            KPolicy::Plain => assert_eq!(drafted[0], 0),
            KPolicy::Fixed(_) => assert!(drafted[0] > 0),
            // On this tiny model a draft step costs about what a target pass does: the
            // policy may or may not draft.
            _ => {}
        }
    }
    Ok(())
}

const VOCAB: usize = 6;
const PROMPT: [u32; 3] = [2, 0, 5];
const SAMPLES: usize = 30_000;
/// Tokens per sequence: two windows of 3, at 0 and at 4.
const LEN: usize = 7;

/// Runs `SAMPLES` batches, each with one sequence per sampling setting drafting `ks[i]`
/// tokens (or as `policy` says), and counts windows 0..3 and 4..7 of each sequence; `fault`
/// injects a batch bug.
/// Without the `fault-injection` feature no fault can be named, so none is injected.
#[cfg(not(feature = "fault-injection"))]
#[derive(Debug, Clone, Copy)]
enum BatchFault {}

#[cfg(feature = "fault-injection")]
fn inject(batch: &mut BatchDecoder<MarkovModel, MarkovModel>, fault: BatchFault) {
    batch.inject_fault(fault);
}

#[cfg(not(feature = "fault-injection"))]
fn inject(_: &mut BatchDecoder<MarkovModel, MarkovModel>, fault: BatchFault) {
    match fault {}
}

fn batch_counts(
    target: &MarkovModel,
    draft: &MarkovModel,
    policy: KPolicy,
    ks: &[Option<usize>],
    fault: Option<BatchFault>,
) -> Result<(Vec<[Vec<u64>; 2]>, usize)> {
    let configs = settings()?;
    let mut counts = vec![[vec![0u64; VOCAB.pow(3)], vec![0u64; VOCAB.pow(3)]]; configs.len()];
    let mut batch = BatchDecoder::new(policy)?;
    if let Some(fault) = fault {
        inject(&mut batch, fault);
    }
    let mut drafted = 0;
    for n in 0..SAMPLES {
        for (i, ((_, cfg), k)) in configs.iter().zip(ks).enumerate() {
            let seed = (n * configs.len() + i) as u64;
            let mut r = Request::new(PROMPT.to_vec()).sampling(cfg.clone().with_seed(seed)).max_new_tokens(LEN);
            // A k of 0 here: the sequence's own plain steps.
            r.k = k.map(|k| if k == 0 { KPolicy::Plain } else { KPolicy::Fixed(k) });
            batch.add(Pair { target: target.clone(), draft: draft.clone() }, r)?;
        }
        for f in batch.run()? {
            let i = (f.id.0 as usize) % configs.len();
            counts[i][0][cell(&f.generation.tokens, 0, 3, VOCAB)] += 1;
            counts[i][1][cell(&f.generation.tokens, 4, 3, VOCAB)] += 1;
            drafted += f.generation.stats.drafted;
        }
    }
    Ok((counts, drafted))
}

#[test]
fn sampled_batches_follow_the_target_for_every_sequence() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 21);
    let draft = target.noisy_copy(0.6, 22);
    let configs = settings()?;
    // Each sequence with its own k (0 to 5); then the adaptive policy, two sequences keeping
    // a k of their own. (On these toy models a pass takes microseconds, so what the adaptive
    // policy picks follows timing noise: exactness must hold whatever it picks.)
    let runs = [
        (KPolicy::Fixed(3), vec![Some(0), Some(1), Some(3), Some(5)]),
        (KPolicy::Adaptive { max: 4 }, vec![None, Some(2), None, Some(4)]),
    ];
    for (policy, ks) in runs {
        let (counts, drafted) = batch_counts(&target, &draft, policy, &ks, None)?;
        assert!(drafted > 0, "{policy:?} drafted nothing");
        for ((name, cfg), c) in configs.iter().zip(&counts) {
            for (w, start) in [0, 4].into_iter().enumerate() {
                let exact = exact_window(&target, cfg, &PROMPT, start, 3);
                assert_fits(&format!("{policy:?}, {name}, tokens {start}.."), &c[w], &exact);
            }
        }
    }
    Ok(())
}

#[test]
fn batch_power_a_sequence_sampling_the_draft_is_rejected() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 21);
    let draft = target.noisy_copy(0.6, 22);
    // The bias: the batch verifies against the draft's law, not the target's.
    let (counts, _) = batch_counts(&draft, &draft, KPolicy::Fixed(2), &[None; 4], None)?;
    let (name, cfg) = &settings()?[0];
    let exact = exact_window(&target, cfg, &PROMPT, 0, 3);
    assert_rejects(&format!("draft as target, {name}"), &counts[0][0], &exact);
    Ok(())
}

/// Power near the detection limit of the batch battery (30,000 batches): every sequence's
/// target nudged until the first window's law (temperature 1) sits at twice the
/// noncentrality the test catches half the time (see `tests/exactness.rs`); the statistic
/// must reject it against the unnudged law.
#[test]
fn the_batch_battery_rejects_a_law_just_past_its_detection_limit() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 21);
    let (name, cfg) = settings()?.remove(0);
    let (nudged, eps, ratio) = nudged_past_the_limit(&target, &cfg, &PROMPT, 0, SAMPLES);
    assert!(ratio < 3.0 && eps < 0.05, "ε = {eps}, {ratio:.2} times the limit: not near the limit");
    let ks = [Some(3), Some(1), Some(2), Some(5)];
    let (counts, _) = batch_counts(&nudged, &target.noisy_copy(0.6, 22), KPolicy::Fixed(3), &ks, None)?;
    assert_nudge_rejected(&format!("batch, {name}"), &counts[0][0], (&target, &nudged), &cfg, &PROMPT);
    Ok(())
}

#[test]
fn bad_requests_are_typed_errors_and_a_failed_step_loses_nothing() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(8, 0.3, 1);
    assert!(matches!(
        BatchDecoder::<MarkovModel, MarkovModel>::new(KPolicy::Fixed(99)),
        Err(Error::InvalidSetting { .. })
    ));
    let mut batch = BatchDecoder::new(KPolicy::Fixed(2))?;
    let small = MarkovModel::random(4, 1, 3);
    assert!(matches!(
        batch.add(Pair { target: target.clone(), draft: small }, Request::new(vec![1])),
        Err(Error::VocabMismatch { .. })
    ));
    assert!(matches!(
        batch.add(Pair { target: target.clone(), draft: draft.clone() }, Request::new(vec![])),
        Err(Error::EmptyPrompt)
    ));
    let r = Request::new(vec![1]).stop_tokens([99]);
    assert!(matches!(
        batch.add(Pair { target: target.clone(), draft: draft.clone() }, r),
        Err(Error::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        batch.add(Pair { target: target.clone(), draft: draft.clone() }, Request::new(vec![1]).k(65)),
        Err(Error::InvalidSetting { .. })
    ));
    assert_eq!(batch.active(), 0);

    // The second sequence's target fails on its fourth call (prefill, then steps): that step
    // fails, every sequence keeps its tokens, and the next steps finish both as if nothing
    // had happened (greedy output equals a batch that never failed).
    let run = |fail_at: usize| -> Result<(Vec<Vec<u32>>, usize)> {
        let mut batch = BatchDecoder::new(KPolicy::Fixed(2))?;
        let mut errors = 0;
        for (i, p) in [[1u32, 2], [3, 4]].iter().enumerate() {
            let fails =
                |inner: &MarkovModel, at| Faulty { inner: inner.clone(), calls: 0, fail_at: at, fault: Fault::Fails };
            let t = fails(&target, if i == 1 { fail_at } else { 0 });
            batch.add(Pair { target: t, draft: fails(&draft, 0) }, Request::new(p.to_vec()).max_new_tokens(15))?;
        }
        while batch.active() > 0 {
            match batch.step() {
                Ok(_) => {}
                Err(Error::InvalidSetting { .. }) => errors += 1,
                Err(e) => return Err(e),
            }
        }
        let mut done = batch.take_finished();
        done.sort_by_key(|f| f.id);
        Ok((done.into_iter().map(|f| f.generation.tokens).collect(), errors))
    };
    let (clean, none) = run(0)?;
    let (recovered, one) = run(4)?;
    assert_eq!((none, one), (0, 1));
    assert_eq!(clean, recovered);
    Ok(())
}

/// A batch bug, injected: the batched pass hands sequence 0 the rows of sequence 1 and back
/// (whenever the two calls have as many rows).
#[derive(Clone)]
struct Swapping(MarkovModel);

impl TokenModel for Swapping {
    fn vocab_size(&self) -> usize {
        self.0.vocab()
    }

    fn context_len(&self) -> usize {
        self.0.context_len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        TokenModel::truncate(&mut self.0, len)
    }
}

impl TargetModel for Swapping {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<Logits> {
        self.0.forward(tokens, rows)
    }

    fn forward_batch(models: &mut [&mut Self], calls: &[(&[u32], usize)]) -> Result<Vec<Logits>> {
        let mut out: Vec<Logits> = models
            .iter_mut()
            .zip(calls)
            .map(|(m, &(tokens, rows))| m.0.forward(tokens, rows))
            .collect::<Result<_>>()?;
        if out.len() >= 2 && out[0].rows() == out[1].rows() {
            out.swap(0, 1);
        }
        Ok(out)
    }
}

/// Each prompt's plain greedy decoding by the toy `target`, `n` tokens.
fn plain_greedy(target: &MarkovModel, prompts: &[Vec<u32>], n: usize) -> Result<Vec<Vec<u32>>> {
    let plain =
        |p: &Vec<u32>| PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(n).generate(p);
    prompts.iter().map(|p| Ok(plain(p)?.tokens)).collect()
}

#[test]
fn batch_power_swapped_rows_are_caught_by_greedy_equality() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 21);
    let draft = target.noisy_copy(0.6, 22);
    let prompts = [vec![2, 0, 5], vec![1, 4, 3]];
    let plain = plain_greedy(&target, &prompts, 12)?;
    for policy in [KPolicy::Plain, KPolicy::Fixed(2)] {
        let mut batch = BatchDecoder::new(policy)?;
        for p in &prompts {
            batch.add(
                Pair { target: Swapping(target.clone()), draft: draft.clone() },
                Request::new(p.clone()).max_new_tokens(12),
            )?;
        }
        let mut done = batch.run()?;
        done.sort_by_key(|f| f.id);
        let got: Vec<Vec<u32>> = done.into_iter().map(|f| f.generation.tokens).collect();
        assert_ne!(got, plain, "{policy:?}: swapped rows went unnoticed");
    }
    Ok(())
}

#[test]
#[cfg(feature = "fault-injection")] // Run by .ci/run with the feature.
fn batch_power_a_stale_q_row_after_a_join_is_rejected() -> Result<()> {
    // The bug: at the first step after sequences join or leave, a first draft is judged with
    // the q row its slot held the step before, not the row it was drawn from. Every batch
    // here starts with four new sequences, and they leave at different steps.
    let target = MarkovModel::random(VOCAB, 2, 21);
    let draft = target.noisy_copy(0.6, 22);
    let ks = [Some(1), Some(2), Some(3), Some(5)];
    let (name, cfg) = &settings()?[0];
    let exact = exact_window(&target, cfg, &PROMPT, 0, 3);
    let (counts, _) = batch_counts(&target, &draft, KPolicy::Fixed(3), &ks, None)?;
    assert_fits(&format!("no fault, {name}"), &counts[0][0], &exact);
    let (counts, _) = batch_counts(&target, &draft, KPolicy::Fixed(3), &ks, Some(BatchFault::StaleQ))?;
    assert_rejects(&format!("stale q, {name}"), &counts[0][0], &exact);
    Ok(())
}

/// The tokens of sampled requests decoded in one batch under `policy` (with `fault`), by
/// request.
fn batched(
    requests: &[Request],
    target: &MarkovModel,
    draft: &MarkovModel,
    policy: KPolicy,
    fault: Option<BatchFault>,
) -> Result<Vec<Vec<u32>>> {
    let mut batch = BatchDecoder::new(policy)?;
    if let Some(fault) = fault {
        inject(&mut batch, fault);
    }
    for r in requests {
        batch.add(Pair { target: target.clone(), draft: draft.clone() }, r.clone())?;
    }
    let mut done = batch.run()?;
    done.sort_by_key(|f| f.id);
    Ok(done.into_iter().map(|f| f.generation.tokens).collect())
}

/// Three sampled requests with seeds of their own, at temperature 1, top-k and top-p.
fn seeded_requests() -> Result<Vec<Request>> {
    let configs = settings()?;
    Ok((0..3)
        .map(|i| {
            let cfg = configs[i % configs.len()].1.clone().with_seed(40 + i as u64);
            Request::new(vec![2, i as u32, 5]).sampling(cfg).max_new_tokens(30)
        })
        .collect())
}

#[test]
fn a_seeded_sequence_samples_the_same_alone_or_in_a_batch() -> Result<()> {
    // Each sequence has its own generator, seeded by its request: with a fixed k, what it
    // samples does not depend on the other sequences of its batch.
    let target = MarkovModel::random(VOCAB, 2, 21);
    let draft = target.noisy_copy(0.3, 22);
    let requests = seeded_requests()?;
    for policy in [KPolicy::Plain, KPolicy::Fixed(3)] {
        let together = batched(&requests, &target, &draft, policy, None)?;
        for (r, got) in requests.iter().zip(&together) {
            let alone = batched(std::slice::from_ref(r), &target, &draft, policy, None)?;
            assert_eq!(&alone[0], got, "{policy:?}: a sequence sampled differently beside others");
        }
    }
    Ok(())
}

#[test]
#[cfg(feature = "fault-injection")] // Run by .ci/run with the feature.
fn batch_power_a_shared_rng_is_caught_by_seeded_output() -> Result<()> {
    // A generator shared by the batch leaves each sequence's law intact (its draws are still
    // independent uniforms), so no chi-square sees it; seeded output does.
    let target = MarkovModel::random(VOCAB, 2, 21);
    let draft = target.noisy_copy(0.3, 22);
    let requests = seeded_requests()?;
    for policy in [KPolicy::Plain, KPolicy::Fixed(3)] {
        let alone: Vec<Vec<u32>> = (requests.iter())
            .map(|r| Ok(batched(std::slice::from_ref(r), &target, &draft, policy, None)?.remove(0)))
            .collect::<Result<_>>()?;
        let shared = batched(&requests, &target, &draft, policy, Some(BatchFault::SharedRng))?;
        assert_ne!(shared, alone, "{policy:?}: a shared generator went unnoticed");
    }
    Ok(())
}

#[test]
#[cfg(feature = "fault-injection")] // Run by .ci/run with the feature.
fn batch_power_a_roll_back_on_the_wrong_cache_is_caught_by_greedy_equality() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 21);
    let draft = target.noisy_copy(0.6, 22);
    let prompts = [vec![2, 0, 5], vec![1, 4, 3], vec![3, 3, 1]];
    let requests: Vec<Request> = prompts.iter().map(|p| Request::new(p.clone()).max_new_tokens(12)).collect();
    let plain = plain_greedy(&target, &prompts, 12)?;
    assert_eq!(batched(&requests, &target, &draft, KPolicy::Fixed(2), None)?, plain);
    // Wrong output or a failed step (a model asked to roll back past its end): either way caught.
    let faulty = batched(&requests, &target, &draft, KPolicy::Fixed(2), Some(BatchFault::WrongRollBack));
    eprintln!("roll-back on the wrong cache: {faulty:?}");
    assert!(faulty.map_or(true, |got| got != plain), "a roll-back on the wrong cache went unnoticed");
    Ok(())
}

#[test]
fn calibration_is_an_explicit_call_and_otherwise_the_passes_measure() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(16, 0.2, 7);
    let mut batch = BatchDecoder::new(KPolicy::default())?;
    // Nothing to time without a sequence; a sequence's first step would time it.
    batch.calibrate()?;
    assert_eq!(batch.costs().target_secs(1), None);
    batch.add(Pair { target: target.clone(), draft: draft.clone() }, Request::new(vec![1, 2]).max_new_tokens(8))?;
    batch.calibrate()?;
    let t1 = batch.costs().target_secs(1);
    assert!(t1.is_some(), "T(1) measured by the explicit call");
    // The target was rolled back to its prompt: the generation runs as usual.
    let done = batch.run()?;
    assert_eq!(done[0].generation.tokens.len(), 8);
    // Without the call, the first adaptive step's own pass measures it (as the single decoder's
    // first round does), and nothing else is timed.
    let mut lazy = BatchDecoder::new(KPolicy::default())?;
    lazy.add(Pair { target, draft }, Request::new(vec![1, 2]).max_new_tokens(8))?;
    lazy.step()?;
    assert!(lazy.costs().target_secs(1).is_some());
    Ok(())
}

#[test]
fn the_first_adaptive_step_times_the_draft_with_one_sequence_s_token() -> Result<()> {
    // A draft equal to its target: every drafted token is accepted, so a step of k drafts
    // emits k + 1 tokens. One sequence drafts one token to time the draft for the batch (the
    // one with least to catch up on, the first on a tie); the others step plainly rather than
    // each catching its draft up on its prompt to time the same call.
    let ToyPair { target, draft } = MarkovModel::pair(16, 0.0, 9);
    let mut batch = BatchDecoder::new(KPolicy::default())?;
    for prompt in [vec![1, 2], vec![3], vec![4, 5]] {
        batch.add(Pair { target: target.clone(), draft: draft.clone() }, Request::new(prompt).max_new_tokens(20))?;
    }
    assert!(!batch.costs().has_any_draft());
    let first = batch.step()?;
    let lens: Vec<usize> = first.iter().map(|(_, new)| new.len()).collect();
    assert_eq!(lens, [2, 1, 1], "one drafted token and the bonus, then plain steps: {first:?}");
    assert!(batch.costs().has_any_draft(), "the draft call was timed");
    Ok(())
}

/// A request's own rounds are fixed or plain; anything else is refused when it is added.
#[test]
fn a_requests_own_k_is_fixed_or_plain() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 21);
    let mut batch = BatchDecoder::new(KPolicy::Fixed(3))?;
    let mut r = Request::new(PROMPT.to_vec()).max_new_tokens(4);
    r.k = Some(KPolicy::Adaptive { max: 4 });
    let refused = batch.add(Pair { target: target.clone(), draft: target.noisy_copy(0.6, 22) }, r);
    assert!(matches!(refused, Err(specdec::Error::InvalidSetting { .. })), "{refused:?}");
    let plain = Request::new(PROMPT.to_vec()).max_new_tokens(4).plain();
    batch.add(Pair { target: target.clone(), draft: target.noisy_copy(0.6, 22) }, plain)?;
    let done = batch.run()?;
    assert_eq!((done.len(), done[0].generation.stats.drafted), (1, 0), "plain steps draft nothing");
    Ok(())
}
