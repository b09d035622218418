//! Finding the real model files for tests.

use std::path::PathBuf;

pub const STORIES: &str = "tinyllamas-stories-260k-f32.gguf";
pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";
pub const QWEN_1_5B: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
pub const QWEN_0_5B: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The path of a model file from `scripts/fetch-models.sh`, looked up in `$SPECDEC_MODELS`,
/// `./models-cache` and `../shared/models`. A missing file fails the test (never a silent
/// pass), unless `SPECDEC_SKIP_MISSING_MODELS` is set, outside CI, to skip it with a message.
pub fn model_path(name: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dirs = [
        std::env::var_os("SPECDEC_MODELS").map(PathBuf::from),
        Some(root.join("models-cache")),
        Some(root.join("../shared/models")),
    ];
    let found = dirs.into_iter().flatten().map(|d| d.join(name)).find(|p| p.is_file());
    if found.is_none() {
        missing(&format!("model file {name}"), "scripts/fetch-models.sh");
    }
    found
}

/// Fails the test for a missing file, or skips it where the user asked for that.
fn missing(what: &str, fix: &str) {
    let skip = std::env::var_os("SPECDEC_SKIP_MISSING_MODELS").is_some() && std::env::var_os("CI").is_none();
    assert!(skip, "{what} is missing: run {fix} (or set SPECDEC_SKIP_MISSING_MODELS=1 to skip these tests)");
    eprintln!("skipping: {what} not found (run {fix})");
}

/// The folder of a draft head trained for SmolLM2 by `scripts/train-heads.sh --short`
/// (`heads-short/eagle`, `…/eagle3`, `…/medusa`), looked up like the model files, missing
/// ones failing or skipped like them.
pub fn head_path(kind: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dirs = [std::env::var_os("SPECDEC_MODELS").map(PathBuf::from), Some(root.join("models-cache"))];
    let found =
        dirs.into_iter().flatten().map(|d| d.join("heads-short").join(kind)).find(|p| p.join("config.json").is_file());
    if found.is_none() {
        missing(&format!("head {kind}"), "scripts/train-heads.sh --short");
    }
    found
}
