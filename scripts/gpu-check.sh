#!/usr/bin/env bash
# Runs binaries built elsewhere with `--features cuda` (see scripts/gpu-pack.sh) on a machine
# with an NVIDIA GPU and no Rust toolchain: the real-weight tests with SPECDEC_DEVICE=cuda,
# `device_check` (the stories model on the GPU beside the CPU), then `llama_spec` and
# `spec_bench` with `--device cuda --json`.
#
#   scripts/gpu-check.sh [BINARIES] [MODELS_DIR]
#
# BINARIES is a folder or gpu-pack.sh's .tar.xz (default gpu-pack/bin.tar.xz); MODELS_DIR
# defaults to gpu-pack/models. Missing binaries are skipped with a message.
#
# Output goes to $OUT when set, else ./gpu-check-out: summary.txt (driver, libraries, one line
# per step), a log per test binary, a JSON file per example and examples.err with the examples'
# stderr: 7 files, within the 8 that the device tool brings back.
# Extra arguments for the examples: LLAMA_SPEC_ARGS, SPEC_BENCH_ARGS (split on spaces).
# Per-step time limit: GPU_CHECK_TIMEOUT seconds (default 300).
#
# The binaries link the CUDA 13 libraries dynamically (cudart, cuBLAS, cuBLASLt, cuRAND:
# candle's cudarc uses `dynamic-linking`), too large to carry, so they are looked up on this
# machine: in GPU_CHECK_LIB_DIRS, in Python's `nvidia/cu13/lib` (PyTorch's CUDA wheels) and
# in the usual CUDA folders. They need a driver of R580 or newer (CUDA 13.0's PTX and runtime).
set -euo pipefail

binaries_arg=${1:-gpu-pack/bin.tar.xz}
models_dir=$(cd "${2:-gpu-pack/models}" && pwd)
if [ -d "$binaries_arg" ]; then
  bin_dir=$(cd "$binaries_arg" && pwd)
else
  # Unpack into a temporary folder; Python's lzma stands in where xz is not installed.
  unpacked=$(mktemp -d)
  trap 'rm -rf "$unpacked"' EXIT
  if command -v xz >/dev/null; then
    tar -C "$unpacked" -xJf "$binaries_arg"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$binaries_arg" "$unpacked"
  fi
  bin_dir=$unpacked/bin
fi
out=${OUT:-$PWD/gpu-check-out}
limit=${GPU_CHECK_TIMEOUT:-300}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

say "== gpu-check $(date -u +%FT%TZ) on $(hostname)"
say "binaries: $bin_dir"
say "models:   $models_dir ($(find "$models_dir" -maxdepth 1 -type f -printf '%f ' 2>/dev/null))"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"
else
  say "gpu: nvidia-smi not found"
fi

# Find a folder for each shared library the binaries need and the loader cannot find yet.
# Candidates in order of preference: a lib/ carried beside the binaries, Python's CUDA 13
# wheels (where PyTorch's libraries live), then the system toolkit and the driver's folder.
# GPU_CHECK_LIB_DIRS (colon-separated) is searched first.
IFS=: read -r -a candidates <<<"${GPU_CHECK_LIB_DIRS:-}"
candidates+=("$bin_dir/../lib")
for py in python3 /opt/*/.venv/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null) || continue
  candidates+=("$site/nvidia/cu13/lib")
done
candidates+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64
  /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu)

binaries=()
for name in real_models decoding device_check llama_spec spec_bench; do
  [ -x "$bin_dir/$name" ] && binaries+=("$bin_dir/$name")
done
missing_libs() { # names ldd cannot resolve, over all binaries
  [ ${#binaries[@]} -gt 0 ] || return 0
  ldd "${binaries[@]}" 2>/dev/null | awk '/=> not found/ {print $1}' | sort -u
}
# A few passes: a library found may need others (cuBLAS needs cuBLASLt).
for _ in 1 2 3; do
  for lib in $(missing_libs); do
    for dir in "${candidates[@]}"; do
      if [ -e "$dir/$lib" ]; then
        export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        say "lib: $lib from $dir"
        break
      fi
    done
  done
done
still=$(missing_libs | tr '\n' ' ')
[ -z "$still" ] || say "lib: NOT FOUND: $still (the steps below will fail to start)"

# Only the stories model travels: the tests of the others skip (outside CI, a missing model
# fails a test unless this is set).
export SPECDEC_DEVICE=cuda SPECDEC_MODELS=$models_dir SPECDEC_SKIP_MISSING_MODELS=1 RUST_BACKTRACE=1
unset CI

status=0
step() { # name out-file command... : runs one step under the time limit, records its result
  local name=$1 file=$2 start rc
  shift 2
  start=$(date +%s.%N)
  set +e
  timeout "$limit" "$@" >"$out/$file" 2>&1
  rc=$?
  set -e
  [ $rc -eq 0 ] || status=1
  say "step: $name rc=$rc $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f s", e - s}') -> $file"
  # libtest's closing line, so the summary says how many tests ran.
  grep -E '^test result:' "$out/$file" | sed 's/^/       /' | tee -a "$summary" || true
}
skip() { say "step: $1 skipped: $2"; }

# Integration tests: --test-threads=1 so a failure's log is in order and one GPU context at a
# time; tests whose model file is absent (SmolLM2, which does not fit the transfer) skip, and
# those of the native engine (CPU only) run the candle engine alone.
for t in real_models decoding; do
  if [ -x "$bin_dir/$t" ]; then
    step "$t (tests)" "$t.log" "$bin_dir/$t" --test-threads=1
  else
    skip "$t" "no test binary $t in $bin_dir"
  fi
done

# The examples print their report as JSON on stdout; their stderr goes to one shared file so
# the JSON stays parseable.
example() { # name args...
  local name=$1 start rc
  shift
  if [ ! -x "$bin_dir/$name" ]; then
    skip "$name" "no binary $name in $bin_dir"
    return
  fi
  echo "== $name $*" >>"$out/examples.err"
  start=$(date +%s.%N)
  set +e
  timeout "$limit" "$bin_dir/$name" "$@" >"$out/$name.json" 2>>"$out/examples.err"
  rc=$?
  set -e
  [ $rc -eq 0 ] || status=1
  say "step: $name rc=$rc $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f s", e - s}') -> $name.json"
}
: >"$out/examples.err"
example device_check --device cuda --model "$models_dir/tinyllamas-stories-260k-f32.gguf"
# shellcheck disable=SC2086 # extra arguments are split on purpose
example llama_spec --device cuda --report-json ${LLAMA_SPEC_ARGS:-}
# shellcheck disable=SC2086
example spec_bench --device cuda --json ${SPEC_BENCH_ARGS:-}

say "== done: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED)"
exit $status
