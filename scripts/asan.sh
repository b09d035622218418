#!/usr/bin/env bash
# Runs the kernel, thread-team and model tests under AddressSanitizer (nightly toolchain, its own
# build folder; the first build takes 10-25 minutes on 2 cores). Each SIMD level's kernels in turn.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/asan}
run() { cargo +nightly test --release --target x86_64-unknown-linux-gnu "$@"; }
run --lib --test real_models --test tree_forward
for level in avx2 avxvnni portable; do
  SPECDEC_SIMD=$level run --test real_models --test tree_forward
done
