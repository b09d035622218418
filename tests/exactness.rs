//! Statistical proof that speculative decoding samples the target's distribution: Monte Carlo
//! goodness of fit at significance 1e-6 with fixed seeds, for single steps and for whole
//! sequences produced by `SpeculativeDecoder`, under every sampling setting and drafter kind;
//! plus power checks showing the same statistic rejects deliberately biased samplers.

mod common;

use common::{
    assert_fits, assert_nudge_rejected, assert_rejects, cell, check_windows, detection_limit, exact_window,
    nudged_past_the_limit, processed_row, reference_law, settings, window_counts, SIGNIFICANCE,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use specdec::kernel::{self, DraftRow, Judgement};
use specdec::sampling::sample;
use specdec::toy::{MarkovModel, PointDraft, ToyPair};
use specdec::{DraftModel, Pair, Proposal, Result, SamplingConfig, SpeculativeDecoder, TokenModel};

const P: [f32; 6] = [0.40, 0.25, 0.15, 0.10, 0.07, 0.03];
const Q: [f32; 6] = [0.10, 0.10, 0.30, 0.30, 0.15, 0.05];

/// One speculative step on the seed's (p, q): draft from q, judge, count the emitted token.
fn single_step_counts(n: usize, seed: u64, wrong_residual: bool) -> Result<(Vec<u64>, u64)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut counts, mut accepted) = (vec![0u64; P.len()], 0u64);
    for _ in 0..n {
        let t = sample(&Q, &mut rng)?;
        let token = match kernel::judge(&P, DraftRow::Dense(&Q), t, &mut rng)? {
            Judgement::Accept => {
                accepted += 1;
                t
            }
            // The classic bug: resample from p instead of the residual.
            Judgement::Reject(_) if wrong_residual => sample(&P, &mut rng)?,
            Judgement::Reject(r) => r,
        };
        counts[token as usize] += 1;
    }
    Ok((counts, accepted))
}

fn p64() -> Vec<f64> {
    P.iter().map(|&p| p as f64).collect()
}

#[test]
fn single_step_emits_p() -> Result<()> {
    let n = 200_000;
    let (counts, accepted) = single_step_counts(n, 11, false)?;
    assert_fits("single step", &counts, &p64());
    // Acceptance is Binomial(n, Σ min(p, q) = 0.55): 5.3 standard deviations is a 1e-7 two-sided tail.
    let alpha = kernel::acceptance_rate(&P, &Q);
    assert!((alpha - 0.55).abs() < 1e-6);
    let sd = (n as f64 * alpha * (1.0 - alpha)).sqrt();
    assert!((accepted as f64 - n as f64 * alpha).abs() < 5.3 * sd, "accepted {accepted} of {n}");
    Ok(())
}

#[test]
fn single_step_power_resampling_from_p_is_rejected() -> Result<()> {
    let (counts, _) = single_step_counts(200_000, 11, true)?;
    assert_rejects("resample from p", &counts, &p64());
    Ok(())
}

/// Power near the detection limit: the accept test reads q(2) 7 % too high (the draft still
/// samples from the true q). The emitted law then moves by a noncentrality
/// λ = n·Σ (e − p)²/p ≈ 86 at n = 200,000; Pearson's statistic on 5 degrees of freedom
/// (critical value 35.9 at 1e-6) catches a shift half the time from λ = 31.9, that is from a
/// misread of about 4.5 %. So the single-step battery sees draft-probability errors of a few
/// percent.
#[test]
fn single_step_power_a_draft_probability_misread_by_7_percent_is_rejected() -> Result<()> {
    let n = 200_000;
    let mut misread = Q;
    misread[2] *= 1.07;
    // The law this bug emits: t ~ q stands with a(t) = min(1, p(t)/q'(t)), else the residual
    // max(0, p − q') (q' the misread row, normalized) is drawn.
    let total: f64 = misread.iter().map(|&x| x as f64).sum();
    let q_read: Vec<f64> = misread.iter().map(|&x| x as f64 / total).collect();
    let accept: Vec<f64> = p64().iter().zip(&q_read).map(|(p, q)| (p / q).min(1.0)).collect();
    let reject: f64 = Q.iter().zip(&accept).map(|(&q, a)| q as f64 * (1.0 - a)).sum();
    let residual: Vec<f64> = p64().iter().zip(&q_read).map(|(p, q)| (p - q).max(0.0)).collect();
    let mass: f64 = residual.iter().sum();
    let emitted: Vec<f64> = (0..6).map(|s| Q[s] as f64 * accept[s] + reject * residual[s] / mass).collect();
    let lambda: f64 = emitted.iter().zip(p64()).map(|(e, p)| n as f64 * (e - p).powi(2) / p).sum();
    assert!((60.0..120.0).contains(&lambda), "λ = {lambda:.1}: no longer near the detection limit");
    let mut rng = StdRng::seed_from_u64(12);
    let mut counts = vec![0u64; P.len()];
    for _ in 0..n {
        let t = sample(&Q, &mut rng)?;
        let token = match kernel::judge(&P, DraftRow::Dense(&misread), t, &mut rng)? {
            Judgement::Accept => t,
            Judgement::Reject(r) => r,
        };
        counts[token as usize] += 1;
    }
    assert_rejects("q(2) misread by 7 %", &counts, &p64());
    Ok(())
}

#[test]
fn single_step_power_mismatched_draft_processing_is_rejected() -> Result<()> {
    // The draft samples from its tempered row but the accept test sees the untempered one.
    let cfg = SamplingConfig::new(0.5)?;
    let logits = |r: &[f32]| r.iter().map(|p| p.ln()).collect::<Vec<f32>>();
    let (mut p_t, mut q_t) = (Vec::new(), Vec::new());
    cfg.probs(&logits(&P), &mut p_t)?;
    cfg.probs(&logits(&Q), &mut q_t)?;
    let mut rng = StdRng::seed_from_u64(5);
    let mut counts = vec![0u64; P.len()];
    for _ in 0..200_000 {
        let t = sample(&q_t, &mut rng)?;
        let token = match kernel::judge(&p_t, DraftRow::Dense(&Q), t, &mut rng)? {
            Judgement::Accept => t,
            Judgement::Reject(r) => r,
        };
        counts[token as usize] += 1;
    }
    let target: Vec<f64> = p_t.iter().map(|&p| p as f64).collect();
    assert_rejects("draft tempered, judged untempered", &counts, &target);
    Ok(())
}

/// A draft limited to part of the vocabulary (as `Llama::limit_output` makes one) samples
/// from its row with the other tokens at zero, and must be judged by that row: judged by its
/// whole row, the tokens it cannot propose are under-emitted. 200,000 steps each.
#[test]
fn single_step_a_draft_over_part_of_the_vocabulary_emits_p_judged_by_its_own_row() -> Result<()> {
    let keep = [true, false, true, true, false, true];
    let mass: f32 = Q.iter().zip(keep).filter(|(_, k)| *k).map(|(q, _)| q).sum();
    let part: Vec<f32> = Q.iter().zip(keep).map(|(&q, k)| if k { q / mass } else { 0.0 }).collect();
    for (judged_by, biased) in [(&part[..], false), (&Q[..], true)] {
        let mut rng = StdRng::seed_from_u64(13);
        let mut counts = vec![0u64; P.len()];
        for _ in 0..200_000 {
            let t = sample(&part, &mut rng)?;
            let token = match kernel::judge(&P, DraftRow::Dense(judged_by), t, &mut rng)? {
                Judgement::Accept => t,
                Judgement::Reject(r) => r,
            };
            counts[token as usize] += 1;
        }
        match biased {
            false => assert_fits("a draft over part of the vocabulary", &counts, &p64()),
            true => assert_rejects("judged by the whole row", &counts, &p64()),
        }
    }
    Ok(())
}

const VOCAB: usize = 6;
const PROMPT: [u32; 3] = [2, 0, 5];
const SAMPLES: usize = 60_000;

/// Generates `SAMPLES` sequences of k + 3 tokens and checks the joint distribution of the first
/// three tokens and of the three tokens starting at position k (which straddle the end of the
/// first block, its bonus token and the second round after a roll-back).
fn check_sequences<D: DraftModel>(
    name: &str,
    draft: D,
    target: &MarkovModel,
    cfg: &SamplingConfig,
    k: usize,
) -> Result<()> {
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
        .k(k)
        .sampling(cfg.clone())
        .seed(1000 + k as u64)
        .max_new_tokens(k + 3)
        .build()?;
    let what = format!("{name}, k = {k}");
    let stats = check_windows(&what, &mut dec, target, cfg, &PROMPT, k, SAMPLES)?;
    // A decoder that stopped drafting, or rejected (or accepted) every draft, would pass the
    // windows as plain decoding: each case must draft and see both outcomes.
    assert!(stats.drafted >= SAMPLES / 4, "{what}: drafted too little: {stats:?}");
    assert!(stats.accepted > 0 && stats.rejections > 0, "{what}: one outcome never seen: {stats:?}");
    Ok(())
}

fn toy_target() -> MarkovModel {
    MarkovModel::random(VOCAB, 2, 21)
}

#[test]
fn sequences_with_a_sampled_draft_follow_the_target() -> Result<()> {
    let target = toy_target();
    let draft = target.noisy_copy(0.6, 22);
    for (name, cfg) in settings()? {
        for k in [1, 2, 4, 7] {
            check_sequences(name, draft.clone(), &target, &cfg, k)?;
        }
    }
    Ok(())
}

#[test]
fn sequences_with_a_point_mass_draft_follow_the_target() -> Result<()> {
    let target = toy_target();
    // Proposes the noisy model's argmax when it is at least 30 % likely, else nothing.
    let draft = PointDraft::new(target.noisy_copy(0.6, 23), 0.3);
    for (name, cfg) in settings()? {
        for k in [1, 2, 4, 7] {
            check_sequences(&format!("point mass, {name}"), draft.clone(), &target, &cfg, k)?;
        }
    }
    Ok(())
}

/// A draft that scores only some tokens, the rest −∞, as a model draft limited to part of its
/// vocabulary does (`Llama::limit_output`): the tokens it cannot propose come from the residual.
#[derive(Debug, Clone)]
struct PartDraft {
    model: MarkovModel,
    keep: [bool; VOCAB],
}

impl TokenModel for PartDraft {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn context_len(&self) -> usize {
        self.model.context_len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.model.truncate(len)
    }
}

impl DraftModel for PartDraft {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        Ok(match self.model.propose(tokens)? {
            Proposal::Logits(mut row) => {
                row.iter_mut().zip(self.keep).filter(|(_, k)| !k).for_each(|(x, _)| *x = f32::NEG_INFINITY);
                Proposal::Logits(row)
            }
            other => other,
        })
    }
}

#[test]
fn sequences_with_a_draft_over_part_of_the_vocabulary_follow_the_target() -> Result<()> {
    let target = toy_target();
    let draft = PartDraft { model: target.noisy_copy(0.6, 24), keep: [true, false, true, true, false, true] };
    for (name, cfg) in settings()? {
        for k in [1, 3] {
            check_sequences(&format!("part of the vocabulary, {name}"), draft.clone(), &target, &cfg, k)?;
        }
    }
    Ok(())
}

/// A deliberately wrong speculative loop on an order-1 toy model: on rejection it resamples
/// from p instead of the residual. The same sequence statistic must reject it.
#[test]
fn sequence_power_resampling_from_p_is_rejected() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 1, 31);
    let draft = target.noisy_copy(0.6, 32);
    let cfg = SamplingConfig::new(1.0)?;
    let mut rng = StdRng::seed_from_u64(33);
    let mut counts = vec![0u64; VOCAB.pow(3)];
    for _ in 0..SAMPLES {
        let mut ctx = PROMPT.to_vec();
        while ctx.len() < PROMPT.len() + 3 {
            let mut drafted = ctx.clone();
            for _ in 0..2 {
                let q = processed_row(&draft, &cfg, &drafted);
                let r: f64 = rng.random();
                let t = q
                    .iter()
                    .scan(0.0, |acc, &x| {
                        *acc += x;
                        Some(*acc)
                    })
                    .position(|c| r < c)
                    .unwrap_or(VOCAB - 1);
                drafted.push(t as u32);
            }
            for i in ctx.len()..drafted.len() {
                let (p, q) = (processed_row(&target, &cfg, &drafted[..i]), processed_row(&draft, &cfg, &drafted[..i]));
                let t = drafted[i] as usize;
                if rng.random::<f64>() < (p[t] / q[t]).min(1.0) {
                    ctx.push(t as u32);
                } else {
                    let p32: Vec<f32> = p.iter().map(|&x| x as f32).collect();
                    ctx.push(sample(&p32, &mut rng)?);
                    break;
                }
            }
        }
        counts[cell(&ctx, PROMPT.len(), 3, VOCAB)] += 1;
    }
    assert_rejects("sequence, resample from p", &counts, &exact_window(&target, &cfg, &PROMPT, 0, 3));
    Ok(())
}

/// Power near the detection limit of the sequence battery (60,000 generations, windows of
/// 216 cells, 133 degrees of freedom after pooling): the same decoder, draft and k, but the
/// target's rows nudged just far enough (ε ≈ 0.2 % toward random rows) that the law of the
/// first window sits at twice the noncentrality the test catches half the time (λ ≈ 190
/// against a limit of 93; a total variation of 0.7 points; power 99.98 %). The statistic must
/// reject it against the unnudged target's law. So a bug that moves the emitted law by about
/// that much is caught.
#[test]
fn sequence_power_a_law_just_past_the_detection_limit_is_rejected() -> Result<()> {
    let target = toy_target();
    let cfg = SamplingConfig::new(1.0)?;
    let (nudged, eps, ratio) = nudged_past_the_limit(&target, &cfg, &PROMPT, 0, SAMPLES);
    assert!(ratio < 3.0 && eps < 0.05, "ε = {eps}, {ratio:.2} times the limit: not near the limit");
    let draft = target.noisy_copy(0.6, 22);
    let mut dec = SpeculativeDecoder::builder(Pair { target: nudged.clone(), draft })
        .k(4)
        .sampling(cfg.clone())
        .seed(1100)
        .build()?;
    let (counts, _) = window_counts(&mut dec, VOCAB, &PROMPT, 4, SAMPLES)?;
    assert_nudge_rejected("sequences, k = 4", &counts[0], (&target, &nudged), &cfg, &PROMPT);
    Ok(())
}

/// [`detection_limit`] against a simulation: Pearson's statistic for `df + 1` cells is a sum of
/// `df` squared normals; shifting one mean by √λ at the computed limit must exceed the critical
/// value about half the time.
#[test]
fn the_detection_limit_is_where_the_statistic_rejects_half_the_time() {
    let mut rng = StdRng::seed_from_u64(8);
    let mut normal = || {
        let (u, v): (f64, f64) = (rng.random(), rng.random());
        (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    };
    assert!((detection_limit(5) - 31.9).abs() < 0.5, "{}", detection_limit(5));
    for df in [5, 60, 215] {
        let (lambda, critical) = (detection_limit(df), chi_critical(df));
        let trials = 4_000;
        let rejected = (0..trials)
            .filter(|_| {
                let first = (normal() + lambda.sqrt()).powi(2);
                first + (1..df).map(|_| normal().powi(2)).sum::<f64>() > critical
            })
            .count();
        let rate = rejected as f64 / trials as f64;
        assert!((0.45..0.55).contains(&rate), "{df} df: rejected {rate:.3} at λ = {lambda:.1}");
    }
}

/// The critical value of Pearson's statistic on `df` degrees of freedom at [`SIGNIFICANCE`].
fn chi_critical(df: usize) -> f64 {
    use statrs::distribution::{ChiSquared, ContinuousCDF};
    ChiSquared::new(df as f64).map(|d| d.inverse_cdf(1.0 - SIGNIFICANCE)).unwrap_or(f64::INFINITY)
}

/// The joint of the first three tokens also passes on an order-1 pair like the seed's.
#[test]
fn sequences_on_the_seed_style_pair_follow_the_target() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(VOCAB, 0.6, 41);
    check_sequences("seed-style pair", draft, &target, &SamplingConfig::new(1.0)?, 3)
}

/// `SamplingConfig::probs` against the test's own reference law, on random rows with few
/// distinct logits (ties at the top-k and top-p cuts) and masked tokens, for greedy and four
/// temperatures with and without top-k and top-p. The batteries take their expected laws from
/// the reference, so they check the settings' semantics, not only "speculative equals plain".
#[test]
fn sampling_settings_match_an_independent_reference_law() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(5);
    for case in 0..3_000 {
        let n = rng.random_range(1..12usize);
        let logits: Vec<f32> = (0..n)
            .map(|_| if rng.random_bool(0.1) { f32::NEG_INFINITY } else { rng.random_range(0..4u32) as f32 * 0.5 })
            .collect();
        if logits.iter().all(|&x| x == f32::NEG_INFINITY) {
            continue;
        }
        let mut cfg = SamplingConfig::new([0.0, 0.3, 0.7, 1.0, 1.5][case % 5])?;
        if rng.random_bool(0.5) {
            cfg = cfg.with_top_k(rng.random_range(1..=n))?;
        }
        if rng.random_bool(0.5) {
            cfg = cfg.with_top_p(rng.random_range(0.05..1.0f32))?;
        }
        let want = reference_law(&logits, &cfg);
        let mut got = Vec::new();
        cfg.probs(&logits, &mut got)?;
        let total: f64 = got.iter().map(|&p| p as f64).sum();
        for (i, (&w, &g)) in want.iter().zip(&got).enumerate() {
            let g = g as f64 / total;
            let what = format!("case {case}, token {i}: {logits:?}, {cfg:?}: {want:?} vs {got:?}");
            assert_eq!(w > 0.0, g > 0.0, "support differs: {what}");
            assert!((w - g).abs() < 1e-5, "{what}");
        }
    }
    Ok(())
}
