//! Suffix drafting: chains and trees drawn from a shared cache of earlier requests follow the
//! target's law (chi-square at 1e-6, temperature, top-k and top-p, a batch sharing the cache,
//! the power check near the detection limit); the cache stays within its bound, keeps the most
//! recent requests, saves and loads to the same proposals, refuses corrupt files and files for
//! another vocabulary, and is shared safely by threads.

mod common;

use std::thread;

use common::{
    assert_fits, assert_nudge_rejected, check_windows, exact_window, nudged_past_the_limit, settings, window_counts,
};
use specdec::batch::{BatchDecoder, Request};
use specdec::toy::MarkovModel;
use specdec::{
    Error, KPolicy, Pair, PlainDecoder, Result, SamplingConfig, SpeculativeDecoder, SuffixCache, SuffixDraft,
    TreeBudget, TreePolicy,
};

const VOCAB: usize = 6;
const PROMPT: [u32; 2] = [1, 2];
const SAMPLES: usize = 20_000;

/// A cache filled with 300 of the target's own generations (so that it proposes often and is
/// often right), bounded at 4,000 tokens (so that the generations the tests add evict them).
fn warm_cache(target: &MarkovModel) -> Result<SuffixCache> {
    let cache = SuffixCache::new(VOCAB, 4000)?;
    let mut plain = PlainDecoder::new(target.clone(), SamplingConfig::new(1.0)?.with_seed(9)).max_new_tokens(12);
    for _ in 0..300 {
        let out = plain.generate(&PROMPT)?;
        cache.insert(&[&PROMPT[..], &out.tokens].concat())?;
    }
    Ok(cache)
}

#[test]
fn suffix_chains_and_trees_follow_the_target() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 21);
    for (name, cfg) in settings()? {
        let cache = warm_cache(&target)?;
        for (shape, tree) in
            [("chain", TreePolicy::Never), ("tree", TreePolicy::Always("3x3x8".parse::<TreeBudget>()?))]
        {
            let mut dec =
                SpeculativeDecoder::builder(Pair { target: target.clone(), draft: SuffixDraft::new(cache.clone())? })
                    .k(3)
                    .tree(tree)
                    .sampling(cfg.clone())
                    .seed(31)
                    .max_new_tokens(6)
                    .build()?;
            let total =
                check_windows(&format!("suffix {shape}, {name}"), &mut dec, &target, &cfg, &PROMPT, 3, SAMPLES)?;
            let alpha = total.position_acceptance();
            eprintln!("suffix {shape}, {name}: {} drafted, acceptance {alpha:.3}", total.drafted);
            assert!(total.drafted > SAMPLES && (0.05..0.95).contains(&alpha), "{name}, {shape}: {total:?}");
        }
        assert!(cache.tokens() <= 4000);
    }
    Ok(())
}

#[test]
fn a_batch_shares_one_cache_and_follows_the_target() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 22);
    let cache = warm_cache(&target)?;
    let cfg = SamplingConfig::new(0.8)?.with_top_p(0.9)?;
    let mut batch = BatchDecoder::new(KPolicy::Fixed(3))?;
    let mut counts = vec![0u64; VOCAB.pow(3)];
    for n in 0..SAMPLES / 8 {
        for i in 0..8 {
            let r = Request::new(PROMPT.to_vec()).sampling(cfg.clone().with_seed((n * 8 + i) as u64)).max_new_tokens(3);
            batch.add(Pair { target: target.clone(), draft: SuffixDraft::new(cache.clone())? }, r)?;
        }
        for f in batch.run()? {
            counts[common::cell(&f.generation.tokens, 0, 3, VOCAB)] += 1;
        }
    }
    assert_fits("suffix drafts in a batch", &counts, &exact_window(&target, &cfg, &PROMPT, 0, 3));
    Ok(())
}

/// The power check: a target nudged to twice the battery's detection limit is told apart.
#[test]
fn the_suffix_battery_rejects_a_target_just_past_its_detection_limit() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 23);
    let cfg = SamplingConfig::new(1.0)?;
    let (nudged, _, ratio) = nudged_past_the_limit(&target, &cfg, &PROMPT, 0, SAMPLES);
    assert!(ratio < 3.0, "{ratio}");
    let mut dec =
        SpeculativeDecoder::builder(Pair { target: nudged.clone(), draft: SuffixDraft::new(warm_cache(&target)?)? })
            .k(3)
            .sampling(cfg.clone())
            .seed(5)
            .max_new_tokens(6)
            .build()?;
    let ([counts, _], _) = window_counts(&mut dec, VOCAB, &PROMPT, 3, SAMPLES)?;
    assert_nudge_rejected("suffix chains", &counts, (&target, &nudged), &cfg, &PROMPT);
    Ok(())
}

/// A few thousand pseudo-random requests (a fixed linear congruential stream).
fn requests(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut x = seed;
    let mut next = move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    (0..n).map(|_| (0..20 + next() % 40).map(|_| next() % 500).collect()).collect()
}

#[test]
fn the_cache_stays_bounded_keeps_the_recent_and_survives_a_restart() -> Result<()> {
    let cache = SuffixCache::new(500, 5000)?;
    let all = requests(2000, 7);
    for r in &all {
        cache.insert(r)?;
        assert!(cache.tokens() <= 5000);
    }
    // The most recent requests are held, the oldest are gone.
    let continues = |r: &[u32]| cache.lookup(&r[..12], 32, 4, 1).first().is_some_and(|c| c.tokens == r[12..16]);
    assert!(all[all.len() - 20..].iter().all(|r| continues(r)));
    assert!(!all[..20].iter().any(|r| continues(r)));
    // Saved and loaded: the same proposals.
    let dir = std::env::temp_dir().join(format!("specdec-suffix-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("cache.bin");
    cache.save(&path)?;
    let loaded = SuffixCache::load(&path, 500, 5000)?;
    assert_eq!((loaded.tokens(), loaded.requests()), (cache.tokens(), cache.requests()));
    for r in requests(300, 8).iter().chain(&all[all.len() - 100..]) {
        assert_eq!(loaded.lookup(&r[..10], 32, 6, 3), cache.lookup(&r[..10], 32, 6, 3));
    }
    // A corrupt, cut or foreign file is a typed error.
    let mut bytes = std::fs::read(&path)?;
    let bad = dir.join("bad.bin");
    bytes[100] ^= 1;
    std::fs::write(&bad, &bytes)?;
    assert!(matches!(SuffixCache::load(&bad, 500, 5000), Err(Error::Load { .. })));
    std::fs::write(&bad, &bytes[..bytes.len() / 2])?;
    assert!(matches!(SuffixCache::load(&bad, 500, 5000), Err(Error::Load { .. })));
    std::fs::write(&bad, b"not a cache at all, just some text that is long enough")?;
    assert!(matches!(SuffixCache::load(&bad, 500, 5000), Err(Error::Load { .. })));
    assert!(matches!(SuffixCache::load(&path, 600, 5000), Err(Error::Load { .. })));
    // A smaller capacity keeps the most recent requests.
    let small = SuffixCache::load(&path, 500, 1000)?;
    assert!(
        small.tokens() <= 1000
            && all[all.len() - 5..]
                .iter()
                .all(|r| small.lookup(&r[..12], 32, 4, 1).first().is_some_and(|c| c.tokens == r[12..16]))
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn threads_share_one_cache_safely() -> Result<()> {
    let target = MarkovModel::random(VOCAB, 2, 24);
    let cache = SuffixCache::new(VOCAB, 3000)?;
    let outputs: Vec<Result<Vec<Vec<u32>>>> = thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (target, cache) = (target.clone(), cache.clone());
                s.spawn(move || -> Result<Vec<Vec<u32>>> {
                    let mut dec =
                        SpeculativeDecoder::builder(Pair { target: target.clone(), draft: SuffixDraft::new(cache)? })
                            .k(3)
                            .max_new_tokens(20)
                            .build()?;
                    let plain =
                        PlainDecoder::new(target, SamplingConfig::greedy()).max_new_tokens(20).generate(&[i, 2])?;
                    let mut outs = Vec::new();
                    for _ in 0..200 {
                        let out = dec.generate(&[i, 2])?;
                        assert_eq!(out.tokens, plain.tokens, "greedy with a shared cache equals plain");
                        outs.push(out.tokens);
                    }
                    Ok(outs)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("no thread panics")).collect()
    });
    for out in outputs {
        assert_eq!(out?.len(), 200);
    }
    assert!(cache.tokens() <= 3000 && cache.requests() > 100);
    Ok(())
}

#[test]
fn bad_tokens_and_settings_are_typed_errors() -> Result<()> {
    assert!(matches!(SuffixCache::new(0, 10), Err(Error::InvalidSetting { .. })));
    assert!(matches!(SuffixCache::new(10, 0), Err(Error::InvalidSetting { .. })));
    let cache = SuffixCache::new(10, 100)?;
    assert!(matches!(cache.insert(&[1, 2, 30]), Err(Error::TokenOutOfRange { .. })));
    assert_eq!(cache.requests(), 0);
    Ok(())
}

/// A toy target whose calls advance a simulated clock: a fixed cost a call and a cost a row.
struct Timed {
    model: MarkovModel,
    clock: specdec::Clock,
}

impl specdec::TokenModel for Timed {
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

impl specdec::TargetModel for Timed {
    fn forward(&mut self, tokens: &[u32], rows: usize) -> Result<specdec::Logits> {
        self.clock.advance(1e-3 + 2e-4 * rows as f64);
        self.model.forward(tokens, rows)
    }
}

/// Adversarial input: a cache full of continuations the target rarely takes (random text
/// over the same vocabulary, so that every context matches and nearly every proposal is
/// wrong). The adaptive k backs off: on the simulated clock the speculative generations cost
/// at most 5 % more than plain decoding.
#[test]
fn a_misleading_cache_costs_little_against_plain_decoding() -> Result<()> {
    use specdec::Clock;
    let target = MarkovModel::random(16, 2, 25);
    let cfg = SamplingConfig::new(1.0)?.with_seed(3);
    let prompt = [3, 4, 5];
    let timed = |clock: &Clock| Timed { model: target.clone(), clock: clock.clone() };
    let plain_clock = Clock::manual();
    let mut plain = PlainDecoder::new(timed(&plain_clock), cfg.clone()).max_new_tokens(200).clock(plain_clock);
    let cache = SuffixCache::new(16, 1 << 17)?;
    for r in requests(2000, 11) {
        cache.insert(&r.iter().map(|t| t % 16).collect::<Vec<u32>>())?;
    }
    let clock = Clock::manual();
    let mut dec = SpeculativeDecoder::builder(Pair { target: timed(&clock), draft: SuffixDraft::new(cache)? })
        .sampling(cfg)
        .max_new_tokens(200)
        .clock(clock)
        .build()?;
    let (mut spec_secs, mut plain_secs, mut drafted, mut accepted) = (0.0, 0.0, 0, 0);
    for _ in 0..10 {
        let out = dec.generate(&prompt)?;
        (spec_secs, drafted, accepted) =
            (spec_secs + out.stats.decode_secs, drafted + out.stats.drafted, accepted + out.stats.accepted);
        plain_secs += plain.generate(&prompt)?.stats.decode_secs;
    }
    eprintln!("misleading cache: {accepted} of {drafted} drafts accepted, {spec_secs:.4} s against {plain_secs:.4} s plain (simulated)");
    assert!(drafted > 0 && (accepted as f64) < 0.3 * drafted as f64, "{accepted} of {drafted}");
    assert!(spec_secs <= 1.05 * plain_secs, "{spec_secs} s against {plain_secs} s");
    Ok(())
}
