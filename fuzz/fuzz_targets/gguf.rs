//! GGUF reader and model config: `GgufFile::from_bytes`, `config`, then every tensor the llama
//! loader asks for, read and dequantized. A typed error is fine; a panic, an abort, a huge
//! allocation or a hang is a bug.
#![no_main]

use candle_core::Device;
use libfuzzer_sys::fuzz_target;
use specdec::loading::GgufFile;

const PARTS: [&str; 9] =
    ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

fuzz_target!(|data: &[u8]| {
    let Ok(mut file) = GgufFile::from_bytes(data) else { return };
    let layers = file.config().map_or(2, |c| c.num_layers.min(4));
    let mut names: Vec<String> = ["token_embd.weight", "output_norm.weight", "output.weight"].map(String::from).into();
    for i in 0..layers {
        names.extend(PARTS.iter().map(|p| format!("blk.{i}.{p}.weight")));
    }
    for name in names {
        if let Ok(t) = file.tensor(&name, &Device::Cpu) {
            let _ = t.dequantize(&Device::Cpu);
        }
    }
});
