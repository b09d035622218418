#!/usr/bin/env bash
# Trains draft heads for SmolLM2-135M-Instruct by self-distillation, on this CPU: the target
# answers the prompts in scripts/train-prompts.txt, its hidden states and top-1 predictions
# are recorded, and an EAGLE-1 head, an EAGLE-3 head and three Medusa-1 heads learn them
# (examples/train_heads.rs). The heads are written in their published formats, never
# committed, with report.json (the training curve: loss and held-out top-1 per depth/head).
#
#   scripts/train-heads.sh           full run, about an hour on 2 cores: models-cache/heads
#   scripts/train-heads.sh --short   a few minutes, a few thousand tokens: models-cache/heads-short
#                                    (the heads CI's tests use; skipped when already there)
#
# Use a head with: cargo run --release --example llama_spec -- --drafter eagle:models-cache/heads/eagle
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dest=${SPECDEC_MODELS:-$here/models-cache}
"$here/scripts/fetch-models.sh" >/dev/null
target="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
case "${1:-}" in
  --short)
    out="$dest/heads-short"
    if [ -f "$out/eagle/model.safetensors" ] && [ -f "$out/eagle3/model.safetensors" ] \
      && [ -f "$out/medusa/medusa_lm_head.safetensors" ]; then
      echo "$out"
      exit 0
    fi
    args=(--prompts-limit 48 --tokens-per-prompt 64 --epochs 3 --eagle3)
    ;;
  "")
    out="$dest/heads"
    args=(--tokens-per-prompt 160 --epochs 8 --medusa-epochs 4 --eagle3 --data "$out/data.safetensors")
    ;;
  *)
    echo "usage: $0 [--short]" >&2
    exit 2
    ;;
esac
mkdir -p "$out"
cd "$here"
cargo run --release --example train_heads -- --target "$target" --out "$out" "${args[@]}" >&2
echo "$out"
