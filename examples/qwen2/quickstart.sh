#!/usr/bin/env bash
# The main job of `make quickstart`: train the tiny Qwen2 LM on Debian's fortunes from scratch,
# print held-out loss/perplexity before and after and a greedy sample, export an HF directory.
set -euo pipefail
MM=${1:-build/mm}
OUT=out/quickstart
rm -rf "$OUT"
"$MM" version | head -2
"$MM" train examples/qwen2/tiny_fortunes.yaml \
  training.save_dir="$OUT" training.resume= training.export_dir="$OUT/hf" training.log_interval=50
echo "quickstart: checkpoints in $OUT, Hugging Face export in $OUT/hf"
