//! Log-probabilities under speculation: every emitted token's values (raw and processed, and
//! its row's top alternatives) equal plain decoding's to the last bit, for chains, trees,
//! batches and every drafter, greedy and under coupled sampling; and they are the law's own
//! (checked against the toy model's table, computed apart from the crate).

mod common;

use std::sync::Arc;

use common::models::{model_path, QWEN_0_5B, QWEN_1_5B, SMOLLM2};
use specdec::batch::{BatchDecoder, Request};
use specdec::toy::{MarkovModel, ToyPair};
use specdec::{
    Drafter, Engine, Generation, KPolicy, Llama, LlamaWeights, LogprobMode, Logprobs, ModelFiles, NGramDraft, Pair,
    PlainDecoder, Result, SamplingConfig, SpeculativeDecoder, SuffixCache, SuffixDraft, Tokenizer, TreeBudget,
    TreePolicy, WeightFormat,
};

/// Two generations agree token for token and logprob for logprob (bits), each token with one.
fn assert_same(what: &str, out: &Generation, plain: &Generation) {
    assert_eq!(out.tokens, plain.tokens, "{what}: the tokens");
    assert_eq!(out.logprobs.len(), out.tokens.len(), "{what}: a value per token");
    for (j, (a, b)) in out.logprobs.iter().zip(&plain.logprobs).enumerate() {
        let bits = |t: &specdec::TokenLogprob| {
            (t.token, t.logprob.to_bits(), t.top.iter().map(|&(i, x)| (i, x.to_bits())).collect::<Vec<_>>())
        };
        assert_eq!(bits(a), bits(b), "{what}: token {j}");
    }
}

/// The settings under test: greedy and coupled sampling (where speculative text is plain
/// text), raw and processed, some with penalties that make the two modes differ.
fn settings(top: usize) -> Result<Vec<(&'static str, SamplingConfig)>> {
    let raw = Logprobs::new(top, LogprobMode::Raw)?;
    let processed = Logprobs::new(top, LogprobMode::Processed)?;
    Ok(vec![
        ("greedy, raw", SamplingConfig::greedy().with_logprobs(raw)),
        (
            "greedy, processed, penalties",
            SamplingConfig::greedy().with_repetition_penalty(1.3)?.with_logprobs(processed),
        ),
        (
            "coupled 0.9 top-k 8, raw",
            SamplingConfig::new(0.9)?.with_top_k(8)?.coupled().with_seed(3).with_logprobs(raw),
        ),
        (
            "coupled 0.7 top-p 0.9, processed, penalties",
            SamplingConfig::new(0.7)?
                .with_top_p(0.9)?
                .with_frequency_penalty(0.5)?
                .coupled()
                .with_seed(4)
                .with_logprobs(processed),
        ),
    ])
}

/// On the toy pair: plain, chains, trees and a batch of four emit the same values, and those
/// are the log of the toy table's row (raw) and of the law computed apart from the crate
/// (processed, without penalties).
#[test]
fn toy_logprobs_are_plain_decodings_under_every_shape() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(24, 0.3, 11);
    let prompt = [1, 2, 3];
    for (what, cfg) in settings(5)? {
        let plain = PlainDecoder::new(target.clone(), cfg.clone()).max_new_tokens(40).generate(&prompt)?;
        assert_eq!(plain.logprobs.len(), 40, "{what}");
        let tree = TreePolicy::Always("3x3x8".parse::<TreeBudget>()?);
        for (shape, policy, trees) in [
            ("k = 3", KPolicy::Fixed(3), TreePolicy::Never),
            ("adaptive", KPolicy::default(), TreePolicy::Never),
            ("tree", KPolicy::Fixed(3), tree),
        ] {
            let mut spec = SpeculativeDecoder::builder(Pair { target: target.clone(), draft: draft.clone() })
                .k_policy(policy)
                .tree(trees)
                .sampling(cfg.clone())
                .max_new_tokens(40)
                .build()?;
            assert_same(&format!("{what}, {shape}"), &spec.generate(&prompt)?, &plain);
            assert_eq!(spec.logprobs(), &plain.logprobs[..], "{what}, {shape}: the decoder's own view");
        }
        let mut batch = BatchDecoder::new(KPolicy::Fixed(2))?;
        for _ in 0..4 {
            batch.add(
                Pair { target: target.clone(), draft: draft.clone() },
                Request::new(prompt.to_vec()).sampling(cfg.clone()).max_new_tokens(40),
            )?;
        }
        for f in batch.run()? {
            assert_same(&format!("{what}, batch of 4"), &f.generation, &plain);
        }
        let mut ctx = prompt.to_vec();
        for (j, value) in plain.logprobs.iter().enumerate() {
            let row = target.next_probs(&ctx);
            let expected = match (what.contains("raw"), what.contains("penalties")) {
                (true, _) => (row[value.token as usize] as f64).ln(),
                (false, false) => common::processed_row(&target, &cfg, &ctx)[value.token as usize].ln(),
                (false, true) => f64::NAN,
            };
            if !expected.is_nan() {
                assert!(
                    (value.logprob as f64 - expected).abs() < 1e-5,
                    "{what}, token {j}: {} vs {expected}",
                    value.logprob
                );
            }
            let tops: Vec<f32> = value.top.iter().map(|t| t.1).collect();
            assert!(tops.len() == 5 && tops.windows(2).all(|w| w[0] >= w[1]), "{what}, token {j}: {tops:?}");
            assert!(value.logprob <= tops[0], "{what}, token {j}: the token above the top");
            ctx.push(value.token);
        }
    }
    Ok(())
}

/// A generation that does not ask carries none; asking more than 20 alternatives is refused.
#[test]
fn logprobs_only_when_asked_and_at_most_twenty() -> Result<()> {
    let ToyPair { target, draft } = MarkovModel::pair(16, 0.2, 7);
    let out = SpeculativeDecoder::builder(Pair { target, draft }).k(3).max_new_tokens(10).build()?.generate(&[1])?;
    assert!(out.logprobs.is_empty());
    assert!(Logprobs::new(20, LogprobMode::Processed).is_ok());
    assert!(matches!(Logprobs::new(21, LogprobMode::Raw), Err(specdec::Error::InvalidSetting { .. })));
    Ok(())
}

/// The model as stored, on the native engine (batch-invariant rows at every SIMD level).
fn load(name: &str, format: WeightFormat) -> Option<(Arc<LlamaWeights>, Tokenizer)> {
    let files = ModelFiles::Gguf(model_path(name)?);
    Some(files.load_with(format, &candle_core::Device::Cpu, Engine::Native).expect("the model loads"))
}

/// Runs `cfg` plainly and with each drafter (the tree ones as trees), and checks them equal.
fn check_drafters(
    what: &str,
    (target, ids, cfg): (&Arc<LlamaWeights>, &[u32], &SamplingConfig),
    stop: &[u32],
    drafters: Vec<(&str, Drafter, TreePolicy)>,
) -> Result<()> {
    let plain = PlainDecoder::new(Llama::new(target.clone())?, cfg.clone())
        .max_new_tokens(16)
        .stop_tokens(stop.to_vec())
        .generate(ids)?;
    for (name, drafter, tree) in drafters {
        let mut spec = SpeculativeDecoder::builder(Pair { target: Llama::new(target.clone())?, draft: drafter })
            .k(3)
            .tree(tree)
            .sampling(cfg.clone())
            .max_new_tokens(16)
            .stop_tokens(stop.to_vec())
            .build()?;
        let out = spec.generate(ids)?;
        assert_same(&format!("{what}, {name}"), &out, &plain);
        if matches!(tree, TreePolicy::Always(_)) {
            assert!(out.stats.tree_rounds > 0, "{what}, {name}: no tree round");
        }
    }
    Ok(())
}

/// SmolLM2, greedy and coupled: a model draft (its weights at Q8_0) in chains and trees,
/// n-gram and suffix drafts, a JSON grammar, and a batch of 8 over different prompts.
#[test]
fn smollm2_logprobs_equal_plain_decodings() -> Result<()> {
    let Some((w, tok)) = load(SMOLLM2, WeightFormat::Stored) else { return Ok(()) };
    let Some((draft_w, _)) = load(SMOLLM2, "q8_0".parse()?) else { return Ok(()) };
    let (target, vocab, stop) = (&w, w.config().vocab_size, tok.stop_ids());
    let ids = tok.encode(&tok.chat_prompt("List three uses of a paperclip."))?;
    let tree = TreePolicy::Always("2x4x10".parse::<TreeBudget>()?);
    for (what, cfg) in settings(5)? {
        let suffix = SuffixCache::new(vocab, 1 << 12)?;
        suffix.insert(&ids)?;
        let drafters = vec![
            ("model draft", Drafter::Model(Llama::new(draft_w.clone())?), TreePolicy::Never),
            ("model tree", Drafter::Model(Llama::new(draft_w.clone())?), tree),
            ("n-gram", Drafter::NGram(NGramDraft::new(vocab)?), TreePolicy::Never),
            ("n-gram tree", Drafter::NGram(NGramDraft::new(vocab)?), tree),
            ("suffix", Drafter::Suffix(SuffixDraft::new(suffix)?), TreePolicy::Never),
        ];
        check_drafters(&format!("SmolLM2, {what}"), (target, &ids, &cfg), &stop, drafters)?;
    }
    #[cfg(feature = "grammar")]
    {
        use specdec::grammar::{Grammar, GrammarVocab};
        let json = Grammar::json().compile(&GrammarVocab::new(&tok)?)?;
        let ids = tok.encode(&tok.chat_prompt("Describe a cat as a JSON object."))?;
        for mode in [LogprobMode::Raw, LogprobMode::Processed] {
            let cfg = SamplingConfig::greedy().with_processor(json.clone()).with_logprobs(Logprobs::new(3, mode)?);
            let drafters = vec![
                ("model draft", Drafter::Model(Llama::new(draft_w.clone())?), TreePolicy::Never),
                ("model tree", Drafter::Model(Llama::new(draft_w.clone())?), tree),
            ];
            check_drafters(&format!("SmolLM2, JSON grammar, {mode:?}"), (target, &ids, &cfg), &stop, drafters)?;
        }
    }
    batch_of_eight(&w, &draft_w, &tok)
}

/// Eight different prompts in one batch with model drafts, each against its own plain run.
fn batch_of_eight(w: &Arc<LlamaWeights>, draft_w: &Arc<LlamaWeights>, tok: &Tokenizer) -> Result<()> {
    let cfg = SamplingConfig::greedy().with_logprobs(Logprobs::new(4, LogprobMode::Raw)?);
    let topics = ["the sea", "a cat", "bread", "rain", "a clock", "the moon", "a bicycle", "snow"];
    let prompts: Vec<Vec<u32>> = topics
        .iter()
        .map(|t| tok.encode(&tok.chat_prompt(&format!("Write one sentence about {t}."))))
        .collect::<Result<_>>()?;
    let mut batch = BatchDecoder::new(KPolicy::Fixed(3))?;
    let mut ids = Vec::new();
    for p in &prompts {
        let request = Request::new(p.clone()).sampling(cfg.clone()).max_new_tokens(12).stop_tokens(tok.stop_ids());
        ids.push(batch.add(Pair { target: Llama::new(w.clone())?, draft: Llama::new(draft_w.clone())? }, request)?);
    }
    let done = batch.run()?;
    for (id, prompt) in ids.iter().zip(&prompts) {
        let out = &done.iter().find(|f| f.id == *id).expect("finished").generation;
        let plain = PlainDecoder::new(Llama::new(w.clone())?, cfg.clone())
            .max_new_tokens(12)
            .stop_tokens(tok.stop_ids())
            .generate(prompt)?;
        assert_same(&format!("SmolLM2, batch of 8, sequence {id:?}"), out, &plain);
    }
    Ok(())
}

/// The Qwen pair, greedy and coupled, raw and processed, with the 0.5B draft in chains and
/// trees; and under a JSON schema, chains and trees.
#[test]
fn qwen_pair_logprobs_equal_plain_decodings() -> Result<()> {
    let Some((w, tok)) = load(QWEN_1_5B, WeightFormat::Stored) else { return Ok(()) };
    let Some((draft_w, _)) = load(QWEN_0_5B, WeightFormat::Stored) else { return Ok(()) };
    let ids = tok.encode(&tok.chat_prompt("Write a Python function that checks whether a number is prime."))?;
    let tree = TreePolicy::Always("2x4x10".parse::<TreeBudget>()?);
    let all = settings(5)?;
    for (what, cfg) in [&all[0], &all[3]] {
        let drafters = vec![
            ("0.5B chains", Drafter::Model(Llama::new(draft_w.clone())?), TreePolicy::Never),
            ("0.5B trees", Drafter::Model(Llama::new(draft_w.clone())?), tree),
        ];
        check_drafters(&format!("Qwen, {what}"), (&w, &ids, cfg), &tok.stop_ids(), drafters)?;
    }
    // A JSON schema (a grammar as a processor), trees and chains: each tree node's row is
    // processed for its own path.
    #[cfg(feature = "grammar")]
    {
        use specdec::grammar::{Grammar, GrammarVocab};
        let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"},
            "is_prime": {"type": "boolean"}}, "required": ["name", "is_prime"], "additionalProperties": false});
        let grammar = Grammar::json_schema(schema).compile(&GrammarVocab::new(&tok)?)?;
        let ids = tok.encode(&tok.chat_prompt("Is 7 prime? Answer as JSON with a name and is_prime."))?;
        let cfg =
            SamplingConfig::greedy().with_processor(grammar).with_logprobs(Logprobs::new(3, LogprobMode::Processed)?);
        let drafters = vec![
            ("0.5B chains", Drafter::Model(Llama::new(draft_w.clone())?), TreePolicy::Never),
            ("0.5B trees", Drafter::Model(Llama::new(draft_w.clone())?), tree),
        ];
        check_drafters("Qwen, a JSON schema", (&w, &ids, &cfg), &tok.stop_ids(), drafters)?;
    }
    Ok(())
}
