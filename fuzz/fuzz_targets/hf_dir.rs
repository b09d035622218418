//! HF-layout folders: the input is split into `config.json` and `model.safetensors` (a u16 LE
//! length, that many bytes of config, the rest safetensors), written into a scratch folder
//! (on tmpfs where there is one), opened with `SafetensorsDir::open`, then every tensor the
//! llama loader asks for is read. A typed error is fine; a panic, an abort, a huge allocation
//! or a hang is a bug.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::Device;
use libfuzzer_sys::fuzz_target;
use specdec::loading::{SafetensorsDir, TensorSource};

const PARTS: [&str; 9] =
    ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        let root = if shm.is_dir() { shm } else { std::env::temp_dir() };
        let dir = root.join(format!("specdec-fuzz-hf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<2>() else { return };
    let (config, tensors) = rest.split_at((u16::from_le_bytes(*head) as usize).min(rest.len()));
    let dir = scratch();
    std::fs::write(dir.join("config.json"), config).expect("write config.json");
    std::fs::write(dir.join("model.safetensors"), tensors).expect("write model.safetensors");
    let Ok(mut st) = SafetensorsDir::open(dir) else { return };
    let layers = st.config().num_layers.min(4);
    let mut names: Vec<String> = ["token_embd.weight", "output_norm.weight", "output.weight"].map(String::from).into();
    for i in 0..layers {
        names.extend(PARTS.iter().map(|p| format!("blk.{i}.{p}.weight")));
    }
    for name in names {
        if st.has(&name) {
            let _ = st.qtensor(&name, &Device::Cpu);
        }
    }
});
