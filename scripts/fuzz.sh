#!/usr/bin/env bash
# Fuzzes the file readers with cargo-fuzz (nightly toolchain, libFuzzer, AddressSanitizer):
#   gguf            GgufFile::from_bytes, config, every llama tensor read and dequantized
#   gguf_tokenizer  the tokenizer rebuilt from GGUF metadata, encode/decode
#   hf_dir          config.json + model.safetensors in a scratch folder, SafetensorsDir::open, tensor reads
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 30)] [TARGET...]
# Installs cargo-fuzz if missing and seeds fuzz/corpus/ from the model files of
# scripts/fetch-models.sh. Crashes land in fuzz/artifacts/TARGET/; replay one with
# `cargo +nightly fuzz run TARGET FILE`, shrink it with `cargo +nightly fuzz tmin TARGET FILE`,
# then keep it as a test in tests/fuzz_regressions.rs. Not run by CI (nightly build cost).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf gguf_tokenizer hf_dir)

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
cargo +nightly fuzz build

if [ ! -d fuzz/corpus/gguf ]; then
  models=$(scripts/fetch-models.sh | tail -n 1)
  host=$(rustc +nightly -vV | sed -n 's/^host: //p')
  "fuzz/target/$host/release/make_seeds" "$models" fuzz/corpus
fi

# Inputs up to 64 KiB keep the runs fast (the tiny seed models fit; the real files are cut).
for t in "${targets[@]}"; do
  dict=fuzz/gguf.dict
  [ "$t" = hf_dir ] && dict=fuzz/hf_dir.dict
  echo "== $t for ${secs}s"
  cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -rss_limit_mb=4096 -timeout=10 -max_len=65536 \
    -dict="$dict" -print_final_stats=1
done
