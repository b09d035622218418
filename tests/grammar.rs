//! Grammars under speculation, on a toy vocabulary of 16 tokens: the speculative law equals
//! the grammar-processed target law, enumerated here with fresh llguidance matchers (one per
//! history, none of the crate's caching, roll-back or fast-forward), chi-square at 1e-6 for
//! chains, coupled sampling, point-mass drafts, n-gram drafts, batches, trees and
//! plain decoding, with a power check near the detection limit; the processor's state after
//! rejected rounds equals a fresh one fed the history; on the Qwen tokenizer, the JSON
//! grammar's masks after branches and returns equal a fresh matcher's; bad grammars are typed
//! errors.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{assert_fits, assert_rejects, detection_limit, noncentrality, power};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use specdec::batch::{BatchDecoder, Request};
use specdec::grammar::{Grammar, GrammarVocab};
use specdec::sampling::{History, ProcessorFactory};
use specdec::toy::{MarkovModel, PointDraft};
use specdec::{
    DraftModel, Error, KPolicy, NGramDraft, Pair, PlainDecoder, Result, SamplingConfig, SpeculativeDecoder,
    TargetModel, TreeBudget, TreePolicy,
};

const EOS: u32 = 15;
const SAMPLES: usize = 20_000;

/// The toy vocabulary: several ways to write the same text, so that masks, forced tokens and
/// non-canonical spellings all occur.
fn words() -> Vec<Vec<u8>> {
    let text = ["{", "\"", "{\"", "k", "\":", ":", "1", "2", "12", "}", "2}", "x", "a", "b", "ab"];
    let mut w: Vec<Vec<u8>> = text.iter().map(|t| t.as_bytes().to_vec()).collect();
    w.push(b"\xFF<eos>".to_vec());
    w
}

/// The grammars: an object with a forced head (`{"k":`, three tokens) and a forced end of
/// sequence, and a language of masks only (end of sequence where it accepts).
fn cases() -> Vec<(&'static str, &'static str, usize, Vec<u32>)> {
    vec![
        ("object", r#"\{"k":[12]{1,3}\}"#, 6, vec![12, 13, 0, 2, 3, 4, 8, 9]),
        ("letters", r"(a|b)+(x[12])?", 4, vec![12, 14, 11, 6, 13, 12]),
    ]
}

/// llguidance's view of the toy vocabulary, built here apart from the crate.
struct Greedy(TokTrie);

impl TokenizerEnv for Greedy {
    fn tok_trie(&self) -> &TokTrie {
        &self.0
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.0.greedy_tokenize(s)
    }
}

/// The law a plain decoder follows under `grammar`: at each history a fresh matcher fed the
/// output, and the target's row at `temperature` over the matcher's mask. Every finished output (end of sequence, or `max`
/// tokens) with its probability.
fn reference(
    grammar: &TopLevelGrammar,
    target: &MarkovModel,
    temperature: f64,
    prompt: &[u32],
    max: usize,
) -> BTreeMap<Vec<u32>, f64> {
    let words = words();
    let trie = TokTrie::from(&TokRxInfo::new(words.len() as u32, EOS), &words);
    let factory = ParserFactory::new_simple(&(Arc::new(Greedy(trie)) as _)).expect("factory");
    let row = |out: &[u32]| -> Vec<f64> {
        let parser = factory.create_parser(grammar.clone()).expect("parser");
        let mut m = Matcher::new(Ok(parser));
        m.consume_tokens(out).expect("an allowed output");
        let mut law = vec![0.0; words.len()];
        let mask = m.compute_mask_or_eos().expect("mask");
        let ctx: Vec<u32> = prompt.iter().chain(out).copied().collect();
        for (t, &p) in target.next_probs(&ctx).iter().enumerate() {
            if mask.is_allowed(t as u32) {
                law[t] = (f64::from(p).ln() / temperature).exp();
            }
        }
        let total: f64 = law.iter().sum();
        law.iter().map(|w| w / total).collect()
    };
    let mut out = BTreeMap::new();
    let mut stack = vec![(Vec::new(), 1.0)];
    while let Some((seq, p)) = stack.pop() {
        if seq.len() == max || seq.last() == Some(&EOS) {
            *out.entry(seq).or_insert(0.0) += p;
            continue;
        }
        for (t, &q) in row(&seq).iter().enumerate().filter(|(_, &q)| q > 0.0) {
            let mut next = seq.clone();
            next.push(t as u32);
            stack.push((next, p * q));
        }
    }
    out
}

fn compile(regex: &str) -> Result<ProcessorFactory> {
    Grammar::regex(regex).compile(&GrammarVocab::from_token_bytes(words(), &[EOS])?)
}

fn models() -> (MarkovModel, MarkovModel) {
    let target = MarkovModel::random(16, 2, 41);
    let draft = target.noisy_copy(0.4, 42);
    (target, draft)
}

/// Where `out` falls in `law`'s order (an output outside it fails the test).
fn cell(law: &BTreeMap<Vec<u32>, f64>, out: &[u32]) -> usize {
    let i = law.keys().position(|k| k == out);
    i.unwrap_or_else(|| panic!("{out:?} is not an output the grammar allows"))
}

fn fits(what: &str, counts: &[u64], law: &BTreeMap<Vec<u32>, f64>) {
    assert_fits(what, counts, &law.values().copied().collect::<Vec<_>>());
}

/// Counts of each output over [`SAMPLES`] generations, and the tokens drafted and forced.
fn tally<T: TargetModel, D: DraftModel>(
    law: &BTreeMap<Vec<u32>, f64>,
    dec: &mut SpeculativeDecoder<T, D>,
    prompt: &[u32],
) -> Result<(Vec<u64>, usize, usize)> {
    let mut counts = vec![0; law.len()];
    let (mut drafted, mut forced) = (0, 0);
    for _ in 0..SAMPLES {
        let g = dec.generate(prompt)?;
        counts[cell(law, &g.tokens)] += 1;
        drafted += g.stats.drafted;
        forced += g.stats.forced_tokens;
    }
    Ok((counts, drafted, forced))
}

/// Counts of each output of plain decoding with `cfg`, over [`SAMPLES`] generations.
fn plain_counts(
    law: &BTreeMap<Vec<u32>, f64>,
    target: &MarkovModel,
    cfg: SamplingConfig,
    (prompt, max): (&[u32], usize),
) -> Result<Vec<u64>> {
    let mut plain = PlainDecoder::new(target.clone(), cfg).max_new_tokens(max).stop_tokens([EOS]);
    let mut counts = vec![0; law.len()];
    for _ in 0..SAMPLES {
        counts[cell(law, &plain.generate(prompt)?.tokens)] += 1;
    }
    Ok(counts)
}

#[test]
fn every_decoder_follows_the_grammars_law() -> Result<()> {
    let (target, draft) = models();
    for (name, regex, max, prompt) in cases() {
        for temperature in [1.0, 0.7] {
            let law = reference(&TopLevelGrammar::from_regex(regex), &target, temperature, &prompt, max);
            let cfg = SamplingConfig::new(temperature as f32)?.with_seed(17).with_processor(compile(regex)?);
            let what = |how: &str| format!("{name}, temperature {temperature}, {how}");
            let build = |cfg: SamplingConfig| {
                SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
                    .k(3)
                    .sampling(cfg)
                    .max_new_tokens(max)
                    .stop_tokens([EOS])
            };
            let (c, drafted, forced) = tally(&law, &mut build(cfg.clone()).build()?, &prompt)?;
            fits(&what("chain"), &c, &law);
            assert!(drafted > 0 && forced > 0, "{drafted} drafted, {forced} forced");
            fits(&what("coupled"), &tally(&law, &mut build(cfg.clone().coupled()).build()?, &prompt)?.0, &law);
            // Trees, each node's row processed for its own path (the grammar follows each branch).
            let mut trees = build(cfg.clone()).tree(TreePolicy::Always("2x3x6".parse::<TreeBudget>()?)).build()?;
            assert!(trees.generate(&prompt)?.stats.tree_rounds > 0, "{}: no tree round", what("trees"));
            fits(&what("trees"), &tally(&law, &mut trees, &prompt)?.0, &law);
            let point = PointDraft::new(draft.clone(), 0.2);
            let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: point })
                .k(3)
                .sampling(cfg.clone())
                .max_new_tokens(max)
                .stop_tokens([EOS])
                .build()?;
            fits(&what("point-mass drafts"), &tally(&law, &mut dec, &prompt)?.0, &law);
            let ngram = NGramDraft::with_range(16, 1, 3)?;
            let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: ngram })
                .k(3)
                .sampling(cfg.clone())
                .max_new_tokens(max)
                .stop_tokens([EOS])
                .build()?;
            let (c, drafted, _) = tally(&law, &mut dec, &prompt)?;
            fits(&what("n-gram drafts"), &c, &law);
            assert!(drafted > 0);
            let mut batch = BatchDecoder::new(KPolicy::Fixed(3))?;
            let mut c = vec![0; law.len()];
            for n in 0..SAMPLES / 8 {
                for i in 0..8 {
                    let r = Request::new(prompt.clone()).sampling(cfg.clone().with_seed((n * 8 + i) as u64));
                    batch.add(
                        Pair { target: target.clone(), draft: draft.clone() },
                        r.max_new_tokens(max).stop_tokens([EOS]),
                    )?;
                }
                for f in batch.run()? {
                    c[cell(&law, &f.generation.tokens)] += 1;
                }
            }
            fits(&what("batch"), &c, &law);
            fits(&what("plain"), &plain_counts(&law, &target, cfg.clone(), (&prompt, max))?, &law);
        }
    }
    Ok(())
}

/// A Lark grammar (the letters language written as rules) against its own law, chains and
/// plain decoding.
#[test]
fn a_lark_grammar_follows_its_law() -> Result<()> {
    let (target, draft) = models();
    let lark = "start: letter+ tail?\nletter: \"a\" | \"b\"\ntail: \"x\" (\"1\" | \"2\")\n";
    let (prompt, max) = (vec![12, 14, 11, 6, 13, 12], 4);
    let law = reference(&TopLevelGrammar::from_lark(lark.to_string()), &target, 1.0, &prompt, max);
    let vocab = GrammarVocab::from_token_bytes(words(), &[EOS])?;
    let cfg = SamplingConfig::new(1.0)?.with_seed(8).with_processor(Grammar::lark(lark).compile(&vocab)?);
    let mut dec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft })
        .k(3)
        .sampling(cfg.clone())
        .max_new_tokens(max)
        .stop_tokens([EOS])
        .build()?;
    let (c, drafted, _) = tally(&law, &mut dec, &prompt)?;
    fits("Lark, chain", &c, &law);
    assert!(drafted > 0);
    fits("Lark, plain", &plain_counts(&law, &target, cfg, (&prompt, max))?, &law);
    Ok(())
}

/// The power check: the same battery rejects sampling at a temperature off by δ, where δ puts
/// the law at about twice its detection limit, and the law fits its own reference.
#[test]
fn the_grammar_battery_rejects_a_temperature_just_past_its_detection_limit() -> Result<()> {
    let (target, draft) = models();
    let (_, regex, max, prompt) = cases().remove(1);
    let exact = reference(&TopLevelGrammar::from_regex(regex), &target, 1.0, &prompt, max);
    let (mut off, mut ratio, mut shifted) = (1.0, 0.0, BTreeMap::new());
    for step in 1..400 {
        off = 1.0 + 0.002 * step as f64;
        shifted = reference(&TopLevelGrammar::from_regex(regex), &target, off, &prompt, max);
        let (e, s): (Vec<f64>, Vec<f64>) = exact.keys().map(|k| (exact[k], shifted[k])).unzip();
        let (lambda, df) = noncentrality(&e, &s, SAMPLES);
        ratio = lambda / detection_limit(df);
        if ratio >= 2.0 {
            eprintln!("temperature {off}: {ratio:.2} times the detection limit, power {:.4}", power(df, lambda));
            break;
        }
    }
    assert!((2.0..3.0).contains(&ratio), "{ratio}");
    let cfg = SamplingConfig::new(off as f32)?.with_seed(9).with_processor(compile(regex)?);
    let mut dec = SpeculativeDecoder::builder(Pair { target, draft })
        .k(3)
        .sampling(cfg)
        .max_new_tokens(max)
        .stop_tokens([EOS])
        .build()?;
    let (c, _, _) = tally(&shifted, &mut dec, &prompt)?;
    fits("temperature off by δ, against its own law", &c, &shifted);
    assert_rejects("temperature off by δ", &c, &exact.values().copied().collect::<Vec<_>>());
    Ok(())
}

#[test]
fn the_grammars_state_after_rejected_rounds_equals_a_fresh_one_fed_the_history() -> Result<()> {
    use rand::{RngExt, SeedableRng};
    let factory = compile(r"(a|b)+(x[12])?")?;
    let mut cached = factory();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut out: Vec<u32> = Vec::new();
    let mut checked = 0;
    for _ in 0..800 {
        // A round: draft up to four allowed tokens, then keep a random prefix of them.
        let keep = out.len();
        for _ in 0..rng.random_range(1..5) {
            let h = History { prompt: &[1], generated: &out, drafted: &[] };
            let mut row = vec![0.0f32; 16];
            cached.process(&h, &mut row)?;
            let allowed: Vec<u32> = (0..16).filter(|&t| row[t as usize].is_finite()).collect();
            let mut fresh = factory();
            let mut fresh_row = vec![0.0f32; 16];
            fresh.process(&h, &mut fresh_row)?;
            assert_eq!(row, fresh_row, "after {out:?}");
            assert_eq!(cached.forced(&h)?, fresh.forced(&h)?, "after {out:?}");
            checked += 1;
            let t = allowed[rng.random_range(0..allowed.len())];
            if t == EOS {
                break;
            }
            out.push(t);
        }
        out.truncate(rng.random_range(keep..=out.len()));
        if rng.random_range(0..10) == 0 {
            out.clear();
        }
    }
    assert!(checked > 1000, "{checked}");
    Ok(())
}

#[test]
fn bad_grammars_are_typed_errors_before_any_work() -> Result<()> {
    let vocab = GrammarVocab::from_token_bytes(words(), &[EOS])?;
    for bad in [
        Grammar::regex("(a|"),
        Grammar::lark("start: undefined_rule"),
        Grammar::json_schema(serde_json::json!({"type": 7})),
    ] {
        let compiled = bad.compile(&vocab);
        assert!(matches!(compiled, Err(Error::Grammar(_))), "{bad:?}");
    }
    assert!(matches!(GrammarVocab::from_token_bytes(words(), &[]), Err(Error::Grammar(_))));
    assert!(matches!(GrammarVocab::from_token_bytes(words(), &[99]), Err(Error::Grammar(_))));
    Ok(())
}

/// JSON grammars bound the whitespace between two JSON tokens (20 bytes), so that a sampled
/// model cannot fill the token limit with it; a schema's own `x-guidance` options win.
#[test]
fn json_whitespace_is_bounded_unless_the_schema_says_otherwise() -> Result<()> {
    let tokens = vec![b"{".to_vec(), b"}".to_vec(), b" ".to_vec(), b"\xFF<eos>".to_vec()];
    let vocab = GrammarVocab::from_token_bytes(tokens, &[3])?;
    let allows_space = |grammar: Grammar, spaces: usize| -> Result<bool> {
        let mut p = grammar.compile(&vocab)?();
        let mut out = vec![0];
        out.extend(std::iter::repeat_n(2, spaces));
        let mut row = vec![0.0f32; 4];
        p.process(&History { prompt: &[3], generated: &out, drafted: &[] }, &mut row)?;
        Ok(row[2].is_finite())
    };
    assert!(allows_space(Grammar::json(), 19)?);
    assert!(!allows_space(Grammar::json(), 20)?);
    let unbounded = serde_json::json!({ "type": "object", "x-guidance": { "whitespace_flexible": true } });
    assert!(allows_space(Grammar::json_schema(unbounded), 200)?);
    Ok(())
}

/// The JSON grammar on the Qwen tokenizer, as the decoders use it: one processor handed
/// histories that branch and come back (a block's rejected drafts, a tree's siblings), each
/// mask equal to the mask of a fresh processor handed that history alone. The first history
/// pair is the one that caught llguidance 1.9's stale state (a mask computed after ` ["`, a
/// roll-back, then ` {"`: the key's `":` was refused), then random branches.
#[test]
fn json_masks_after_branches_and_roll_backs_equal_a_fresh_matchers() -> Result<()> {
    use rand::{RngExt, SeedableRng};
    let Some(path) = common::models::model_path(common::models::QWEN_1_5B) else { return Ok(()) };
    let tok = specdec::ModelFiles::Gguf(path).tokenizer()?;
    let vocab = tok.vocab_size();
    let json = Grammar::json().compile(&GrammarVocab::new(&tok)?)?;
    let allowed = |p: &mut Box<dyn specdec::LogitsProcessor>, out: &[u32]| -> Result<Vec<bool>> {
        let mut row = vec![0f32; vocab];
        p.process(&History { prompt: &[], generated: out, drafted: &[] }, &mut row)?;
        Ok(row.iter().map(|x| x.is_finite()).collect())
    };
    // `{"name": "search_flights", "arguments": {"` and its sibling `... "arguments": ["B`.
    let key: Vec<u32> = vec![4913, 606, 788, 330, 1836, 5081, 2796, 497, 330, 16370, 788, 5212];
    let mut array = key[..11].to_vec();
    array.extend([4383, 33]);
    let structural: Vec<u32> =
        ["{\"", " {\"", "[", " [\"", "\":", "\": \"", "\",", "\"]", "}", "]", "1", "true", ",", " "]
            .iter()
            .map(|s| tok.encode(s).map(|ids| ids[0]))
            .collect::<Result<_>>()?;
    let mut histories = vec![array, key.clone()];
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut trunk = key;
    for _ in 0..400 {
        // Back a few tokens from the trunk's end, then on by tokens the grammar allows there.
        let mut h = trunk[..trunk.len() - rng.random_range(0..=3.min(trunk.len()))].to_vec();
        for _ in 0..rng.random_range(0..4) {
            let ok = allowed(&mut json(), &h)?;
            let picks: Vec<u32> = structural.iter().copied().filter(|&t| ok[t as usize]).collect();
            let t = match picks.is_empty() || rng.random_bool(0.15) {
                true => loop {
                    let t = rng.random_range(0..vocab as u32);
                    if ok[t as usize] {
                        break t;
                    }
                },
                false => picks[rng.random_range(0..picks.len())],
            };
            h.push(t);
        }
        if rng.random_bool(0.5) {
            trunk = h.clone();
        }
        histories.push(h);
    }
    let mut p = json();
    for (i, h) in histories.iter().enumerate() {
        let (got, want) = (allowed(&mut p, h)?, allowed(&mut json(), h)?);
        let differ = (0..vocab).filter(|&t| got[t] != want[t]).count();
        assert_eq!(differ, 0, "history {i} ({:?}): {differ} tokens differ from a fresh matcher's mask", tok.decode(h)?);
    }
    Ok(())
}
