#!/usr/bin/env bash
# The main job of `make quickstart`: a real vision-language run on Debian's Fashion-MNIST.
#   1. mm data fashion-mnist: the 60,000 + 10,000 images as PNGs and mllm JSONL
#   2. mm train: a tiny Qwen2-VL-architecture model fine-tuned on the training split
#   3. mm eval: accuracy of its answers on the 10,000 test images (never trained on)
#   4. mm generate: one question about a test image
#   5. mm report: the run's plots, config and environment as one HTML page (TensorBoard events too)
set -euo pipefail
MM=${1:-build/mm}
DATA=out/fashion_mnist
OUT=out/quickstart_vl
start=$(date +%s)
"$MM" version | head -2
if [ ! -s "$DATA/test.jsonl" ] || [ ! -s "$DATA/train.jsonl" ]; then
  "$MM" data fashion-mnist --out "$DATA" --threads 0
fi
rm -rf "$OUT"
"$MM" train examples/qwen2vl/tiny_fashion_mnist.yaml \
  data.paths="[$DATA/train.jsonl]" data.val_paths="[$DATA/test.jsonl]" \
  training.save_dir="$OUT" training.export_dir="$OUT/hf" training.log_interval=100 tools.tensorboard_dir="$OUT/tb"
"$MM" eval --model "$OUT" --data "$DATA/test.jsonl" --report "$OUT/eval.json"
image="$DATA/images/test/00000.png"
echo "question about $image (the dataset says: $(head -1 "$DATA/test.jsonl" | sed 's/.*"assistant","content":"\([^"]*\)".*/\1/')):"
"$MM" generate --model "$OUT" --image "$image" --prompt "What is shown in this picture?"
"$MM" report "$OUT" --out "$OUT/report.html"
echo "quickstart: $(( $(date +%s) - start )) s; checkpoint in $OUT, Hugging Face export in $OUT/hf, eval report $OUT/eval.json, plots in $OUT/report.html, TensorBoard events in $OUT/tb"
