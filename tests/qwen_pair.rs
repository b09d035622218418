//! The real Qwen2.5-Coder pair (1.5B target, 0.5B draft, Qwen's own Q4_K_M files, held as
//! stored): its tokenizer against llama.cpp's token ids, its chat turns, and greedy speculative
//! decoding equal to plain greedy decoding with the 0.5B draft and with n-gram lookup.

mod common;

use std::sync::Arc;

use common::models::{model_path, QWEN_0_5B, QWEN_1_5B};
use specdec::{
    Drafter, DrafterSpec, Engine, Generation, Llama, LlamaWeights, LookupOr, ModelFiles, NGramDraft, Pair,
    PlainDecoder, Result, SamplingConfig, SpeculativeDecoder, Tokenizer, WeightFormat, DRAFT_VOCAB,
};

/// The model as stored, on the native engine at every SIMD level (`Engine::Auto` would pick
/// candle's quantized kernels at the portable level, whose products are not batch-invariant).
fn load(name: &str) -> Option<(Arc<LlamaWeights>, Tokenizer)> {
    let path = model_path(name)?;
    let files = ModelFiles::Gguf(path);
    Some(files.load_with(WeightFormat::Stored, &candle_core::Device::Cpu, Engine::Native).expect("the model loads"))
}

/// Texts and the ids llama.cpp 0c1e570's `llama-tokenize --ids --no-bos` gives for them on the
/// 1.5B file (the 0.5B file has the same token and merge lists): code, whitespace runs, digits,
/// non-ASCII, special tokens written in the text.
const REFERENCE: &[(&str, &[u32])] = &[
    (
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        &[
            750, 75698, 1445, 982, 262, 421, 308, 366, 220, 17, 510, 286, 470, 308, 198, 262, 470, 75698, 1445, 481,
            220, 16, 8, 488, 75698, 1445, 481, 220, 17, 340,
        ],
    ),
    (
        "    indented\t\ttabs   and    spaces\n\n\n  end  ",
        &[262, 1257, 15864, 197, 3244, 3435, 256, 323, 262, 12621, 1406, 220, 835, 256],
    ),
    (
        "Numbers: 1234567890, 3.14159, -42, 1e10 and 2026-12-01.",
        &[
            27237, 25, 220, 16, 17, 18, 19, 20, 21, 22, 23, 24, 15, 11, 220, 18, 13, 16, 19, 16, 20, 24, 11, 481, 19,
            17, 11, 220, 16, 68, 16, 15, 323, 220, 17, 15, 17, 21, 12, 16, 17, 12, 15, 16, 13,
        ],
    ),
    (
        "Café naïve résumé — 東京 日本語 Ünïcödé 😀 emoji 👍🏽!",
        &[
            34, 2577, 963, 94880, 586, 9333, 1242, 963, 1959, 60596, 109, 46553, 75402, 21894, 102819, 30512, 77,
            37572, 66, 2956, 128505, 90316, 42365, 61804, 235, 145375, 0,
        ],
    ),
    (
        "<|im_start|>user\nWhat's the time? I'll say it's 5 o'clock.<|im_end|>\n<|im_start|>assistant\n",
        &[
            151644, 872, 198, 3838, 594, 279, 882, 30, 358, 3278, 1977, 432, 594, 220, 20, 297, 62410, 13, 151645, 198,
            151644, 77091, 198,
        ],
    ),
    (
        "fn main() { let x: Vec<u32> = (0..10).map(|i| i * i).collect(); println!(\"{x:?}\"); }",
        &[
            8822, 1887, 368, 314, 1077, 856, 25, 11312, 34837, 18, 17, 29, 284, 320, 15, 496, 16, 15, 568, 2186, 22428,
            72, 91, 600, 353, 600, 568, 17384, 2129, 13751, 88928, 87, 76475, 92, 5038, 335,
        ],
    ),
    ("HELLO World's CAPS'LL DON'T", &[50712, 1593, 4337, 594, 26101, 50, 6, 4086, 44273, 17323]),
];

#[test]
fn qwen_tokenizer_matches_llama_cpp() -> Result<()> {
    let Some(path) = model_path(QWEN_1_5B) else { return Ok(()) };
    let tok = ModelFiles::Gguf(path).tokenizer()?;
    for &(text, ids) in REFERENCE {
        assert_eq!(tok.encode(text)?, ids, "{text:?}");
        assert_eq!(tok.decode(ids)?, text.replace("<|im_start|>", "").replace("<|im_end|>", ""), "{text:?}");
    }
    Ok(())
}

#[test]
fn qwen_chat_turns_and_end_of_turn() -> Result<()> {
    let Some(path) = model_path(QWEN_1_5B) else { return Ok(()) };
    let tok = ModelFiles::Gguf(path).tokenizer()?;
    // Qwen2.5's template inserts its default system turn when the conversation has none.
    assert_eq!(
        tok.chat_prompt("Hi"),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode(&tok.chat_prompt("Hi"))?;
    assert_eq!(ids[0], 151_644, "<|im_start|> first, no BOS");
    assert!(tok.stop_ids().contains(&151_645), "<|im_end|> ends a turn");
    Ok(())
}

fn assert_same(what: &str, out: &Generation, plain: &Generation, tok: &Tokenizer) {
    assert_eq!(out.tokens, plain.tokens, "{what}: {:?} vs {:?}", tok.decode(&out.tokens), tok.decode(&plain.tokens));
}

/// A prompt that asks to edit given code: the answer repeats most of the prompt, where n-gram
/// lookup drafts well.
const EDIT: &str = "Rename the parameter `n` to `count` in this function and return the whole function:\n\n\
```python\ndef repeat(text, n):\n    out = []\n    for i in range(n):\n        out.append(text)\n    return out\n```";

#[test]
fn qwen_pair_greedy_speculative_equals_plain() -> Result<()> {
    let Some((target, tok)) = load(QWEN_1_5B) else { return Ok(()) };
    let Some((draft, _)) = load(QWEN_0_5B) else { return Ok(()) };
    let stop = tok.stop_ids();
    let new_tokens = 20;
    for prompt in ["Write a Python function that checks whether a number is prime.", EDIT] {
        let ids = tok.encode(&tok.chat_prompt(prompt))?;
        let plain = PlainDecoder::new(Llama::new(target.clone())?, SamplingConfig::greedy())
            .max_new_tokens(new_tokens)
            .stop_tokens(stop.clone())
            .generate(&ids)?;
        let vocab = target.config().vocab_size;
        let drafters = [
            ("0.5B, k = 3", Drafter::Model(Llama::new(draft.clone())?), Some(3)),
            ("0.5B, adaptive k", Drafter::Model(Llama::new(draft.clone())?), None),
            ("n-gram, k = 4", Drafter::NGram(NGramDraft::new(vocab)?), Some(4)),
            ("n-gram or 0.5B, k = 4", Drafter::Lookup(LookupOr::new(Llama::new(draft.clone())?)?), Some(4)),
            ("0.5B over part of the vocabulary, adaptive k", limited(Llama::new(draft.clone())?, &tok)?, None),
            (
                "0.5B as `model:PATH` builds it (compact: Q4_1 for its wider types), forked as a server's slot, k = 3",
                forked(built_draft(&target, &tok)?)?,
                Some(3),
            ),
        ];
        for (what, drafter, k) in drafters {
            let mut builder = SpeculativeDecoder::builder(Pair { target: Llama::new(target.clone())?, draft: drafter })
                .max_new_tokens(new_tokens)
                .stop_tokens(stop.clone());
            if let Some(k) = k {
                builder = builder.k(k);
            }
            let out = builder.build()?.generate(&ids)?;
            let what = format!("{what}, prompt {prompt:?}");
            assert_same(&what, &out, &plain, &tok);
            if k.is_some() {
                assert!(out.stats.accepted > 0, "{what}: no draft was accepted");
            }
        }
    }
    Ok(())
}

/// The 0.5B draft as `llama_spec --draft PATH` builds it: its weights compact (its Q5_0,
/// Q6_K and Q8_0 matrices re-quantized to Q4_1 at load), its head limited to part of the
/// vocabulary.
fn built_draft(target: &Arc<LlamaWeights>, tok: &Tokenizer) -> Result<Drafter> {
    let files = ModelFiles::Gguf(model_path(QWEN_1_5B).expect("loaded"));
    let draft = model_path(QWEN_0_5B).expect("loaded");
    let spec: DrafterSpec = format!("model:{}", draft.display()).parse()?;
    let drafter = Drafter::build(&spec, &files, &mut Llama::new(target.clone())?, tok, &candle_core::Device::Cpu)?;
    assert!(matches!(drafter, Drafter::Model(_)), "{spec}");
    Ok(drafter)
}

/// A drafter's fork for another sequence (what a server makes for each slot): the same
/// limit on the draft's vocabulary.
fn forked(drafter: Drafter) -> Result<Drafter> {
    let fork = drafter.fork()?;
    assert!(drafter.note().is_some(), "the built draft is limited");
    assert_eq!(fork.note(), drafter.note());
    Ok(fork)
}

/// A model draft that scores only the first [`DRAFT_VOCAB`] ids and the added tokens, as
/// `Drafter::build` makes it.
fn limited(draft: Llama, tok: &Tokenizer) -> Result<Drafter> {
    let mut drafter = Drafter::Model(draft);
    let rows = drafter.limit_vocabulary(tok, Some(DRAFT_VOCAB))?;
    assert_eq!(rows, Some(DRAFT_VOCAB + tok.added_ids().len()), "every added token lies past the first ids");
    Ok(drafter)
}

/// A model limited to part of its vocabulary scores those ids bit for bit as the whole head
/// does (alone and in a batch, where the rows of differently limited models are masked), and
/// the rest −∞; given the whole vocabulary back, it scores everything again.
#[test]
fn a_limited_output_scores_its_ids_as_the_whole_head_does() -> Result<()> {
    use specdec::{TargetModel, TokenModel};
    let Some((w, tok)) = load(QWEN_0_5B) else { return Ok(()) };
    let ids = tok.encode(&tok.chat_prompt("Write a function that reverses a string."))?;
    let keep: Vec<u32> = (0..1000).chain([70_000, 151_645]).collect();
    let mut full = Llama::new(w.clone())?;
    let whole = full.forward(&ids, 3)?;
    let mut part = Llama::new(w.clone())?;
    assert!(part.limit_output(Some(&keep))?);
    assert_eq!(part.output_limit(), Some(keep.len()));
    let mut other = Llama::new(w.clone())?;
    other.limit_output(Some(&keep[..10]))?;
    let alone = part.forward(&ids, 3)?;
    part.truncate(0)?;
    let batch = Llama::forward_batch(&mut [&mut part, &mut other], &[(&ids[..], 3), (&ids[..], 3)])?;
    for (what, rows, kept) in
        [("alone", &alone, &keep[..]), ("batched", &batch[0], &keep[..]), ("other", &batch[1], &keep[..10])]
    {
        for r in 0..3 {
            for (id, (a, b)) in rows.row(r).iter().zip(whole.row(r)).enumerate() {
                match kept.contains(&(id as u32)) {
                    true => assert_eq!(a.to_bits(), b.to_bits(), "{what}: row {r}, id {id}"),
                    false => assert_eq!(*a, f32::NEG_INFINITY, "{what}: row {r}, id {id}"),
                }
            }
        }
    }
    part.truncate(0)?;
    part.limit_output(None)?;
    assert_eq!(part.output_limit(), None);
    let again = part.forward(&ids, 3)?;
    assert!((0..3).all(|r| again.row(r).iter().zip(whole.row(r)).all(|(a, b)| a.to_bits() == b.to_bits())));
    for bad in [&[][..], &[151_936][..]] {
        assert!(matches!(part.limit_output(Some(bad)), Err(specdec::Error::InvalidSetting { .. })), "{bad:?}");
    }
    Ok(())
}

/// A limited model takes in the ids its context brings beyond the limit: each added id scores
/// bit for bit as the whole head does, ids already kept or past the vocabulary add nothing,
/// and an unlimited model is left as it is.
#[test]
fn a_limited_output_takes_in_the_ids_its_context_brings() -> Result<()> {
    use specdec::TargetModel;
    let Some((w, tok)) = load(QWEN_0_5B) else { return Ok(()) };
    let ids = tok.encode(&tok.chat_prompt("Write a function that reverses a string."))?;
    let mut outside: Vec<u32> = ids.iter().copied().filter(|&t| t >= 1000).collect();
    outside.sort_unstable();
    outside.dedup();
    let whole = Llama::new(w.clone())?.forward(&ids, 2)?;
    let mut part = Llama::new(w.clone())?;
    part.limit_output(Some(&(0..1000).collect::<Vec<u32>>()))?;
    assert_eq!(part.keep_outputs(&ids)?, outside.len());
    assert_eq!(part.output_limit(), Some(1000 + outside.len()));
    assert_eq!(part.keep_outputs(&[ids[3], 5, 151_936])?, 0, "kept already, or past the vocabulary");
    let rows = part.forward(&ids, 2)?;
    for r in 0..2 {
        for (id, (a, b)) in rows.row(r).iter().zip(whole.row(r)).enumerate() {
            match id < 1000 || outside.contains(&(id as u32)) {
                true => assert_eq!(a.to_bits(), b.to_bits(), "row {r}, id {id}"),
                false => assert_eq!(*a, f32::NEG_INFINITY, "row {r}, id {id}"),
            }
        }
    }
    let mut unlimited = Llama::new(w)?;
    assert_eq!(unlimited.keep_outputs(&ids)?, 0);
    assert_eq!(unlimited.output_limit(), None);
    Ok(())
}

/// Batch invariance on the real model: each position's logits are bit for bit the same scored
/// alone (plain decoding) or among the rows of one verification call, so greedy speculation
/// equals plain greedy decoding by construction.
#[test]
fn qwen_rows_are_bit_identical_alone_or_verified_together() -> Result<()> {
    use specdec::TargetModel;
    for name in [QWEN_1_5B, QWEN_0_5B] {
        let Some((w, tok)) = load(name) else { return Ok(()) };
        let ids = tok.encode(&tok.chat_prompt("Write a function that reverses a string."))?;
        let (head, tail) = ids.split_at(ids.len() - 9);
        let mut one = Llama::new(w.clone())?;
        one.forward(head, 0)?;
        let alone: Vec<Vec<f32>> =
            tail.iter().map(|&t| Ok(one.forward(&[t], 1)?.row(0).to_vec())).collect::<Result<_>>()?;
        let mut many = Llama::new(w)?;
        many.forward(head, 0)?;
        let together = many.forward(tail, tail.len())?;
        for (i, row) in alone.iter().enumerate() {
            let same = row.iter().zip(together.row(i)).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name}: row {i} of 9 differs from the same position scored alone");
        }
    }
    Ok(())
}

/// Greedy with penalties, a logit bias and a banned token: the 0.5B and n-gram drafts emit
/// what plain decoding with the same processors emits.
#[test]
fn qwen_pair_greedy_with_processors_equals_plain() -> Result<()> {
    let Some((target, tok)) = load(QWEN_1_5B) else { return Ok(()) };
    let Some((draft, _)) = load(QWEN_0_5B) else { return Ok(()) };
    let ids = tok.encode(&tok.chat_prompt(EDIT))?;
    let cfg = SamplingConfig::greedy()
        .with_repetition_penalty(1.1)?
        .with_presence_penalty(0.4)?
        .with_frequency_penalty(0.2)?
        .with_logit_bias(tok.encode("out")?[0], -2.0)?
        .with_banned(tok.encode("repeat")?.into_iter().take(1));
    let plain = PlainDecoder::new(Llama::new(target.clone())?, cfg.clone())
        .max_new_tokens(24)
        .stop_tokens(tok.stop_ids())
        .generate(&ids)?;
    let unprocessed =
        PlainDecoder::new(Llama::new(target.clone())?, SamplingConfig::greedy()).max_new_tokens(24).generate(&ids)?;
    assert_ne!(plain.tokens, unprocessed.tokens, "the processors changed nothing");
    let vocab = target.config().vocab_size;
    for (what, drafter) in
        [("0.5B", Drafter::Model(Llama::new(draft.clone())?)), ("n-gram", Drafter::NGram(NGramDraft::new(vocab)?))]
    {
        let mut spec = SpeculativeDecoder::builder(Pair { target: Llama::new(target.clone())?, draft: drafter })
            .k(3)
            .sampling(cfg.clone())
            .max_new_tokens(24)
            .stop_tokens(tok.stop_ids())
            .build()?;
        let out = spec.generate(&ids)?;
        assert_same(&format!("processors, {what}"), &out, &plain, &tok);
        assert!(out.stats.drafted > 0, "{what}: nothing drafted");
    }
    Ok(())
}

/// The JSON benchmark (`benches/prompts/json.txt`, its schemas in `schemas/`): with each
/// schema as a grammar, greedy speculative output with the 0.5B draft equals plain decoding
/// with the same grammar, ends by itself, and validates against its schema (checked by the
/// `jsonschema` crate, apart from the grammar); sampled at temperature 0.8, it still does.
#[cfg(feature = "grammar")]
#[test]
fn qwen_pair_json_benchmark_output_is_schema_valid_and_equals_plain() -> Result<()> {
    use specdec::grammar::{Grammar, GrammarVocab};
    use specdec::FinishReason;
    let Some((target, tok)) = load(QWEN_1_5B) else { return Ok(()) };
    let Some((draft, _)) = load(QWEN_0_5B) else { return Ok(()) };
    let vocab = GrammarVocab::new(&tok)?;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/prompts");
    let lines = std::fs::read_to_string(format!("{dir}/json.txt"))?;
    let (mut forced, mut total) = (0, 0);
    for line in lines.lines().filter(|l| !l.trim().is_empty()) {
        let (name, prompt) = line.split_once('\t').expect("SCHEMA<TAB>PROMPT");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{dir}/schemas/{name}.json"))?).expect("a schema");
        let cfg = SamplingConfig::greedy().with_processor(Grammar::json_schema(schema.clone()).compile(&vocab)?);
        let ids = tok.encode(&tok.chat_prompt(&prompt.replace("\\n", "\n")))?;
        let plain = PlainDecoder::new(Llama::new(target.clone())?, cfg.clone())
            .max_new_tokens(256)
            .stop_tokens(tok.stop_ids())
            .generate(&ids)?;
        let mut spec = SpeculativeDecoder::builder(Pair {
            target: Llama::new(target.clone())?,
            draft: Llama::new(draft.clone())?,
        })
        .sampling(cfg)
        .max_new_tokens(256)
        .stop_tokens(tok.stop_ids())
        .build()?;
        let out = spec.generate(&ids)?;
        assert_same(&format!("JSON schema {name}"), &out, &plain, &tok);
        assert_eq!(out.finish, FinishReason::Stop, "{name}: {}", tok.decode(&out.tokens)?);
        let text = tok.decode(&out.tokens)?;
        let value: serde_json::Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{name}: {e}: {text}"));
        assert!(jsonschema::is_valid(&schema, &value), "{name}: {text} does not validate");
        eprintln!("{name}: {} tokens, {} forced: {text}", out.stats.new_tokens, out.stats.forced_tokens);
        (forced, total) = (forced + out.stats.forced_tokens, total + out.stats.new_tokens);
        // Sampled at temperature 0.8: still JSON that validates.
        spec.set_sampling(
            SamplingConfig::new(0.8)?
                .with_seed(3)
                .with_processor(Grammar::json_schema(schema.clone()).compile(&vocab)?),
        )?;
        let out = spec.generate(&ids)?;
        let text = tok.decode(&out.tokens)?;
        assert_eq!(out.finish, FinishReason::Stop, "{name}, sampled: {text}");
        let value: serde_json::Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{name}, sampled: {e}: {text}"));
        assert!(jsonschema::is_valid(&schema, &value), "{name}, sampled: {text} does not validate");
    }
    assert!(forced > 0, "no token was forced");
    eprintln!("{forced} of {total} tokens forced");
    Ok(())
}
