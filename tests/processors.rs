//! Logits processors under speculation: the speculative law with penalties, logit bias, banned
//! tokens and min-p equals the processed target law, enumerated here apart from the crate's own
//! code (chi-square at 1e-6, chains, coupled sampling, point-mass drafts, batches and trees,
//! each node processed for its own path), with a power check near the detection limit; a custom
//! processor's cached state follows the history through rejected rounds; bad settings are
//! typed errors and a failing processor leaves the decoder usable.

mod common;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{assert_fits, assert_rejects, detection_limit, noncentrality, power};
use specdec::batch::{BatchDecoder, Request};
use specdec::sampling::{Counts, History, LogitsProcessor};
use specdec::toy::{MarkovModel, PointDraft};
use specdec::{
    DraftModel, Error, KPolicy, Pair, PlainDecoder, Result, SamplingConfig, SpeculativeDecoder, TargetModel,
    TreeBudget, TreePolicy,
};

const VOCAB: usize = 6;
const PROMPT: [u32; 3] = [2, 0, 2];
const SAMPLES: usize = 20_000;

/// The built-ins as their definitions say, for the reference law.
#[derive(Debug, Clone, Copy, Default)]
struct Spec {
    temperature: f64,
    repetition: f64,
    presence: f64,
    frequency: f64,
    bias: Option<(u32, f64)>,
    banned: Option<u32>,
    min_p: f64,
}

impl Spec {
    fn config(&self) -> Result<SamplingConfig> {
        let mut cfg = SamplingConfig::new(self.temperature as f32)?
            .with_repetition_penalty(self.repetition as f32)?
            .with_presence_penalty(self.presence as f32)?
            .with_frequency_penalty(self.frequency as f32)?
            .with_min_p(self.min_p as f32)?;
        if let Some((t, b)) = self.bias {
            cfg = cfg.with_logit_bias(t, b as f32)?;
        }
        if let Some(t) = self.banned {
            cfg = cfg.with_banned([t]);
        }
        Ok(cfg)
    }

    /// The law after `generated` (the prompt before it), in f64: repetition over prompt and
    /// output, presence and frequency over the output, bias, bans, temperature, min-p.
    fn law(&self, target: &MarkovModel, generated: &[u32]) -> Vec<f64> {
        let ctx: Vec<u32> = PROMPT.iter().chain(generated).copied().collect();
        let mut x: Vec<f64> = target.next_probs(&ctx).iter().map(|&p| (p as f64).ln()).collect();
        for (t, v) in x.iter_mut().enumerate() {
            let seen = ctx.contains(&(t as u32));
            let count = generated.iter().filter(|&&g| g as usize == t).count() as f64;
            if seen && self.repetition != 1.0 {
                *v = if *v > 0.0 { *v / self.repetition } else { *v * self.repetition };
            }
            if count > 0.0 {
                *v -= self.presence + self.frequency * count;
            }
        }
        if let Some((t, b)) = self.bias {
            x[t as usize] += b;
        }
        if let Some(t) = self.banned {
            x[t as usize] = f64::NEG_INFINITY;
        }
        let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut w: Vec<f64> = x.iter().map(|&v| ((v - max) / self.temperature).exp()).collect();
        for v in &mut w {
            if *v < self.min_p {
                *v = 0.0;
            }
        }
        let total: f64 = w.iter().sum();
        w.iter().map(|v| v / total).collect()
    }

    /// The law of the first three generated tokens, cell `a·V² + b·V + c`.
    fn window(&self, target: &MarkovModel) -> Vec<f64> {
        let mut out = vec![0.0; VOCAB.pow(3)];
        let first = self.law(target, &[]);
        for (a, &pa) in first.iter().enumerate().filter(|(_, &p)| p > 0.0) {
            let second = self.law(target, &[a as u32]);
            for (b, &pb) in second.iter().enumerate().filter(|(_, &p)| p > 0.0) {
                let third = self.law(target, &[a as u32, b as u32]);
                for (c, &pc) in third.iter().enumerate() {
                    out[(a * VOCAB + b) * VOCAB + c] += pa * pb * pc;
                }
            }
        }
        out
    }
}

fn specs() -> Vec<(&'static str, Spec)> {
    let base = Spec { temperature: 1.0, repetition: 1.0, ..Spec::default() };
    vec![
        ("repetition 1.6", Spec { repetition: 1.6, ..base }),
        ("presence 0.9, frequency 0.6", Spec { presence: 0.9, frequency: 0.6, ..base }),
        ("bias +1.5 on 1, banned 3", Spec { bias: Some((1, 1.5)), banned: Some(3), ..base }),
        ("min-p 0.3, temperature 0.8", Spec { min_p: 0.3, temperature: 0.8, ..base }),
        (
            "all at once",
            Spec {
                repetition: 1.3,
                presence: 0.5,
                frequency: 0.3,
                bias: Some((4, -1.0)),
                banned: Some(0),
                min_p: 0.05,
                temperature: 0.9,
            },
        ),
    ]
}

fn cell(tokens: &[u32]) -> usize {
    (tokens[0] as usize * VOCAB + tokens[1] as usize) * VOCAB + tokens[2] as usize
}

fn counts_of<T: TargetModel, D: DraftModel>(dec: &mut SpeculativeDecoder<T, D>) -> Result<(Vec<u64>, usize)> {
    let (mut counts, mut drafted) = (vec![0u64; VOCAB.pow(3)], 0);
    for _ in 0..SAMPLES {
        let out = dec.generate(&PROMPT)?;
        counts[cell(&out.tokens)] += 1;
        drafted += out.stats.drafted;
    }
    Ok((counts, drafted))
}

fn models() -> (MarkovModel, MarkovModel) {
    let target = MarkovModel::random(VOCAB, 2, 31);
    let draft = target.noisy_copy(0.5, 32);
    (target, draft)
}

#[test]
fn every_decoder_follows_the_processed_target_law() -> Result<()> {
    let (target, draft) = models();
    for (name, spec) in specs() {
        let exact = spec.window(&target);
        let cfg = spec.config()?.with_seed(11);
        let build = |cfg: SamplingConfig, tree: TreePolicy| {
            SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
                .k(3)
                .tree(tree)
                .sampling(cfg)
                .max_new_tokens(3)
        };
        let (c, drafted) = counts_of(&mut build(cfg.clone(), TreePolicy::Never).build()?)?;
        assert_fits(&format!("{name}, chain"), &c, &exact);
        assert!(drafted > 0);
        let (c, _) = counts_of(&mut build(cfg.clone().coupled(), TreePolicy::Never).build()?)?;
        assert_fits(&format!("{name}, coupled"), &c, &exact);
        // Trees: each node's row processed for its own path.
        let tree = TreePolicy::Always("2x3x6".parse::<TreeBudget>()?);
        let mut trees = build(cfg.clone(), tree).build()?;
        assert!(trees.generate(&PROMPT)?.stats.tree_rounds > 0, "{name}: no tree round");
        let (c, _) = counts_of(&mut trees)?;
        assert_fits(&format!("{name}, trees"), &c, &exact);
        let (c, _) = counts_of(&mut build(cfg.clone().coupled(), tree).build()?)?;
        assert_fits(&format!("{name}, coupled trees"), &c, &exact);
        let mut point =
            SpeculativeDecoder::builder(Pair { target: target.clone(), draft: PointDraft::new(draft.clone(), 0.2) })
                .k(3)
                .sampling(cfg.clone())
                .max_new_tokens(3)
                .build()?;
        let (c, _) = counts_of(&mut point)?;
        assert_fits(&format!("{name}, point-mass drafts"), &c, &exact);
        // A batch: eight sequences at a time, each with its own seed and processors.
        let mut batch = BatchDecoder::new(KPolicy::Fixed(3))?;
        let mut c = vec![0u64; VOCAB.pow(3)];
        for n in 0..SAMPLES / 8 {
            for i in 0..8 {
                let r =
                    Request::new(PROMPT.to_vec()).sampling(cfg.clone().with_seed((n * 8 + i) as u64)).max_new_tokens(3);
                batch.add(Pair { target: target.clone(), draft: draft.clone() }, r)?;
            }
            for f in batch.run()? {
                c[cell(&f.generation.tokens)] += 1;
            }
        }
        assert_fits(&format!("{name}, batch"), &c, &exact);
        // Plain decoding with the same processors: the law the others are held to.
        let mut plain = PlainDecoder::new(target.clone(), cfg.clone()).max_new_tokens(3);
        let mut c = vec![0u64; VOCAB.pow(3)];
        for _ in 0..SAMPLES {
            c[cell(&plain.generate(&PROMPT)?.tokens)] += 1;
        }
        assert_fits(&format!("{name}, plain"), &c, &exact);
    }
    Ok(())
}

/// The power check: a presence penalty off by δ, where δ puts the law at about twice the
/// detection limit of the test, is rejected, and fits its own law; and the unprocessed law is
/// rejected outright.
#[test]
fn the_processors_battery_rejects_a_penalty_just_past_its_detection_limit() -> Result<()> {
    let (target, draft) = models();
    let spec = Spec { temperature: 1.0, repetition: 1.0, presence: 0.9, ..Spec::default() };
    let exact = spec.window(&target);
    let mut off = spec;
    let mut ratio = 0.0;
    for step in 0..400 {
        off.presence = spec.presence + 0.002 * step as f64;
        let (lambda, df) = noncentrality(&exact, &off.window(&target), SAMPLES);
        ratio = lambda / detection_limit(df);
        if ratio >= 2.0 {
            eprintln!(
                "presence {} instead of {}: {ratio:.2} times the detection limit, power {:.4}",
                off.presence,
                spec.presence,
                power(df, lambda)
            );
            break;
        }
    }
    assert!((2.0..3.0).contains(&ratio), "{ratio}");
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
        .k(3)
        .sampling(off.config()?.with_seed(5))
        .max_new_tokens(3)
        .build()?;
    let (c, _) = counts_of(&mut dec)?;
    assert_fits("presence off by δ, against its own law", &c, &off.window(&target));
    assert_rejects("presence off by δ", &c, &exact);
    let plain = Spec { presence: 0.0, ..spec };
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
        .k(3)
        .sampling(spec.config()?)
        .max_new_tokens(3)
        .build()?;
    let (c, _) = counts_of(&mut dec)?;
    assert_rejects("the penalty left out of the reference", &c, &plain.window(&target));
    Ok(())
}

/// A processor that caches counts of the output and checks, at every call, that its cache
/// equals a fresh count of the history it is handed, and that the history is the context plus
/// a prefix of the round's drafts.
#[derive(Debug)]
struct Checker {
    counts: Counts,
    calls: Arc<Mutex<(usize, usize)>>,
}

impl LogitsProcessor for Checker {
    fn process(&mut self, history: &History, logits: &mut [f32]) -> Result<()> {
        self.counts.sync(history.output());
        let mut fresh = Counts::default();
        fresh.sync(history.output());
        let mut calls = self.calls.lock().map_err(|_| Error::NotReady("poisoned"))?;
        calls.0 += 1;
        if self.counts != fresh || history.prompt != PROMPT {
            calls.1 += 1;
        }
        for (t, c) in fresh.iter() {
            logits[t as usize] -= 0.3 * c as f32;
        }
        Ok(())
    }
}

#[test]
fn a_processors_state_after_rejected_rounds_equals_a_fresh_one_fed_the_history() -> Result<()> {
    let (target, draft) = models();
    let calls = Arc::new(Mutex::new((0, 0)));
    let c = Arc::clone(&calls);
    let cfg = SamplingConfig::new(1.0)?
        .with_seed(3)
        .with_processor(Arc::new(move || Box::new(Checker { counts: Counts::default(), calls: Arc::clone(&c) })));
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
        .k(4)
        .sampling(cfg.clone())
        .max_new_tokens(40)
        .build()?;
    let mut rejections = 0;
    for _ in 0..50 {
        rejections += dec.generate(&PROMPT)?.stats.rejections;
    }
    let (n, bad) = *calls.lock().map_err(|_| Error::NotReady("poisoned"))?;
    assert!(rejections > 20 && n > 1000, "{rejections} rejections, {n} calls");
    assert_eq!(bad, 0, "{bad} of {n} calls saw a cache that differs from a fresh count");
    // Greedy with the processor equals plain decoding with it.
    let greedy = SamplingConfig::greedy().with_processor(Arc::new(|| {
        Box::new(Checker { counts: Counts::default(), calls: Arc::new(Mutex::new((0, 0))) })
    }));
    let plain = PlainDecoder::new(target.clone(), greedy.clone()).max_new_tokens(40).generate(&PROMPT)?;
    let mut spec =
        SpeculativeDecoder::builder(Pair { target, draft }).k(4).sampling(greedy).max_new_tokens(40).build()?;
    assert_eq!(spec.generate(&PROMPT)?.tokens, plain.tokens);
    Ok(())
}

/// A processor whose instances, together, fail on their `at`-th call.
#[derive(Debug)]
struct FailsOnce {
    calls: Arc<AtomicUsize>,
    at: usize,
}

impl LogitsProcessor for FailsOnce {
    fn process(&mut self, _: &History, _: &mut [f32]) -> Result<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.at {
            return Err(Error::setting("processor", n, "a call that does not fail"));
        }
        Ok(())
    }
}

#[test]
fn bad_settings_are_typed_errors_and_a_failing_processor_leaves_the_decoder_usable() -> Result<()> {
    let (target, draft) = models();
    for bad in [
        SamplingConfig::new(1.0)?.with_repetition_penalty(f32::NAN),
        SamplingConfig::new(1.0)?.with_repetition_penalty(0.0),
        SamplingConfig::new(1.0)?.with_presence_penalty(f32::INFINITY),
        SamplingConfig::new(1.0)?.with_frequency_penalty(f32::NAN),
        SamplingConfig::new(1.0)?.with_logit_bias(1, f32::NEG_INFINITY),
        SamplingConfig::new(1.0)?.with_min_p(1.5),
    ] {
        assert!(matches!(bad, Err(Error::InvalidSetting { .. })), "{bad:?}");
    }
    // A bias or a ban on a token past the vocabulary: refused when the decoder is built.
    for cfg in
        [SamplingConfig::new(1.0)?.with_logit_bias(VOCAB as u32, 1.0)?, SamplingConfig::greedy().with_banned([99])]
    {
        let built = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
            .sampling(cfg.clone())
            .build();
        assert!(matches!(built, Err(Error::TokenOutOfRange { .. })));
        let mut batch = BatchDecoder::new(KPolicy::Fixed(2))?;
        let added = batch
            .add(Pair { target: target.clone(), draft: draft.clone() }, Request::new(PROMPT.to_vec()).sampling(cfg));
        assert!(matches!(added, Err(Error::TokenOutOfRange { .. })) && batch.active() == 0);
    }
    // A processor that fails mid-generation: a typed error, then the decoder goes on.
    let calls = Arc::new(AtomicUsize::new(0));
    let cfg = SamplingConfig::greedy()
        .with_processor(Arc::new(move || Box::new(FailsOnce { calls: Arc::clone(&calls), at: 7 })));
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
        .k(3)
        .sampling(cfg)
        .max_new_tokens(20)
        .build()?;
    let mut seen = Vec::new();
    let failed = dec.generate_with(&PROMPT, |t| {
        seen.extend_from_slice(t);
        ControlFlow::Continue(())
    });
    assert!(matches!(failed, Err(Error::InvalidSetting { name: "processor", .. })), "{failed:?}");
    let again = dec.generate(&PROMPT)?;
    let plain = PlainDecoder::new(target, SamplingConfig::greedy()).max_new_tokens(20).generate(&PROMPT)?;
    assert_eq!(again.tokens, plain.tokens);
    Ok(())
}
