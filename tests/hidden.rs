//! Hidden states out of the target's forward pass (what EAGLE and Medusa heads read): the
//! residual stream entering chosen blocks and the final normed state, from the same pass, on
//! both engines. Tap 0 is the embedding, the final tap is the norm of the last residual, the
//! logits are those of a plain forward, and the engines agree.

mod common;

use candle_core::Device;
use common::models::{model_path, STORIES};
use specdec::loading::GgufFile;
use specdec::models::{Tap, TappedPass};
use specdec::TokenModel;
use specdec::{Engine, Error, Llama, ModelFiles, Result, TargetModel, WeightFormat};

/// max |a − b| / max |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

const TOKENS: [u32; 5] = [1, 403, 407, 261, 378];

#[test]
fn taps_are_the_embedding_the_residuals_and_the_final_norm_on_both_engines() -> Result<()> {
    let Some(path) = model_path(STORIES) else { return Ok(()) };
    let mut file = GgufFile::open(&path)?;
    let config = file.config()?;
    let (hidden, layers) = (config.hidden_size, config.num_layers);
    let embed = file.tensor("token_embd.weight", &Device::Cpu)?.dequantize(&Device::Cpu)?.to_vec2::<f32>()?;
    let norm = file.tensor("output_norm.weight", &Device::Cpu)?.dequantize(&Device::Cpu)?.to_vec1::<f32>()?;
    let taps = [Tap::Residual(0), Tap::Residual(2), Tap::Residual(layers), Tap::Final];
    let mut per_engine = Vec::new();
    for engine in [Engine::Native, Engine::Candle] {
        let (w, _) = ModelFiles::Gguf(path.clone()).load_with(WeightFormat::F32, &Device::Cpu, engine)?;
        let TappedPass { logits, hidden: states } = Llama::new(w.clone())?.forward_hidden(&TOKENS, 2, &taps)?;
        assert!(states.iter().all(|s| s.len() == TOKENS.len() * hidden), "{engine:?}: one row per token");
        // The logits are a plain forward's.
        let plain = Llama::new(w)?.forward(&TOKENS, 2)?;
        assert!(rel_diff(logits.as_slice(), plain.as_slice()) <= 1e-6, "{engine:?}: logits");
        // Tap 0 is the embedding of each token.
        let rows: Vec<f32> = TOKENS.iter().flat_map(|&t| embed[t as usize].clone()).collect();
        assert!(rel_diff(&states[0], &rows) <= 1e-6, "{engine:?}: tap 0");
        // The final tap is the RMS norm of the last residual times the output norm's weight.
        let normed: Vec<f32> = states[2]
            .chunks(hidden)
            .flat_map(|row| {
                let rms = (row.iter().map(|x| x * x).sum::<f32>() / hidden as f32 + config.rms_norm_eps as f32).sqrt();
                row.iter().zip(&norm).map(move |(x, w)| x / rms * w)
            })
            .collect();
        assert!(rel_diff(&states[3], &normed) <= 1e-4, "{engine:?}: final tap");
        per_engine.push(states);
    }
    for (i, tap) in taps.iter().enumerate() {
        let d = rel_diff(&per_engine[0][i], &per_engine[1][i]);
        assert!(d <= 1e-4, "{tap:?}: engines differ by {d}");
    }
    Ok(())
}

#[test]
fn tapped_calls_extend_the_context_and_bad_taps_are_typed_errors() -> Result<()> {
    let Some(path) = model_path(STORIES) else { return Ok(()) };
    let (w, _) = ModelFiles::Gguf(path).load(WeightFormat::F32, &Device::Cpu)?;
    let (mut tapped, mut plain) = (Llama::new(w.clone())?, Llama::new(w.clone())?);
    tapped.forward_hidden(&TOKENS[..3], 0, &[Tap::Final])?;
    plain.forward(&TOKENS[..3], 0)?;
    assert_eq!(tapped.context_len(), 3);
    let (a, b) = (tapped.forward(&TOKENS[3..], 2)?, plain.forward(&TOKENS[3..], 2)?);
    assert!(rel_diff(a.as_slice(), b.as_slice()) <= 1e-6);
    // A model running the first 2 blocks has taps 0..=2.
    let mut skip = Llama::with_layers(w, vec![0, 1])?;
    assert!(skip.forward_hidden(&TOKENS, 1, &[Tap::Residual(2)]).is_ok());
    skip.truncate(0)?;
    assert!(matches!(skip.forward_hidden(&TOKENS, 1, &[Tap::Residual(3)]), Err(Error::InvalidSetting { .. })));
    Ok(())
}
