//! Real pairs with different tokenizers: SmolLM2-135M (49,152 tokens) drafting for
//! Qwen2.5-Coder-1.5B (151,936) and for Gemma-3-270M (262,144), both methods, through
//! [`Drafter::build`] as `llama_spec` builds it. Greedy speculative output equals plain.

mod common;

use common::models::{model_path, GEMMA3, QWEN_1_5B, SMOLLM2};
use specdec::{
    CrossMethod, Drafter, DrafterSpec, Engine, Llama, ModelFiles, Pair, PlainDecoder, Result, SamplingConfig,
    SpeculativeDecoder, VocabMap, WeightFormat,
};

/// Greedy output of `target` with SmolLM2 drafting by `method` equals plain greedy output,
/// and the drafter proposed and had tokens accepted.
fn greedy_equals_plain(target: &str, method: Option<CrossMethod>, prompt: &str, n: usize) -> Result<()> {
    let (Some(target_path), Some(draft_path)) = (model_path(target), model_path(SMOLLM2)) else { return Ok(()) };
    let device = candle_core::Device::Cpu;
    let files = ModelFiles::Gguf(target_path);
    let (weights, tokenizer) = files.load_with(WeightFormat::Stored, &device, Engine::Native)?;
    let draft = draft_path.to_string_lossy().to_string();
    let spec = match method {
        Some(m) => DrafterSpec::Cross(m, draft),
        None => DrafterSpec::Model(Some(draft)),
    };
    let mut verifier = Llama::new(weights.clone())?;
    let drafter = Drafter::build(&spec, &files, &mut verifier, &tokenizer, &device)?;
    let note = drafter.note().expect("another tokenizer is noted");
    assert!(note.contains(&method.unwrap_or(CrossMethod::Intersection).to_string()), "{note}");
    let ids = tokenizer.encode(&tokenizer.chat_prompt(prompt))?;
    let plain = PlainDecoder::new(Llama::new(weights)?, SamplingConfig::greedy()).max_new_tokens(n).generate(&ids)?;
    let mut dec =
        SpeculativeDecoder::builder(Pair { target: verifier, draft: drafter }).k(3).max_new_tokens(n).build()?;
    let out = dec.generate(&ids)?;
    assert_eq!(tokenizer.decode(&out.tokens)?, tokenizer.decode(&plain.tokens)?, "{target}, {spec}");
    assert_eq!(out.tokens, plain.tokens, "{target}, {spec}");
    let s = &out.stats;
    eprintln!("{target}, {spec}: {} drafted, {} accepted", s.drafted, s.accepted);
    assert!(s.drafted > 0 && s.accepted > 0, "{target}, {spec}: {s:?}");
    Ok(())
}

#[test]
fn smollm2_drafts_for_qwen_by_text_and_by_intersection() -> Result<()> {
    let prompt = "Write a Python function that returns the n-th Fibonacci number.";
    greedy_equals_plain(QWEN_1_5B, Some(CrossMethod::Text), prompt, 32)?;
    greedy_equals_plain(QWEN_1_5B, Some(CrossMethod::Intersection), prompt, 32)
}

#[test]
fn smollm2_drafts_for_gemma_chosen_by_itself() -> Result<()> {
    let prompt = "Explain how a refrigerator works, step by step.";
    greedy_equals_plain(GEMMA3, None, prompt, 32)?;
    greedy_equals_plain(GEMMA3, Some(CrossMethod::Text), prompt, 32)
}

/// The map from SmolLM2's strings to Qwen's: the shared count (reported, not asserted: it
/// depends only on the two files) and its build time, printed for the notes.
#[test]
fn the_smollm2_to_qwen_map_is_built_once_and_quickly() -> Result<()> {
    let (Some(target_path), Some(draft_path)) = (model_path(QWEN_1_5B), model_path(SMOLLM2)) else { return Ok(()) };
    let (target, draft) = (ModelFiles::Gguf(target_path).tokenizer()?, ModelFiles::Gguf(draft_path).tokenizer()?);
    let start = std::time::Instant::now();
    let map = VocabMap::new(Pair { target: &target, draft: &draft })?;
    eprintln!("SmolLM2 → Qwen map: {} shared strings, built in {:.3} s", map.shared(), start.elapsed().as_secs_f64());
    // Words, code and ChatML's turn tokens are shared.
    for s in [" the", "def", "<|im_end|>", "    "] {
        let (d, t) = (draft.token_to_id(&s.replace(' ', "Ġ")), target.token_to_id(&s.replace(' ', "Ġ")));
        assert_eq!(map.target_of(d.expect(s)), t, "{s:?}");
    }
    Ok(())
}

#[test]
fn ngram_plus_a_model_of_another_tokenizer_is_refused() -> Result<()> {
    let (Some(target_path), Some(draft_path)) = (model_path(GEMMA3), model_path(SMOLLM2)) else { return Ok(()) };
    let device = candle_core::Device::Cpu;
    let files = ModelFiles::Gguf(target_path);
    let (weights, tokenizer) = files.load(WeightFormat::Stored, &device)?;
    let spec = DrafterSpec::LookupModel(Some(draft_path.to_string_lossy().to_string()));
    let err = Drafter::build(&spec, &files, &mut Llama::new(weights)?, &tokenizer, &device).unwrap_err();
    assert!(matches!(err, specdec::Error::TokenizerMismatch { .. }), "{err}");
    Ok(())
}
