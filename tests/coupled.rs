//! Coupled sampling ([`SamplingConfig::coupled`]): speculative output equals plain output token
//! for token, whatever the drafter, k, tree setting or batch, on toy and real models; the
//! chi-square battery shows the mode still samples the target's law, and rejects a biased race.

mod common;

use common::{assert_fits, assert_rejects, cell, check_windows, exact_window, processed_row, settings};
use specdec::batch::{BatchDecoder, Request};
use specdec::sampling::Noise;
use specdec::toy::{MarkovModel, PointDraft};
use specdec::{
    DraftModel, KPolicy, NGramDraft, Pair, PlainDecoder, Result, SamplingConfig, SpeculativeDecoder, TreeBudget,
    TreePolicy,
};

const PROMPT: [u32; 3] = [2, 0, 5];

fn toy_target() -> MarkovModel {
    MarkovModel::random(6, 2, 21)
}

/// `generations` plain generations of `new` tokens with `cfg`, one decoder (the noise of
/// generation n is keyed by n).
fn plain_runs(target: &MarkovModel, cfg: &SamplingConfig, new: usize, generations: usize) -> Result<Vec<Vec<u32>>> {
    let mut plain = PlainDecoder::new(target.clone(), cfg.clone()).max_new_tokens(new);
    (0..generations).map(|_| Ok(plain.generate(&PROMPT)?.tokens)).collect()
}

/// Generations of `spec` equal `plain`'s one for one; returns the drafted and accepted counts.
fn assert_equal_runs<D: DraftModel>(
    what: &str,
    spec: &mut SpeculativeDecoder<MarkovModel, D>,
    plain: &[Vec<u32>],
) -> Result<(usize, usize)> {
    let (mut drafted, mut accepted) = (0, 0);
    for (n, expected) in plain.iter().enumerate() {
        let out = spec.generate(&PROMPT)?;
        assert_eq!(&out.tokens, expected, "{what}: generation {n}");
        drafted += out.stats.drafted;
        accepted += out.stats.accepted;
    }
    Ok((drafted, accepted))
}

#[test]
fn coupled_speculative_output_equals_plain_output() -> Result<()> {
    let target = toy_target();
    let (new, generations) = (24, 25);
    let tree = "2x3x8".parse::<TreeBudget>()?;
    for (name, cfg) in settings()? {
        let cfg = cfg.with_seed(11).coupled();
        let plain = plain_runs(&target, &cfg, new, generations)?;
        let policies = [
            ("k = 1", KPolicy::Fixed(1), TreePolicy::Never),
            ("k = 4", KPolicy::Fixed(4), TreePolicy::Never),
            ("adaptive k", KPolicy::default(), TreePolicy::Never),
            ("trees", KPolicy::Fixed(3), TreePolicy::Always(tree)),
        ];
        for (how, policy, trees) in policies {
            let what = format!("{name}, sampled draft, {how}");
            let mut spec =
                SpeculativeDecoder::builder(Pair { target: target.clone(), draft: target.noisy_copy(0.3, 22) })
                    .k_policy(policy)
                    .tree(trees)
                    .sampling(cfg.clone())
                    .max_new_tokens(new)
                    .build()?;
            let (drafted, accepted) = assert_equal_runs(&what, &mut spec, &plain)?;
            // Adaptive k follows the clock, and on toy models (a draft call costs about a target
            // call) it mostly decodes plainly: only its output is checked. The others must see
            // drafts accepted and rejected.
            let fixed = !matches!(policy, KPolicy::Adaptive { .. });
            assert!(!fixed || (accepted > 0 && accepted < drafted), "{what}: {accepted} of {drafted} accepted");
            let wants_trees = matches!(trees, TreePolicy::Always(_));
            assert_eq!(spec.stats().tree_rounds > 0, wants_trees, "{what}: tree rounds");
        }
        let what = format!("{name}, point-mass draft");
        let mut spec = SpeculativeDecoder::builder(Pair {
            target: target.clone(),
            draft: PointDraft::new(target.noisy_copy(0.3, 23), 0.3),
        })
        .k(3)
        .sampling(cfg.clone())
        .max_new_tokens(new)
        .build()?;
        let (drafted, accepted) = assert_equal_runs(&what, &mut spec, &plain)?;
        assert!(drafted > 0 && accepted > 0, "{what}: {accepted} of {drafted} accepted");
        let what = format!("{name}, n-gram draft");
        let mut spec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: NGramDraft::new(6)? })
            .k(4)
            .sampling(cfg)
            .max_new_tokens(new)
            .build()?;
        let (drafted, _) = assert_equal_runs(&what, &mut spec, &plain)?;
        assert!(drafted > 0, "{what}: nothing drafted");
    }
    Ok(())
}

#[test]
fn coupled_batches_equal_plain_output() -> Result<()> {
    let target = toy_target();
    let draft = target.noisy_copy(0.3, 24);
    for policy in [KPolicy::Fixed(3), KPolicy::Plain, KPolicy::Adaptive { max: 4 }] {
        let mut batch = BatchDecoder::new(policy)?;
        let mut expected = Vec::new();
        for seed in 0..6u64 {
            let cfg = SamplingConfig::new(0.9)?.with_top_k(4)?.with_seed(seed).coupled();
            let new = 10 + 3 * seed as usize;
            expected.push(plain_runs(&target, &cfg, new, 1)?.remove(0));
            batch.add(
                Pair { target: target.clone(), draft: draft.clone() },
                Request::new(PROMPT.to_vec()).sampling(cfg).max_new_tokens(new),
            )?;
        }
        let mut done = batch.run()?;
        done.sort_by_key(|f| f.id);
        let got: Vec<Vec<u32>> = done.into_iter().map(|f| f.generation.tokens).collect();
        assert_eq!(got, expected, "{policy:?}");
    }
    Ok(())
}

#[test]
fn a_seed_gives_the_same_text_and_generations_differ() -> Result<()> {
    let target = toy_target();
    let cfg = SamplingConfig::new(1.0)?.with_seed(5).coupled();
    let runs = plain_runs(&target, &cfg, 30, 3)?;
    assert_eq!(runs, plain_runs(&target, &cfg, 30, 3)?);
    assert!(runs[0] != runs[1] && runs[1] != runs[2], "each generation draws fresh noise");
    assert_ne!(runs, plain_runs(&target, &cfg.clone().with_seed(6), 30, 3)?);
    Ok(())
}

/// The coupled speculative decoder against the target's exact law (tokens 0..3 and k..k + 3,
/// 60,000 generations, 1e-6), every sampling setting.
#[test]
fn coupled_sequences_follow_the_target() -> Result<()> {
    let target = toy_target();
    for (name, cfg) in settings()? {
        let cfg = cfg.coupled();
        let mut spec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: target.noisy_copy(0.6, 25) })
            .k(3)
            .sampling(cfg.clone())
            .seed(77)
            .max_new_tokens(6)
            .build()?;
        let stats = check_windows(&format!("coupled, {name}"), &mut spec, &target, &cfg, &PROMPT, 3, 60_000)?;
        assert!(stats.accepted > 0 && stats.accepted < stats.drafted, "coupled, {name}: acceptance {stats:?}");
    }
    Ok(())
}

/// A race with the wrong transform of its uniforms (`1 − U` where `−ln U` belongs) favours
/// likely tokens; the same statistic, on the same sample size, rejects it.
#[test]
fn power_a_biased_race_is_rejected() -> Result<()> {
    let target = toy_target();
    let cfg = SamplingConfig::new(1.0)?;
    let vocab = target.vocab();
    let exact = exact_window(&target, &cfg, &PROMPT, 0, 3);
    let (mut fair, mut biased) = (vec![0u64; vocab.pow(3)], vec![0u64; vocab.pow(3)]);
    for n in 0..60_000u64 {
        let noise = Noise::new(77, n);
        for (counts, transform) in [(&mut fair, 0), (&mut biased, 1)] {
            let mut ctx = PROMPT.to_vec();
            for _ in 0..3 {
                let p = processed_row(&target, &cfg, &ctx[ctx.len() - 2..]);
                let pos = ctx.len() as u64;
                let score = |t: usize| {
                    let u = noise.uniform(pos, t as u32);
                    (if transform == 0 { -u.ln() } else { 1.0 - u }) / p[t]
                };
                let t = (0..vocab).filter(|&t| p[t] > 0.0).min_by(|&a, &b| score(a).total_cmp(&score(b)));
                ctx.push(t.expect("a row with mass") as u32);
            }
            counts[cell(&ctx, PROMPT.len(), 3, vocab)] += 1;
        }
    }
    assert_fits("the fair race", &fair, &exact);
    assert_rejects("the race on 1 − U", &biased, &exact);
    Ok(())
}

mod real {
    use super::common::models::{model_path, GEMMA3, SMOLLM2};
    use specdec::{
        Drafter, Llama, ModelFiles, NGramDraft, Pair, PlainDecoder, Result, SamplingConfig, SpeculativeDecoder,
        TreeBudget, TreePolicy, WeightFormat,
    };

    /// Coupled sampling at temperature 0.8 with top-p: the model draft (adaptive k, k = 4 and
    /// EAGLE-2 trees) and n-gram lookup (chains and trees) give the plain decoder's text.
    fn coupled_matches(name: &str, draft_format: WeightFormat, new: usize) -> Result<()> {
        let device = candle_core::Device::Cpu;
        let Some(path) = model_path(name) else { return Ok(()) };
        let (target_w, tok) = ModelFiles::Gguf(path.clone()).load(WeightFormat::F32, &device)?;
        let (draft_w, _) = ModelFiles::Gguf(path).load(draft_format, &device)?;
        let cfg = SamplingConfig::new(0.8)?.with_top_p(0.95)?.with_seed(7).coupled();
        let ids = tok.encode(&tok.chat_prompt("Write a short poem about the sea."))?;
        let stop = target_w.config().eos_token_ids.clone();
        let plain = PlainDecoder::new(Llama::new(target_w.clone())?, cfg.clone())
            .max_new_tokens(new)
            .stop_tokens(stop.clone())
            .generate(&ids)?;
        let vocab = target_w.config().vocab_size;
        let (chain, tree) = (TreePolicy::Never, TreePolicy::Always("2x4x10".parse::<TreeBudget>()?));
        let drafters = [
            (Some(4), chain, Drafter::Model(Llama::new(draft_w.clone())?)),
            (None, chain, Drafter::Model(Llama::new(draft_w.clone())?)),
            (None, tree, Drafter::Model(Llama::new(draft_w)?)),
            (Some(4), chain, Drafter::NGram(NGramDraft::new(vocab)?)),
            (None, tree, Drafter::NGram(NGramDraft::new(vocab)?)),
        ];
        for (k, shape, draft) in drafters {
            let builder = SpeculativeDecoder::builder(Pair { target: Llama::new(target_w.clone())?, draft })
                .tree(shape)
                .sampling(cfg.clone())
                .max_new_tokens(new)
                .stop_tokens(stop.clone());
            let mut spec = match k {
                Some(k) => builder.k(k).build()?,
                None => builder.build()?,
            };
            let out = spec.generate(&ids)?;
            assert_eq!(
                out.tokens,
                plain.tokens,
                "{name}, k {k:?}, {shape}: {:?} vs {:?}",
                tok.decode(&out.tokens),
                tok.decode(&plain.tokens)
            );
        }
        Ok(())
    }

    #[test]
    fn smollm2_coupled_speculative_equals_plain() -> Result<()> {
        coupled_matches(SMOLLM2, WeightFormat::Stored, 32)
    }

    #[test]
    fn gemma3_coupled_speculative_equals_plain() -> Result<()> {
        coupled_matches(GEMMA3, WeightFormat::Quantized(candle_core::quantized::GgmlDType::Q8_0), 24)
    }
}
