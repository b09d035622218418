//! Drafting across vocabularies, on toy vocabularies that split the same text differently: the
//! target speaks "a b c ab bc ca", the draft "a b c ab" (it spells "bc" and "ca" by letters).
//! Greedy output equals plain greedy output; sampled output follows the target's exact joint
//! law (chi-square at 1e-6, fixed seeds, law enumerated from the target's table alone) for both
//! methods; and the statistic rejects a sampler that judges a mapped draft token by the
//! probability of another string.

mod common;

use common::faulty::{Fault as FaultKind, Faulty};
use common::{assert_rejects, check_windows, exact_window, settings, window_counts};
use specdec::toy::{MarkovModel, ToyVocab};
use specdec::tree::ChildPicker;
use specdec::TokenModel;
use specdec::{
    BatchDecoder, CrossMethod, CrossVocabDraft, DraftModel, DraftTree, Error, KPolicy, Pair, PlainDecoder, Proposal,
    Request, Result, SamplingConfig, SpeculativeDecoder, TreeBudget, TreePolicy, VocabMap, VocabPair, Vocabulary,
};

const TARGET: [&str; 6] = ["a", "b", "c", "ab", "bc", "ca"];
const DRAFT: [&str; 4] = ["a", "b", "c", "ab"];
/// "a b c ab bc ca b c" in target ids.
const PROMPT: [u32; 8] = [0, 1, 2, 3, 4, 5, 1, 2];

fn vocabs() -> Result<(ToyVocab, ToyVocab)> {
    Ok((ToyVocab::new(DRAFT)?, ToyVocab::new(TARGET)?))
}

fn cross(draft: MarkovModel, method: CrossMethod) -> Result<CrossVocabDraft<MarkovModel, ToyVocab>> {
    let (d, t) = vocabs()?;
    CrossVocabDraft::new(draft, VocabPair { target: t, target_len: TARGET.len(), draft: d }, method)
}

#[test]
fn the_map_pairs_tokens_of_the_same_string() -> Result<()> {
    let (d, t) = vocabs()?;
    let map = VocabMap::new(Pair { target: &t, draft: &d })?;
    assert_eq!(map.shared(), 4);
    assert_eq!((0..4).map(|i| map.target_of(i)).collect::<Vec<_>>(), [Some(0), Some(1), Some(2), Some(3)]);
    assert_eq!(map.target_of(9), None);
    // The draft's row on the target's ids: its logits where the strings are shared.
    let row = map.target_row(&[0.1, 0.2, 0.3, 0.4], 7);
    assert_eq!(&row[..4], &[0.1, 0.2, 0.3, 0.4]);
    assert!(row[4..].iter().all(|&l| l == f32::NEG_INFINITY));
    // Disjoint vocabularies share nothing.
    assert!(VocabMap::new(Pair { target: &t, draft: &ToyVocab::new(["x"])? }).is_err());
    Ok(())
}

#[test]
fn text_drafts_are_the_drafts_greedy_text_in_target_tokens() -> Result<()> {
    // A draft that always continues with "ab": the target reads "ab ab ab ...".
    let mut table = vec![0.0f32; 4 * 4];
    for row in table.chunks_mut(4) {
        row[3] = 1.0;
    }
    let draft = MarkovModel::new(4, 1, table)?;
    let mut d = cross(draft, CrossMethod::Text)?;
    assert_eq!(d.propose(&[1])?, Proposal::Token(3), "`b` + `ab` reads `b ab` in target tokens");
    assert_eq!(d.propose(&[3])?, Proposal::Token(3));
    // A token off the plan starts a new one: `b a` + `ab` reads `b a ab`.
    d.truncate(1)?;
    assert_eq!(d.propose(&[0])?, Proposal::Token(3));
    // A continuation that merges into the context's last token proposes nothing:
    // `c` + `ab` reads `ca b`.
    d.truncate(0)?;
    assert_eq!(d.propose(&[2])?, Proposal::Nothing);
    Ok(())
}

#[test]
fn greedy_cross_vocabulary_drafts_equal_plain_greedy() -> Result<()> {
    for seed in 0..24u64 {
        let target = MarkovModel::random(TARGET.len(), 1 + (seed as usize % 2), seed);
        let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(40).generate(&PROMPT)?;
        for method in [CrossMethod::Text, CrossMethod::Intersection] {
            for policy in [KPolicy::Fixed(1), KPolicy::Fixed(4), KPolicy::Adaptive { max: 6 }] {
                let draft = cross(MarkovModel::random(DRAFT.len(), 2, seed + 50), method)?;
                let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
                    .k_policy(policy)
                    .max_new_tokens(40)
                    .build()?;
                let out = dec.generate(&PROMPT)?;
                assert_eq!(out.tokens, plain.tokens, "seed {seed}, {method}, {policy:?}");
            }
        }
    }
    Ok(())
}

/// The chi-square battery for one method: every sampling setting, two block sizes, both
/// outcomes of the kernel exercised.
fn battery(method: CrossMethod, seed: u64) -> Result<()> {
    let target = MarkovModel::random(TARGET.len(), 2, 21);
    for (name, cfg) in settings()? {
        for k in [2, 4] {
            let draft = cross(MarkovModel::random(DRAFT.len(), 2, 22), method)?;
            let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
                .k(k)
                .sampling(cfg.clone())
                .seed(seed + k as u64)
                .max_new_tokens(k + 3)
                .build()?;
            let what = format!("{method} drafts, {name}, k = {k}");
            let total = check_windows(&what, &mut dec, &target, &cfg, &PROMPT, k, 60_000)?;
            eprintln!(
                "{what}: {:.2} drafted per round, acceptance {:.3}",
                total.drafted as f64 / total.target_calls as f64,
                total.position_acceptance()
            );
            assert!(total.accepted > 1_000 && total.rejections > 1_000, "{what}: {total:?}");
        }
    }
    Ok(())
}

#[test]
fn sequences_with_text_drafts_follow_the_target() -> Result<()> {
    battery(CrossMethod::Text, 2500)
}

#[test]
fn sequences_with_intersection_drafts_follow_the_target() -> Result<()> {
    battery(CrossMethod::Intersection, 2600)
}

/// The bug the intersection method invites: the draft token is drawn from the mapped row, but
/// judged by the probability of a different string (here the row's entries for "a" and "ab"
/// swapped, as a map off by a token would do).
struct WrongString(CrossVocabDraft<MarkovModel, ToyVocab>);

impl TokenModel for WrongString {
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

impl DraftModel for WrongString {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        self.0.propose(tokens)
    }

    fn propose_tree(&mut self, tokens: &[u32], budget: TreeBudget, picker: &mut ChildPicker) -> Result<DraftTree> {
        let mut tree = DraftTree::new();
        let mut feed = tokens.to_vec();
        while tree.len() < budget.depth() {
            let Proposal::Logits(row) = self.0.propose(&feed)? else { break };
            let Some(child) = picker.pick(&row, 1, tree.len())?.pop() else { break };
            let mut q = child.row.ok_or(Error::EmptyDistribution)?;
            q.swap(0, 3);
            let node = tree.push_sampled(child.token, tree.len().checked_sub(1), q)?;
            feed = vec![tree.tokens()[node]];
        }
        Ok(tree)
    }
}

#[test]
fn the_battery_rejects_judging_a_draft_token_by_another_strings_probability() -> Result<()> {
    let target = MarkovModel::random(TARGET.len(), 2, 21);
    let cfg = SamplingConfig::new(1.0)?;
    let draft = WrongString(cross(MarkovModel::random(DRAFT.len(), 2, 22), CrossMethod::Intersection)?);
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
        .tree(TreePolicy::Always("1x3x3".parse::<TreeBudget>()?))
        .sampling(cfg.clone())
        .seed(2700)
        .max_new_tokens(6)
        .build()?;
    let (counts, total) = window_counts(&mut dec, TARGET.len(), &PROMPT, 3, 60_000)?;
    assert!(total.accepted > 10_000, "{total:?}");
    assert_rejects(
        "a draft token judged by another string's q",
        &counts[0],
        &exact_window(&target, &cfg, &PROMPT, 0, 3),
    );
    // The same drafter judged correctly fits.
    let mut fair = SpeculativeDecoder::builder(Pair {
        target: target.clone(),
        draft: cross(MarkovModel::random(DRAFT.len(), 2, 22), CrossMethod::Intersection)?,
    })
    .tree(TreePolicy::Always("1x3x3".parse::<TreeBudget>()?))
    .sampling(cfg.clone())
    .seed(2700)
    .max_new_tokens(6)
    .build()?;
    check_windows("intersection drafts through the tree decoder", &mut fair, &target, &cfg, &PROMPT, 3, 60_000)?;
    Ok(())
}

#[test]
fn a_draft_that_cannot_spell_the_targets_text_is_a_typed_error() -> Result<()> {
    let target = MarkovModel::random(TARGET.len(), 2, 5);
    let no_c = ToyVocab::new(["a", "b", "ab"])?;
    let draft = CrossVocabDraft::new(
        MarkovModel::random(3, 1, 6),
        VocabPair { target: ToyVocab::new(TARGET)?, target_len: 6, draft: no_c },
        CrossMethod::Text,
    )?;
    let mut dec = SpeculativeDecoder::builder(Pair { target, draft }).k(3).max_new_tokens(8).build()?;
    match dec.generate(&PROMPT) {
        Err(Error::Tokenizer { message, .. }) => assert!(message.contains("cannot spell"), "{message}"),
        other => panic!("expected a tokenizer error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn batches_with_cross_vocabulary_drafts_equal_plain_greedy() -> Result<()> {
    let target = MarkovModel::random(TARGET.len(), 2, 31);
    let prompts = [PROMPT.to_vec(), vec![3, 3, 0], vec![5, 1]];
    for policy in [KPolicy::Fixed(3), KPolicy::Adaptive { max: 5 }] {
        let mut batch = BatchDecoder::new(policy)?;
        let mut want = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let method = if i % 2 == 0 { CrossMethod::Text } else { CrossMethod::Intersection };
            let draft = cross(MarkovModel::random(DRAFT.len(), 2, 32 + i as u64), method)?;
            let id = batch.add(Pair { target: target.clone(), draft }, Request::new(p.clone()).max_new_tokens(20))?;
            let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(20).generate(p)?;
            want.push((id, plain.tokens));
        }
        let done = batch.run()?;
        for (id, tokens) in want {
            let got = done.iter().find(|f| f.id == id).expect("every sequence finishes");
            assert_eq!(got.generation.tokens, tokens, "{policy:?}, sequence {id:?}");
        }
        // The adaptive policy may judge drafting not worth it on these toy costs.
        let accepted: usize = done.iter().map(|f| f.generation.stats.accepted).sum();
        assert!(accepted > 0 || policy != KPolicy::Fixed(3), "{policy:?}: nothing accepted");
    }
    Ok(())
}

#[test]
fn a_failing_draft_model_leaves_the_drafter_usable() -> Result<()> {
    let target = MarkovModel::random(TARGET.len(), 2, 8);
    let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(30).generate(&PROMPT)?;
    for method in [CrossMethod::Text, CrossMethod::Intersection] {
        for fail_at in [1, 2, 3, 5, 8] {
            let inner = MarkovModel::random(DRAFT.len(), 2, 9);
            let faulty = Faulty { inner, calls: 0, fail_at, fault: FaultKind::Fails };
            let (d, t) = vocabs()?;
            let draft =
                CrossVocabDraft::new(faulty, VocabPair { target: t, target_len: TARGET.len(), draft: d }, method)?;
            let mut dec =
                SpeculativeDecoder::builder(Pair { target: target.clone(), draft }).k(3).max_new_tokens(30).build()?;
            assert!(dec.generate(&PROMPT).is_err(), "{method}, call {fail_at} fails");
            let out = dec.generate(&PROMPT)?;
            assert_eq!(out.tokens, plain.tokens, "{method}, after a failure at call {fail_at}");
        }
    }
    Ok(())
}

/// A draft model whose context holds at most `max` tokens.
struct Short(MarkovModel, usize);

impl TokenModel for Short {
    fn vocab_size(&self) -> usize {
        self.0.vocab()
    }

    fn context_len(&self) -> usize {
        self.0.context().len()
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        TokenModel::truncate(&mut self.0, len)
    }
}

impl DraftModel for Short {
    fn propose(&mut self, tokens: &[u32]) -> Result<Proposal> {
        let len = self.0.context().len() + tokens.len();
        if len > self.1 {
            return Err(Error::ContextTooLong { len, max: self.1 });
        }
        self.0.propose(tokens)
    }
}

#[test]
fn a_draft_whose_context_fills_first_leaves_the_target_decoding_alone() -> Result<()> {
    let target = MarkovModel::random(TARGET.len(), 2, 12);
    let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(40).generate(&PROMPT)?;
    for method in [CrossMethod::Text, CrossMethod::Intersection] {
        let (d, t) = vocabs()?;
        let draft = CrossVocabDraft::new(
            Short(MarkovModel::random(DRAFT.len(), 2, 13), 24),
            VocabPair { target: t, target_len: TARGET.len(), draft: d },
            method,
        )?;
        let mut dec =
            SpeculativeDecoder::builder(Pair { target: target.clone(), draft }).k(3).max_new_tokens(40).build()?;
        let out = dec.generate(&PROMPT)?;
        assert_eq!(out.tokens, plain.tokens, "{method}");
        assert!(out.stats.drafted > 0, "{method}: drafted before the draft's context filled");
    }
    Ok(())
}

#[test]
fn bad_settings_are_errors() -> Result<()> {
    let (d, t) = vocabs()?;
    // A target row shorter than the target's vocabulary.
    assert!(CrossVocabDraft::new(
        MarkovModel::random(4, 1, 1),
        VocabPair { target: t.clone(), target_len: 5, draft: d.clone() },
        CrossMethod::Text
    )
    .is_err());
    // A draft model whose rows are shorter than its vocabulary.
    assert!(CrossVocabDraft::new(
        MarkovModel::random(3, 1, 1),
        VocabPair { target: t, target_len: 6, draft: d },
        CrossMethod::Text
    )
    .is_err());
    assert!("texty".parse::<CrossMethod>().is_err());
    assert_eq!("intersection".parse::<CrossMethod>()?, CrossMethod::Intersection);
    let mut x = cross(MarkovModel::random(4, 1, 1), CrossMethod::Text)?;
    assert!(x.propose(&[6]).is_err(), "a token outside the target's rows");
    assert!(x.truncate(3).is_err());
    let _ = ToyVocab::new(["a"])?.ids("a")?;
    assert!(ToyVocab::new(Vec::<String>::new()).is_err());
    assert_eq!(ToyVocab::new(TARGET)?.ids("abca")?, [3, 5]);
    Ok(())
}

/// A vocabulary over "a b c": the three letters, then `extra` random strings of 2–3 letters.
fn random_vocab(extra: &[(u8, u8, u8, bool)]) -> Result<ToyVocab> {
    let letter = |x: u8| ["a", "b", "c"][x as usize % 3];
    let mut strings: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    for &(x, y, z, long) in extra {
        let s = if long {
            format!("{}{}{}", letter(x), letter(y), letter(z))
        } else {
            format!("{}{}", letter(x), letter(y))
        };
        if !strings.contains(&s) {
            strings.push(s);
        }
    }
    ToyVocab::new(strings)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Any two vocabularies over the same letters, any models, any failing draft call: no
    /// panic, and every generation that succeeds equals plain greedy decoding.
    #[test]
    fn any_pair_of_vocabularies_decodes_greedily_as_plain(
        target_extra in proptest::collection::vec(proptest::prelude::any::<(u8, u8, u8, bool)>(), 0..6),
        draft_extra in proptest::collection::vec(proptest::prelude::any::<(u8, u8, u8, bool)>(), 0..6),
        seed in 0u64..1000,
        fail_at in 0usize..12,
        k in 1usize..6,
        text in proptest::prelude::any::<bool>(),
    ) {
        let (tv, dv) = (random_vocab(&target_extra).unwrap(), random_vocab(&draft_extra).unwrap());
        let target = MarkovModel::random(tv.len(), 2, seed);
        let prompt = [0u32, 1, 2, 0];
        let plain = PlainDecoder::new(target.clone(), SamplingConfig::greedy()).max_new_tokens(24).generate(&prompt).unwrap();
        let method = if text { CrossMethod::Text } else { CrossMethod::Intersection };
        let faulty = Faulty { inner: MarkovModel::random(dv.len(), 2, seed + 1), calls: 0, fail_at, fault: FaultKind::Fails };
        let target_len = tv.len();
        let draft = CrossVocabDraft::new(faulty, VocabPair { target: tv, target_len, draft: dv }, method).unwrap();
        let mut dec = SpeculativeDecoder::builder(Pair { target, draft }).k(k).max_new_tokens(24).build().unwrap();
        for _ in 0..2 {
            if let Ok(out) = dec.generate(&prompt) {
                proptest::prop_assert_eq!(&out.tokens, &plain.tokens);
            }
        }
        // After the one failure, generations succeed.
        let out = dec.generate(&prompt).unwrap();
        proptest::prop_assert_eq!(&out.tokens, &plain.tokens);
    }
}
