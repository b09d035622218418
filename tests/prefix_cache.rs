//! The prefix cache changes no output bit: rows do not depend on where a prefill splits, and a
//! conversation served from the cache (both models' states restored) emits the tokens of one
//! that prefilled everything, greedy and seeded, for the plain decoder, model, n-gram and
//! suffix+model drafts, chains and trees, and batches of 8 sequences over one system prompt;
//! the cache stays within its budget.

mod common;

use std::sync::Arc;

use candle_core::Device;
use common::models::{model_path, QWEN_0_5B, QWEN_1_5B, SMOLLM2};
use specdec::batch::{BatchDecoder, Request};
use specdec::{
    DraftModel, Drafter, Engine, KPolicy, Llama, LlamaWeights, LookupOr, ModelFiles, NGramDraft, Pair, PlainDecoder,
    PrefixCache, Result, SamplingConfig, SpeculativeDecoder, SuffixCache, SuffixDraft, TargetModel, TokenModel,
    Tokenizer, TreePolicy, WeightFormat,
};

/// SmolLM2 as `llama_spec` runs it: the f32 target and its own Q4_1 weights as the draft, on
/// the native engine (the one that hands out rows).
fn smol() -> Option<(Arc<LlamaWeights>, Arc<LlamaWeights>, Tokenizer)> {
    let files = ModelFiles::Gguf(model_path(SMOLLM2)?);
    let (target, tok) = files.load_with(WeightFormat::F32, &Device::Cpu, Engine::Native).expect("loads");
    let (draft, _) = files.load_with(WeightFormat::Stored, &Device::Cpu, Engine::Native).expect("loads");
    Some((target, draft, tok))
}

/// The Qwen pair as stored; not at the portable SIMD level, whose scalar quantized kernels
/// take minutes per generation of the 1.5B.
fn qwen() -> Option<(Arc<LlamaWeights>, Arc<LlamaWeights>, Tokenizer)> {
    if std::env::var("SPECDEC_SIMD").is_ok_and(|l| l == "portable") {
        return None;
    }
    let load = |name| {
        let files = ModelFiles::Gguf(model_path(name)?);
        Some(files.load_with(WeightFormat::Stored, &Device::Cpu, Engine::Native).expect("loads"))
    };
    let (target, tok) = load(QWEN_1_5B)?;
    Some((target, load(QWEN_0_5B)?.0, tok))
}

const SYSTEM: &str = "You are a careful assistant. Answer in one or two short sentences, and say so when you \
                      do not know. Prefer plain words to jargon.";

const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "Name three fruits that are red.",
    "How many legs does a spider have?",
    "What does a bee make?",
    "Which planet is closest to the sun?",
    "What is ice made of?",
    "Who wrote Hamlet?",
];

/// The first turn of conversation `i` (the system prompt, then its question).
fn first_turn(tok: &Tokenizer, i: usize) -> Vec<u32> {
    tok.encode(&format!(
        "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        QUESTIONS[i]
    ))
    .expect("encodes")
}

/// The next prompt of a conversation: the last prompt, the model's answer, a new question.
fn next_turn(tok: &Tokenizer, prompt: &[u32], answer: &[u32], question: &str) -> Vec<u32> {
    let mut next = prompt.to_vec();
    next.extend_from_slice(answer);
    next.extend(
        tok.encode(&format!("<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"))
            .expect("encodes"),
    );
    next
}

fn bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every row that follows a prompt is the same bit for bit whether the prompt was fed in one
/// call, split in two anywhere, or its head restored from another model's saved rows.
#[test]
fn rows_do_not_depend_on_where_the_prefill_splits() -> Result<()> {
    let Some((target, draft, tok)) = smol() else { return Ok(()) };
    let ids = first_turn(&tok, 1);
    let mut weights = vec![target, draft];
    if let Some((t, _, _)) = qwen() {
        weights.push(t);
    }
    for w in weights {
        let mut whole = Llama::new(w.clone())?;
        let want = whole.forward(&ids, 1)?;
        for split in [1, 5, 16, 17, ids.len() / 2, ids.len() - 1] {
            let mut split_model = Llama::new(w.clone())?;
            split_model.forward(&ids[..split], 0)?;
            let got = split_model.forward(&ids[split..], 1)?;
            assert!(bits(got.as_slice(), want.as_slice()), "split at {split}");
            let mut saved = Llama::new(w.clone())?;
            saved.forward(&ids[..split], 0)?;
            let rows = saved.save_rows(0).expect("native rows");
            assert_eq!(rows.len(), split);
            let mut restored = Llama::new(w.clone())?;
            restored.forward(&[7, 8, 9], 0)?; // a context the restore replaces
            assert!(restored.restore_rows(&ids[..split], &rows)?);
            assert_eq!(restored.context_len(), split);
            let got = restored.forward(&ids[split..], 1)?;
            assert!(bits(got.as_slice(), want.as_slice()), "restored at {split}");
        }
    }
    Ok(())
}

/// Rows of another model's width are refused and change nothing.
#[test]
fn rows_of_another_model_are_refused() -> Result<()> {
    let Some((target, draft, tok)) = smol() else { return Ok(()) };
    let ids = first_turn(&tok, 0);
    let mut small = Llama::with_layers(draft, vec![0, 1])?;
    small.forward(&ids, 0)?;
    let rows = small.save_rows(0).expect("rows");
    let mut big = Llama::new(target)?;
    big.forward(&ids[..4], 0)?;
    assert!(!big.restore_rows(&ids, &rows)?);
    assert_eq!(big.context_len(), 4);
    Ok(())
}

/// Three turns of one conversation on `dec`: each turn's output and the prompt tokens its
/// target took from the cache.
fn converse<T: TargetModel, D: DraftModel>(
    dec: &mut SpeculativeDecoder<T, D>,
    tok: &Tokenizer,
    i: usize,
) -> Result<Vec<(Vec<u32>, usize)>> {
    let mut prompt = first_turn(tok, i);
    let mut out = Vec::new();
    for q in ["Say it again, shorter.", "And once more, in French."] {
        let g = dec.generate(&prompt)?;
        out.push((g.tokens.clone(), g.stats.prefix_hit_tokens));
        prompt = next_turn(tok, &prompt, &g.tokens, q);
    }
    let g = dec.generate(&prompt)?;
    out.push((g.tokens, g.stats.prefix_hit_tokens));
    Ok(out)
}

/// The same conversation with and without a cache: the same tokens every turn, and the later
/// turns hit (the last prompt and the model's answer to it).
fn same_with_and_without<T: TargetModel, D: DraftModel>(
    what: &str,
    tok: &Tokenizer,
    make: impl Fn(Option<PrefixCache>) -> Result<SpeculativeDecoder<T, D>>,
) -> Result<()> {
    let cache = PrefixCache::new(256 << 20);
    let with = converse(&mut make(Some(cache.clone()))?, tok, 2)?;
    let without = converse(&mut make(None)?, tok, 2)?;
    for (turn, ((a, hit), (b, none))) in with.iter().zip(&without).enumerate() {
        assert_eq!(a, b, "{what}: turn {turn}");
        assert_eq!(*none, 0);
        if turn > 0 {
            assert!(*hit > 0, "{what}: turn {turn} missed the cache");
        }
    }
    let s = cache.stats();
    assert!(s.hits >= 2 && s.draft_hit_tokens > 0 || what.starts_with("ngram"), "{what}: {s:?}");
    Ok(())
}

/// What a conversation test varies: the sampling, the k policy and chains or trees.
type Settings = (SamplingConfig, KPolicy, TreePolicy);

/// A decoder of SmolLM2 drafting with `drafter`, 20 tokens a turn, with `cache` if given.
fn decoder(
    target: &Arc<LlamaWeights>,
    drafter: Drafter,
    (sampling, policy, tree): &Settings,
    stops: &[u32],
    cache: Option<PrefixCache>,
) -> Result<SpeculativeDecoder<Llama, Drafter>> {
    let mut b = SpeculativeDecoder::builder(Pair { target: Llama::new(target.clone())?, draft: drafter })
        .sampling(sampling.clone())
        .k_policy(*policy)
        .tree(*tree)
        .max_new_tokens(20)
        .stop_tokens(stops.iter().copied());
    if let Some(c) = cache {
        b = b.prefix_cache(c);
    }
    b.build()
}

#[test]
fn conversations_from_the_cache_emit_the_same_tokens_for_every_drafter() -> Result<()> {
    let Some((target, draft, tok)) = smol() else { return Ok(()) };
    let stops = tok.stop_ids();
    let vocab = target.config().vocab_size;
    let greedy = SamplingConfig::greedy();
    let seeded = SamplingConfig::new(0.8)?.with_top_p(0.95)?.with_seed(11);
    let trees = TreePolicy::Always("3x3x8".parse()?);
    for (name, sampling) in [("greedy", greedy), ("seeded", seeded)] {
        let policy = if name == "greedy" { KPolicy::default() } else { KPolicy::Fixed(3) };
        for tree in [TreePolicy::Never, trees] {
            let settings = (sampling.clone(), policy, tree);
            same_with_and_without(&format!("model draft, {name}, {tree:?}"), &tok, |cache| {
                decoder(&target, Drafter::Model(Llama::new(draft.clone())?), &settings, &stops, cache)
            })?;
        }
        let settings = (sampling.clone(), policy, TreePolicy::Never);
        same_with_and_without(&format!("suffix+model, {name}"), &tok, |cache| {
            let suffix = SuffixDraft::new(SuffixCache::new(vocab, 1 << 16)?)?;
            let d = Drafter::SuffixModel(LookupOr::with_lookup(suffix, Llama::new(draft.clone())?)?);
            decoder(&target, d, &settings, &stops, cache)
        })?;
        same_with_and_without(&format!("ngram, {name}"), &tok, |cache| {
            decoder(&target, Drafter::NGram(NGramDraft::new(vocab)?), &settings, &stops, cache)
        })?;
    }
    Ok(())
}

/// The plain decoder, and a hit that ends inside the tokens of one character: the cached
/// prompt stops after the first of an emoji's byte tokens, the next prompt completes it.
#[test]
fn plain_decoding_hits_inside_a_character() -> Result<()> {
    let Some((target, _, tok)) = smol() else { return Ok(()) };
    let emoji = tok.encode("🙂")?;
    assert!(emoji.len() > 1, "the emoji is one token: {emoji:?}");
    let mut head = first_turn(&tok, 4);
    head.truncate(head.len() - 3);
    let mut first = head.clone();
    first.push(emoji[0]);
    let mut second = head.clone();
    second.extend(&emoji);
    second.extend(tok.encode(" Tell me more.<|im_end|>\n<|im_start|>assistant\n")?);
    let cache = PrefixCache::new(64 << 20);
    let plain = |cache: Option<PrefixCache>| -> Result<PlainDecoder<Llama>> {
        let p =
            PlainDecoder::new(Llama::new(target.clone())?, SamplingConfig::new(0.7)?.with_seed(5)).max_new_tokens(16);
        Ok(match cache {
            Some(c) => p.prefix_cache(c),
            None => p,
        })
    };
    let mut with = plain(Some(cache.clone()))?;
    let mut without = plain(None)?;
    for prompt in [&first, &second] {
        let (a, b) = (with.generate(prompt)?, without.generate(prompt)?);
        assert_eq!(a.tokens, b.tokens);
    }
    // The second prompt found the first's prefix, one token into the emoji, and no further.
    assert_eq!(cache.stats().hit_tokens as usize, head.len() + 1);
    Ok(())
}

/// Runs `prompts` through a batch (in two waves, half added between steps of the other half)
/// and returns each output with its cache hit, in prompt order.
fn batch_outputs(
    target: &Arc<LlamaWeights>,
    draft: &Arc<LlamaWeights>,
    prompts: &[Vec<u32>],
    settings: (&[SamplingConfig], KPolicy),
    cache: Option<&PrefixCache>,
) -> Result<Vec<(Vec<u32>, usize)>> {
    let mut batch = BatchDecoder::new(settings.1)?;
    if let Some(c) = cache {
        batch = batch.with_prefix_cache(c.clone());
    }
    let mut ids = Vec::new();
    let mut done = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let req = Request::new(p.clone()).sampling(settings.0[i].clone()).max_new_tokens(16);
        ids.push(batch.add(
            Pair { target: Llama::new(target.clone())?, draft: Drafter::Model(Llama::new(draft.clone())?) },
            req,
        )?);
        if i % 2 == 1 {
            batch.step()?;
        }
    }
    done.extend(batch.run()?);
    done.extend(batch.take_finished());
    Ok(ids
        .iter()
        .map(|id| {
            let f = done.iter().find(|f| f.id == *id).expect("every sequence finishes");
            (f.generation.tokens.clone(), f.generation.stats.prefix_hit_tokens)
        })
        .collect())
}

/// Eight sequences over one system prompt, interleaved with other conversations, twice (the
/// second time each resends its conversation with the answer): every output equals plain
/// decoding's, greedy; seeded, the batch with the cache equals the batch without it.
#[test]
fn eight_concurrent_conversations_read_only_their_own_rows() -> Result<()> {
    let Some((target, draft, tok)) = smol() else { return Ok(()) };
    let cache = PrefixCache::new(256 << 20);
    let greedy = vec![SamplingConfig::greedy(); 8];
    let first: Vec<Vec<u32>> = (0..8).map(|i| first_turn(&tok, i)).collect();
    let out1 = batch_outputs(&target, &draft, &first, (&greedy, KPolicy::default()), Some(&cache))?;
    let second: Vec<Vec<u32>> =
        (0..8).map(|i| next_turn(&tok, &first[i], &out1[i].0, QUESTIONS[(i + 3) % 8])).collect();
    let out2 = batch_outputs(&target, &draft, &second, (&greedy, KPolicy::default()), Some(&cache))?;
    for (prompts, outs, turn) in [(&first, &out1, 1), (&second, &out2, 2)] {
        for (i, (p, (got, hit))) in prompts.iter().zip(outs).enumerate() {
            let mut plain = PlainDecoder::new(Llama::new(target.clone())?, SamplingConfig::greedy()).max_new_tokens(16);
            assert_eq!(got, &plain.generate(p)?.tokens, "turn {turn}, conversation {i}");
            // The second turn hits its whole first turn and answer.
            if turn == 2 {
                assert!(*hit >= first[i].len() + out1[i].0.len() - 1, "conversation {i}: {hit}");
            }
        }
    }
    let seeded: Vec<SamplingConfig> =
        (0..8).map(|i| SamplingConfig::new(0.9).map(|s| s.with_seed(i))).collect::<Result<_>>()?;
    let a = batch_outputs(&target, &draft, &second, (&seeded, KPolicy::Fixed(3)), Some(&cache))?;
    let b = batch_outputs(&target, &draft, &second, (&seeded, KPolicy::Fixed(3)), None)?;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.0, y.0, "seeded conversation {i}");
        assert!(x.1 > 0 && y.1 == 0);
    }
    Ok(())
}

/// A small budget: the cache never holds more, keeps the most recent conversation, and
/// outputs stay those of plain decoding.
#[test]
fn a_small_budget_evicts_the_oldest_and_changes_nothing() -> Result<()> {
    let Some((target, _, tok)) = smol() else { return Ok(()) };
    // About 2.5 prompts of SmolLM2's target rows (30 blocks × 2 × 3 heads × 64 floats).
    let per_token = 30 * 2 * 3 * 64 * 4;
    let budget = 130 * per_token;
    let cache = PrefixCache::new(budget);
    let mut plain = PlainDecoder::new(Llama::new(target.clone())?, SamplingConfig::greedy())
        .max_new_tokens(8)
        .prefix_cache(cache.clone());
    for i in 0..6 {
        let p = first_turn(&tok, i);
        let mut fresh = PlainDecoder::new(Llama::new(target.clone())?, SamplingConfig::greedy()).max_new_tokens(8);
        assert_eq!(plain.generate(&p)?.tokens, fresh.generate(&p)?.tokens, "prompt {i}");
        let s = cache.stats();
        assert!(s.bytes <= budget, "{s:?}");
    }
    let s = cache.stats();
    assert!(s.evictions > 0, "{s:?}");
    // The last conversation is still there whole (its prompt and output).
    let last = first_turn(&tok, 5);
    assert!(cache.longest_prefix(&last) >= last.len() - 1, "{s:?}");
    Ok(())
}

/// The real pair: a conversation with the 0.5B draft, greedy, equals plain decoding turn by
/// turn, and the draft's rows are restored too.
#[test]
fn qwen_pair_conversation_from_the_cache_equals_plain() -> Result<()> {
    let Some((target, draft, tok)) = qwen() else { return Ok(()) };
    let cache = PrefixCache::new(512 << 20);
    let d = Drafter::Model(Llama::new(draft)?);
    let mut dec = SpeculativeDecoder::builder(Pair { target: Llama::new(target.clone())?, draft: d })
        .max_new_tokens(24)
        .stop_tokens(tok.stop_ids())
        .prefix_cache(cache.clone())
        .build()?;
    let mut plain =
        PlainDecoder::new(Llama::new(target)?, SamplingConfig::greedy()).max_new_tokens(24).stop_tokens(tok.stop_ids());
    let mut prompt = tok.encode(&tok.chat_prompt("Write a Python function that reverses a string."))?;
    for q in ["Now add a docstring.", "Now add type hints."] {
        let (a, b) = (dec.generate(&prompt)?, plain.generate(&prompt)?);
        assert_eq!(a.tokens, b.tokens);
        prompt = next_turn(&tok, &prompt, &a.tokens, q);
    }
    let (a, b) = (dec.generate(&prompt)?, plain.generate(&prompt)?);
    assert_eq!(a.tokens, b.tokens);
    assert!(a.stats.prefix_hit_tokens > prompt.len() / 2, "{:?}", a.stats);
    assert!(cache.stats().draft_hit_tokens > 0);
    Ok(())
}

/// Chunked prefill: a long prompt that joins in chunks of 7 tokens while others decode
/// leaves every sequence's tokens as they are without chunks (greedy: plain decoding's), and a
/// zero chunk is a typed error.
#[test]
fn chunked_prefill_changes_no_token() -> Result<()> {
    let Some((target, draft, tok)) = smol() else { return Ok(()) };
    assert!(BatchDecoder::<Llama, Drafter>::new(KPolicy::default())?.with_prefill_chunk(0).is_err());
    let short: Vec<Vec<u32>> = (0..3).map(|i| first_turn(&tok, i)).collect();
    let mut long = first_turn(&tok, 3);
    for (i, q) in QUESTIONS.iter().enumerate().skip(4) {
        long = next_turn(&tok, &long, &first_turn(&tok, i), q);
    }
    let cache = PrefixCache::new(64 << 20);
    let mut batch = BatchDecoder::new(KPolicy::default())?.with_prefill_chunk(7)?.with_prefix_cache(cache);
    let mut ids = Vec::new();
    for p in &short {
        let req = Request::new(p.clone()).max_new_tokens(24);
        ids.push(batch.add(
            Pair { target: Llama::new(target.clone())?, draft: Drafter::Model(Llama::new(draft.clone())?) },
            req,
        )?);
    }
    batch.step()?;
    batch.step()?;
    let req = Request::new(long.clone()).max_new_tokens(8);
    ids.push(
        batch.add(
            Pair { target: Llama::new(target.clone())?, draft: Drafter::Model(Llama::new(draft.clone())?) },
            req,
        )?,
    );
    let mut steps_prefilling = 0;
    while batch.active() > 0 {
        let stepped = batch.step()?;
        steps_prefilling += usize::from(stepped.iter().any(|(id, t)| *id == ids[3] && t.is_empty()));
    }
    let done = batch.take_finished();
    // The long prompt took several steps to join, the others went on meanwhile.
    assert!(steps_prefilling > 3, "{steps_prefilling}");
    let prompts = [&short[0], &short[1], &short[2], &long];
    for (id, p) in ids.iter().zip(prompts) {
        let f = done.iter().find(|f| f.id == *id).expect("finished");
        let n = f.generation.tokens.len();
        let mut plain = PlainDecoder::new(Llama::new(target.clone())?, SamplingConfig::greedy()).max_new_tokens(n);
        assert_eq!(f.generation.tokens, plain.generate(p)?.tokens);
    }
    Ok(())
}
