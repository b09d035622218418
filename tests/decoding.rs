//! Greedy speculative decoding equals plain greedy decoding token for token; seeded sampling
//! is reproducible; streaming delivers exactly the output; stop tokens and limits hold.

use std::ops::ControlFlow;

use specdec::batch::{BatchDecoder, Request};
use specdec::toy::{MarkovModel, PointDraft, ToyPair};
use specdec::{FinishReason, KPolicy, Pair, PlainDecoder, Result, SamplingConfig, SeqId, SpeculativeDecoder};

#[test]
fn greedy_speculative_equals_plain_greedy() -> Result<()> {
    for seed in 0..40u64 {
        let vocab = 4 + (seed as usize % 29);
        let order = 1 + (seed as usize % 2);
        let target = MarkovModel::random(vocab, order, seed);
        let draft = target.noisy_copy(0.1 + 0.02 * seed as f32, seed + 100);
        let prompt: Vec<u32> = (0..1 + seed % 5).map(|i| ((i * 7 + seed) % vocab as u64) as u32).collect();
        let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(40).generate(&prompt)?;
        for k in [1, 3, 5, 8] {
            let mut spec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
                .k(k)
                .max_new_tokens(40)
                .build()?;
            assert_eq!(spec.generate(&prompt)?.tokens, plain.tokens, "seed {seed}, k {k}");
            let mut point = SpeculativeDecoder::builder(Pair {
                target: target.clone(),
                draft: PointDraft::new(draft.clone(), 0.2),
            })
            .k(k)
            .max_new_tokens(40)
            .build()?;
            assert_eq!(point.generate(&prompt)?.tokens, plain.tokens, "point draft, seed {seed}, k {k}");
        }
    }
    Ok(())
}

#[test]
fn a_perfect_draft_is_always_accepted() -> Result<()> {
    let ToyPair { target, .. } = MarkovModel::pair(32, 0.0, 3);
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: target })
        .k(4)
        .max_new_tokens(100)
        .sampling(SamplingConfig::new(1.0)?)
        .build()?;
    let stats = dec.generate(&[1])?.stats;
    assert_eq!(stats.accepted, stats.drafted);
    assert_eq!(stats.tokens_per_target_call(), 5.0);
    Ok(())
}

#[test]
fn same_seed_same_tokens() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(32, 0.3, 5);
    let cfg = SamplingConfig::new(0.9)?.with_top_p(0.9)?;
    let run = |seed| -> Result<Vec<Vec<u32>>> {
        // A fixed k: the default adaptive k follows timings, and sampled draws follow k.
        let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
            .k(4)
            .sampling(cfg.clone())
            .seed(seed)
            .max_new_tokens(50)
            .build()?;
        (0..3).map(|_| Ok(dec.generate(&[1, 2])?.tokens)).collect()
    };
    assert_eq!(run(9)?, run(9)?);
    assert_ne!(run(9)?, run(10)?);
    let plain =
        |seed| PlainDecoder::new(target.clone(), cfg.clone().with_seed(seed)).max_new_tokens(50).generate(&[1, 2]);
    assert_eq!(plain(4)?.tokens, plain(4)?.tokens);
    Ok(())
}

#[test]
fn a_seed_holds_whether_set_before_or_after_the_sampling_settings() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(32, 0.3, 5);
    let cfg = SamplingConfig::new(0.9)?.with_seed(1);
    let builder =
        || SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() }).k(4).max_new_tokens(50);
    let after = builder().sampling(cfg.clone()).seed(9).build()?.generate(&[1, 2])?.tokens;
    let before = builder().seed(9).sampling(cfg.clone()).build()?.generate(&[1, 2])?.tokens;
    let own = builder().sampling(cfg.with_seed(9)).build()?.generate(&[1, 2])?.tokens;
    assert_eq!((&before, &after), (&own, &own));
    Ok(())
}

#[test]
fn streaming_delivers_the_output_and_stop_tokens_end_it() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(16, 0.2, 8);
    let greedy = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(30).generate(&[3])?;
    let stop = greedy.tokens[10];
    let first = greedy.tokens.iter().position(|&t| t == stop).unwrap_or(10);
    let mut dec =
        SpeculativeDecoder::builder(Pair { target, draft }).k(5).max_new_tokens(30).stop_tokens([stop]).build()?;
    let mut streamed = Vec::new();
    let out = dec.generate_with(&[3], |toks| {
        streamed.extend_from_slice(toks);
        ControlFlow::Continue(())
    })?;
    assert_eq!(out.tokens, streamed);
    assert_eq!(out.tokens, greedy.tokens[..=first]);
    assert_eq!(out.finish, FinishReason::Stop);
    Ok(())
}

#[test]
fn max_new_tokens_is_exact_and_zero_gives_nothing() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(16, 0.0, 8);
    for n in [0, 1, 2, 5, 13] {
        let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
            .k(4)
            .max_new_tokens(n)
            .build()?;
        let out = dec.generate(&[1])?;
        assert_eq!(out.tokens.len(), n);
        assert_eq!(out.finish, FinishReason::Length);
    }
    Ok(())
}

#[test]
fn step_by_step_matches_generate() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(16, 0.3, 2);
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
        .k(3)
        .max_new_tokens(25)
        .build()?;
    dec.start(&[4, 5])?;
    while dec.finish_reason().is_none() {
        assert!(!dec.step()?.is_empty());
    }
    assert!(dec.step()?.is_empty());
    let stepped = dec.generated().to_vec();
    assert_eq!(dec.generate(&[4, 5])?.tokens, stepped);
    Ok(())
}

#[test]
fn the_callback_cancels_a_generation_and_the_decoders_go_on() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(16, 0.2, 8);
    let sampling = SamplingConfig::new(0.9)?.with_seed(4);
    let full = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(40).generate(&[3])?;
    // The single decoder stops after the callback's first Break, keeping what it streamed.
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
        .k(3)
        .max_new_tokens(40)
        .build()?;
    let mut streamed = Vec::new();
    let out = dec.generate_with(&[3], |toks| {
        streamed.extend_from_slice(toks);
        if streamed.len() >= 5 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    assert_eq!(out.finish, FinishReason::Cancelled);
    assert_eq!(out.tokens, streamed);
    assert!(out.tokens.len() >= 5 && out.tokens.len() < 40);
    assert_eq!(out.tokens, full.tokens[..out.tokens.len()]);
    // The same decoder then runs a whole generation, equal to plain decoding.
    assert_eq!(dec.generate(&[3])?.tokens, full.tokens);
    // The plain decoder stops at once too, and goes on as well.
    let mut plain = PlainDecoder::new(target.clone(), sampling.clone()).max_new_tokens(40);
    let out = plain.generate_with(&[3], |_| ControlFlow::Break(()))?;
    assert_eq!((out.tokens.len(), out.finish), (1, FinishReason::Cancelled));
    assert_eq!(plain.generate(&[3])?.tokens.len(), 40);
    Ok(())
}

#[test]
fn a_cancelled_sequence_frees_its_slot_and_the_others_lose_nothing() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(16, 0.2, 8);
    let request = |i: u32| {
        let sampling = SamplingConfig::new(0.9).map(|s| s.with_seed(u64::from(i)));
        sampling.map(|s| Request::new(vec![i + 1, 3]).sampling(s).max_new_tokens(30))
    };
    // Each sequence alone, with the batch's fixed k: the reference.
    let mut alone = Vec::new();
    for i in 0..3 {
        let mut b = BatchDecoder::new(KPolicy::Fixed(3))?;
        b.add(Pair { target: target.clone(), draft: draft.clone() }, request(i)?)?;
        alone.push(b.run()?.remove(0).generation.tokens);
    }
    let mut batch = BatchDecoder::new(KPolicy::Fixed(3))?;
    for i in 0..3 {
        batch.add(Pair { target: target.clone(), draft: draft.clone() }, request(i)?)?;
    }
    let done =
        batch.run_with(|id, _| if id == SeqId(1) { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })?;
    assert_eq!(done.len(), 3);
    for f in &done {
        let want = &alone[f.id.0 as usize];
        if f.id == SeqId(1) {
            assert_eq!(f.generation.finish, FinishReason::Cancelled);
            assert!(!f.generation.tokens.is_empty() && f.generation.tokens.len() < 30);
            assert_eq!(f.generation.tokens, want[..f.generation.tokens.len()]);
        } else {
            assert_eq!(&f.generation.tokens, want, "sequence {:?}", f.id);
        }
    }
    // Cancelling between steps by id: the slot is freed at once, an unknown id is an error.
    let mut batch = BatchDecoder::new(KPolicy::Fixed(2))?;
    let id = batch.add(Pair { target: target.clone(), draft: draft.clone() }, request(0)?)?;
    batch.step()?;
    let f = batch.cancel(id)?;
    assert_eq!((batch.active(), f.generation.finish), (0, FinishReason::Cancelled));
    assert!(batch.cancel(id).is_err());
    Ok(())
}
