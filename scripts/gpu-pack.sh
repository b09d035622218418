#!/usr/bin/env bash
# Builds the crate with `--features cuda` here (no GPU needed) and packs what a GPU machine
# without Rust needs to run scripts/gpu-check.sh into gpu-pack/ (ignored by git):
#
#   gpu-pack/bin.tar.xz  stripped test binaries real_models, decoding; examples device_check,
#                        llama_spec, spec_bench
#   gpu-pack/models/     tinyllamas-stories-260k-f32.gguf (1.2 MB)
#   gpu-pack/gpu-check.sh, gpu-pack/MANIFEST.txt
#
# Then, on the GPU machine:  bash gpu-pack/gpu-check.sh gpu-pack/bin.tar.xz gpu-pack/models
# (with the device tool: carry ["gpu-pack"]).
#
# The transfer to the GPU machine holds 64 MiB in all, the working tree included. A binary without
# debug info is 36-59 MiB (candle's PTX and its statically built quantized-matmul kernels), so the
# binaries travel as one xz archive with a dictionary larger than any one of them: they share
# most of their bytes, and two compress to about 8 MiB together. Only the tiny stories model
# travels; SmolLM2-135M (98 MB) does not fit and cannot be fetched there (no network), so the
# SmolLM2 tests skip there. Binaries or models not built or found yet are left out with a
# message. CUDA libraries are not packed (cuBLASLt alone is 540 MB): the GPU machine's own
# CUDA 13 libraries are used.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
pack=$here/gpu-pack
wanted_tests=(real_models decoding)
wanted_examples=(device_check llama_spec spec_bench)
models=(tinyllamas-stories-260k-f32.gguf)
limit=$((64 * 1024 * 1024))

eval "$(scripts/cuda-toolkit.sh)"

# Build, and read the executables' paths from cargo's JSON messages: test binaries carry a
# hash in their name, and an older one may lie beside the current one in target/release/deps.
start=$(date +%s)
echo "gpu-pack: cargo build --release --features cuda --examples --tests (CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP)" >&2
messages=$(mktemp)
trap 'rm -f "$messages"' EXIT
cargo build --release --features cuda --examples --tests --message-format=json-render-diagnostics >"$messages"
echo "gpu-pack: build took $(($(date +%s) - start)) s" >&2

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/models"
python3 - "$messages" "${wanted_tests[*]}" "${wanted_examples[*]}" >"$pack/artifacts.txt" <<'PY'
import json, sys
tests, examples = sys.argv[2].split(), sys.argv[3].split()
for line in open(sys.argv[1]):
    msg = json.loads(line)
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    target = msg["target"]
    kinds, name = target["kind"], target["name"]
    if ("test" in kinds and name in tests) or ("example" in kinds and name in examples):
        print(name, msg["executable"])
PY

for name in "${wanted_tests[@]}" "${wanted_examples[@]}"; do
  exe=$(awk -v n="$name" '$1 == n {print $2}' "$pack/artifacts.txt")
  if [ -z "$exe" ]; then
    echo "gpu-pack: skipping $name: no such test or example in this checkout" >&2
    continue
  fi
  cp "$exe" "$pack/bin/$name"
  strip --strip-debug "$pack/bin/$name" # keeps function names for backtraces (+0.4 MiB packed)
done
rm "$pack/artifacts.txt"

for model in "${models[@]}"; do
  found=""
  for dir in ${SPECDEC_MODELS:+"$SPECDEC_MODELS"} models-cache ../shared/models; do
    [ -f "$dir/$model" ] && { found=$dir/$model; break; }
  done
  if [ -n "$found" ]; then
    cp "$found" "$pack/models/"
  else
    echo "gpu-pack: skipping model $model: not found (run scripts/fetch-models.sh)" >&2
  fi
done
cp scripts/gpu-check.sh "$pack/"

{
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests examples Cargo.toml || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ), CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"
  echo "needs: NVIDIA driver R580+, CUDA 13 libcudart/libcublas/libcublasLt/libcurand, glibc >= $(ldd --version | sed -n '1s/.* //p')"
  echo "stripped sizes (bytes):"
  (cd "$pack" && find bin models -type f -printf '%s\t%p\n' | sort -k2)
} >"$pack/MANIFEST.txt"
(cd "$pack" && du -b bin/* models/* 2>/dev/null | awk '{printf "%8.1f MiB  %s\n", $1 / 1048576, $2}') >&2

# One archive, one xz stream (-T1: threads would cut it into blocks that cannot refer to one
# another), with a 256 MiB dictionary so each binary is coded against the ones before it.
# Unpacking needs 256 MiB of memory.
echo "gpu-pack: compressing the binaries (about a minute per 100 MiB)" >&2
tar -C "$pack" -cf - bin | xz -T1 --lzma2=preset=9,dict=256MiB >"$pack/bin.tar.xz"
rm -rf "${pack:?}/bin"

# Sizes, against the transfer limit (the tracked working tree travels too).
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
total=$(du -sb "$pack" | cut -f1)
awk -v p="$pack" -v t="$total" -v g="$tree" 'BEGIN {
  m = 1048576
  printf "gpu-pack: %s total %.1f MiB; with the tracked tree (%.1f MiB) %.1f MiB of the 64 MiB limit\n", p, t / m, g / m, (t + g) / m
}' >&2
if [ $((total + tree)) -gt $limit ]; then
  echo "gpu-pack: over the 64 MiB transfer limit" >&2
  exit 1
fi
