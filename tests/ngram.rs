//! The n-gram (prompt lookup) drafter through the real decoder: greedy output equals plain
//! greedy output, and sampled output follows the target's exact joint distribution (chi-square
//! at significance 1e-6, fixed seeds) while the drafter is proposing most of the time.

mod common;

use common::check_windows;
use common::settings;
use specdec::toy::MarkovModel;
use specdec::{
    DraftModel, KPolicy, LookupOr, NGramDraft, Pair, PlainDecoder, Proposal, Result, SamplingConfig,
    SpeculativeDecoder, TokenModel,
};

/// Repeats "2 0 5" and holds every token of the vocabulary of 6 before its last position, so
/// that (with min_n = 1) every context has a match and the drafter always proposes.
const PROMPT: [u32; 11] = [2, 0, 5, 1, 3, 4, 2, 0, 5, 2, 0];

/// A repetitive prompt: a motif of `shortest` to `shortest + 3` tokens three times, then its
/// start.
fn repetitive_prompt(seed: u64, vocab: usize, shortest: u64) -> Vec<u32> {
    let motif: Vec<u32> = (0..shortest + seed % 4).map(|i| ((i * 5 + seed) % vocab as u64) as u32).collect();
    motif.iter().cycle().take(3 * motif.len() + 1).copied().collect()
}

/// The n-gram drafter with the decoder's block lengths instead of its own (the default
/// [`DraftModel::block_len`]), so that every depth up to k is drafted and judged often.
#[derive(Clone)]
struct EveryDepth(NGramDraft);

impl TokenModel for EveryDepth {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn context_len(&self) -> usize {
        self.0.context_len()
    }
    fn truncate(&mut self, len: usize) -> Result<()> {
        self.0.truncate(len)
    }
}

impl DraftModel for EveryDepth {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        self.0.propose(tokens)
    }
}

#[test]
fn greedy_with_ngram_drafts_equals_plain_greedy() -> Result<()> {
    for seed in 0..30u64 {
        let vocab = 4 + (seed as usize % 13);
        let target = MarkovModel::random(vocab, 1 + (seed as usize % 2), seed);
        let prompt = repetitive_prompt(seed, vocab, 2);
        let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(60).generate(&prompt)?;
        for policy in [KPolicy::Fixed(1), KPolicy::Fixed(4), KPolicy::Fixed(9), KPolicy::Adaptive { max: 6 }] {
            for (min_n, max_n) in [(1, 4), (2, 3), (1, 16)] {
                let draft = NGramDraft::with_range(vocab, min_n, max_n)?;
                let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
                    .k_policy(policy)
                    .max_new_tokens(60)
                    .build()?;
                let out = dec.generate(&prompt)?;
                assert_eq!(out.tokens, plain.tokens, "seed {seed}, {policy:?}, n {min_n}..={max_n}");
            }
        }
    }
    Ok(())
}

#[test]
fn greedy_decoding_that_loops_is_drafted_almost_entirely() -> Result<()> {
    // A greedy Markov chain falls into a cycle, which the drafter then predicts perfectly.
    let target = MarkovModel::random(16, 1, 3);
    let mut dec =
        SpeculativeDecoder::builder(Pair { target, draft: NGramDraft::new(16)? }).k(8).max_new_tokens(400).build()?;
    let stats = dec.generate(&[1, 2])?.stats;
    assert!(stats.tokens_per_target_call() > 6.0, "{:.2} tokens per call", stats.tokens_per_target_call());
    Ok(())
}

#[test]
fn sequences_with_ngram_drafts_follow_the_target() -> Result<()> {
    let target = MarkovModel::random(6, 2, 21);
    let settings = [
        ("temperature 1", SamplingConfig::new(1.0)?),
        ("temperature 0.7", SamplingConfig::new(0.7)?),
        ("top-k 3", SamplingConfig::new(1.0)?.with_top_k(3)?),
        ("top-p 0.8", SamplingConfig::new(1.0)?.with_top_p(0.8)?),
    ];
    for (name, cfg) in settings {
        for k in [1, 2, 4, 7] {
            // The drafter's own block lengths (as long as its match): the law must hold too.
            let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: NGramDraft::new(6)? })
                .k(k)
                .sampling(cfg.clone())
                .seed(1000 + k as u64)
                .max_new_tokens(k + 3)
                .build()?;
            let own =
                check_windows(&format!("n-gram blocks, {name}, k = {k}"), &mut dec, &target, &cfg, &PROMPT, k, 60_000)?;
            assert_eq!(own.drafted, own.draft_calls, "{name}, k = {k}: the drafter proposed nothing");
            // Every depth up to k: blocks of the decoder's length.
            let mut dec =
                SpeculativeDecoder::builder(Pair { target: target.clone(), draft: EveryDepth(NGramDraft::new(6)?) })
                    .k(k)
                    .sampling(cfg.clone())
                    .seed(2000 + k as u64)
                    .max_new_tokens(k + 3)
                    .build()?;
            let total =
                check_windows(&format!("n-gram, {name}, k = {k}"), &mut dec, &target, &cfg, &PROMPT, k, 60_000)?;
            // The drafter never ran dry, and every round but the last of each generation could
            // draft min(k, tokens left - 1).
            assert_eq!(total.drafted, total.draft_calls, "{name}, k = {k}: the drafter proposed nothing");
            let (drafted, rounds) = (total.drafted as f64, total.target_calls as f64);
            assert!(drafted >= 0.6 * rounds * k.min(2) as f64, "{name}, k = {k}: {drafted} drafted in {rounds} rounds");
            let alpha = total.position_acceptance();
            eprintln!("{name}, k = {k}: {:.2} drafted per round, per-position acceptance {alpha:.3}", drafted / rounds);
            // Both outcomes of the kernel are exercised, many times over.
            assert!((0.05..0.95).contains(&alpha), "{name}, k = {k}: {total:?}");
        }
    }
    Ok(())
}

#[test]
fn greedy_with_lookup_or_model_drafts_equals_plain_greedy() -> Result<()> {
    for seed in 0..20u64 {
        let vocab = 4 + (seed as usize % 13);
        let target = MarkovModel::random(vocab, 1 + (seed as usize % 2), seed);
        let prompt = repetitive_prompt(seed, vocab, 3);
        let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(60).generate(&prompt)?;
        for policy in [KPolicy::Fixed(1), KPolicy::Fixed(5), KPolicy::Adaptive { max: 6 }] {
            let draft = LookupOr::new(target.noisy_copy(0.5, seed + 100))?;
            let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
                .k_policy(policy)
                .max_new_tokens(60)
                .build()?;
            let out = dec.generate(&prompt)?;
            assert_eq!(out.tokens, plain.tokens, "seed {seed}, {policy:?}");
        }
    }
    Ok(())
}

/// Lookup where the context repeats, the model's sampled rows elsewhere, mixed within blocks:
/// the target's law at 1e-6, every sampling setting. The prompt ends in a 4-token suffix seen
/// before ("1 2 0 5", then 1), so blocks start on lookup and turn to the model at the first
/// token that breaks the motif.
#[test]
fn sequences_with_lookup_or_model_drafts_follow_the_target() -> Result<()> {
    const PROMPT: [u32; 11] = [2, 0, 5, 1, 2, 0, 5, 1, 2, 0, 5];
    let target = MarkovModel::random(6, 2, 21);
    let mut probe = LookupOr::new(target.noisy_copy(0.6, 22))?;
    assert_eq!(probe.propose(&PROMPT)?, specdec::Proposal::Token(1), "the prompt starts on lookup");
    for (name, cfg) in settings()? {
        for k in [2, 5] {
            let draft = LookupOr::new(target.noisy_copy(0.6, 22))?;
            let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
                .k(k)
                .sampling(cfg.clone())
                .seed(2100 + k as u64)
                .max_new_tokens(k + 3)
                .build()?;
            let what = format!("lookup or model, {name}, k = {k}");
            let total = check_windows(&what, &mut dec, &target, &cfg, &PROMPT, k, 60_000)?;
            assert!(total.accepted > 0 && total.rejections > 0 && total.drafted >= 60_000, "{what}: {total:?}");
        }
    }
    Ok(())
}
