//! A panic inside a thread-team job of the native engine reaches the caller of `generate` as a
//! panic it can catch, never an abort of the process, and the same weights then generate what
//! they generated before. The panic is injected with the test-only `fault-injection` feature.

mod common;

use std::panic::{self, catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, Once};
use std::thread;

use candle_core::Device;
use common::models::{model_path, SMOLLM2, STORIES};
use specdec::models::native::panic_after_chunks;
use specdec::{
    Engine, Llama, LlamaWeights, ModelFiles, Pair, PlainDecoder, Result, SamplingConfig, SpeculativeDecoder, Tokenizer,
    WeightFormat,
};

const MESSAGE: &str = "specdec: injected fault in a team job";
const NEW_TOKENS: usize = 24;

/// The tests share the process-wide team and the one armed fault: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Keeps the default panic hook from printing the injected panics (workers' included).
fn quiet() {
    static QUIET: Once = Once::new();
    QUIET.call_once(|| {
        let hook = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&MESSAGE) {
                hook(info);
            }
        }));
    });
}

/// The native engine's weights of `name` in `format`, with a chat prompt.
fn load(name: &str, format: WeightFormat) -> Result<Option<(Arc<LlamaWeights>, Vec<u32>)>> {
    let Some(path) = model_path(name) else { return Ok(None) };
    let (w, tok): (_, Tokenizer) = ModelFiles::Gguf(path).load_with(format, &Device::Cpu, Engine::Native)?;
    let ids = tok.encode(&tok.chat_prompt("Tell me a story about a lighthouse."))?;
    Ok(Some((w, ids)))
}

/// Runs `generate` with a panic armed after `after` chunks: it must reach this thread with the
/// injected message.
fn assert_panics(what: &str, after: usize, generate: impl FnOnce() -> Result<Vec<u32>>) {
    panic_after_chunks(Some(after));
    let caught = catch_unwind(AssertUnwindSafe(generate));
    panic_after_chunks(None);
    let payload = match caught {
        Ok(out) => panic!("{what}: no panic after {after} chunks (generated {out:?})"),
        Err(payload) => payload,
    };
    assert_eq!(payload.downcast_ref::<&str>(), Some(&MESSAGE), "{what}: another panic");
}

/// Plain and speculative greedy generation on `w`: a panic injected early and mid-generation
/// reaches the caller, and the same decoder, then a new one on the same weights, generate the
/// reference tokens.
fn recovers(name: &str, w: &Arc<LlamaWeights>, ids: &[u32]) -> Result<()> {
    let plain = || -> Result<PlainDecoder<Llama>> {
        Ok(PlainDecoder::new(Llama::new(w.clone())?, SamplingConfig::greedy()).max_new_tokens(NEW_TOKENS))
    };
    let reference = plain()?.generate(ids)?.tokens;
    assert_eq!(reference.len(), NEW_TOKENS, "{name}: the reference stopped early");
    for after in [0, 1009] {
        let what = format!("{name}, plain, panic after {after} chunks");
        let mut dec = plain()?;
        assert_panics(&what, after, || Ok(dec.generate(ids)?.tokens));
        assert_eq!(dec.generate(ids)?.tokens, reference, "{what}: the same decoder after the panic");
        assert_eq!(plain()?.generate(ids)?.tokens, reference, "{what}: a new decoder after the panic");

        let what = format!("{name}, speculative, panic after {after} chunks");
        let mut spec =
            SpeculativeDecoder::builder(Pair { target: Llama::new(w.clone())?, draft: Llama::new(w.clone())? })
                .k(4)
                .max_new_tokens(NEW_TOKENS)
                .build()?;
        assert_panics(&what, after, || Ok(spec.generate(ids)?.tokens));
        assert_eq!(spec.generate(ids)?.tokens, reference, "{what}: the same decoder after the panic");
    }
    Ok(())
}

#[test]
fn a_panic_in_a_forward_pass_reaches_the_caller_and_the_weights_go_on() -> Result<()> {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    quiet();
    // f32 products on the tiny model; quantized activations and products on SmolLM2.
    for (name, format) in [(STORIES, WeightFormat::F32), (SMOLLM2, WeightFormat::Stored)] {
        let Some((w, ids)) = load(name, format)? else { continue };
        recovers(name, &w, &ids)?;
    }
    Ok(())
}

/// The same from a thread other than the main one: the panic reaches that thread, and the
/// main thread then generates on the same weights.
#[test]
fn a_panic_reaches_a_caller_on_another_thread() -> Result<()> {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    quiet();
    let Some((w, ids)) = load(STORIES, WeightFormat::F32)? else { return Ok(()) };
    let reference = PlainDecoder::new(Llama::new(w.clone())?, SamplingConfig::greedy())
        .max_new_tokens(NEW_TOKENS)
        .generate(&ids)?
        .tokens;
    let caller = {
        let (w, ids) = (w.clone(), ids.clone());
        thread::spawn(move || recovers("stories on another thread", &w, &ids))
    };
    caller.join().expect("the panic stays inside the caller thread's catch_unwind")?;
    let again =
        PlainDecoder::new(Llama::new(w)?, SamplingConfig::greedy()).max_new_tokens(NEW_TOKENS).generate(&ids)?;
    assert_eq!(again.tokens, reference);
    Ok(())
}
