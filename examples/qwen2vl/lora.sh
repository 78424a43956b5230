#!/usr/bin/env bash
# LoRA on the quickstart's model (examples/qwen2vl/README.md, "LoRA"):
#   1. the base: the quickstart's full fine-tune (out/quickstart_vl; run quickstart.sh first, or
#      this script runs it)
#   2. a second task on the same images: the question in German, answered with German class names
#   3. the base scored on it (it has never seen these answers), then LoRA adapters trained on it
#      (tiny_fashion_mnist_lora.yaml), the base + adapter scored with `mm eval --adapter`
#   4. `mm generate --adapter` about the first test image
set -euo pipefail
MM=${1:-build/mm}
DATA=out/fashion_mnist
BASE=out/quickstart_vl
OUT=out/lora_vl
start=$(date +%s)
if [ ! -s "$BASE/hf/model.safetensors" ] && [ ! -s "$BASE/hf/model.safetensors.index.json" ]; then
  bash examples/qwen2vl/quickstart.sh "$MM"
fi
if [ ! -s "$DATA/de_test.jsonl" ] || [ ! -s "$DATA/de_train.jsonl" ]; then
  "$MM" data fashion-mnist --out "$DATA" --threads 0 --jsonl-prefix de_ --question "Was ist auf diesem Bild?" \
    --answers "T-Shirt,Hose,Pullover,Kleid,Mantel,Sandale,Hemd,Turnschuh,Tasche,Stiefelette"
fi
echo "the base on the German task, before LoRA:"
"$MM" eval --model "$BASE" --data "$DATA/de_test.jsonl" --max-samples 1000
rm -rf "$OUT"
"$MM" train examples/qwen2vl/tiny_fashion_mnist_lora.yaml model.pretrained="$BASE/hf" \
  data.paths="[$DATA/de_train.jsonl]" data.val_paths="[$DATA/de_test.jsonl]" \
  training.save_dir="$OUT" training.export_dir="$OUT/adapter_export"
echo "the base with the adapter (no merge), on the 10,000 German test questions:"
"$MM" eval --model "$BASE" --adapter "$OUT/adapter_export" --data "$DATA/de_test.jsonl" --report "$OUT/eval.json"
image="$DATA/images/test/00000.png"
echo "question about $image (the dataset says: Stiefelette):"
"$MM" generate --model "$BASE" --adapter "$OUT/adapter_export" --image "$image" --prompt "Was ist auf diesem Bild?"
echo "lora: $(( $(date +%s) - start )) s; adapter (PEFT format) in $OUT/adapter_export, eval report $OUT/eval.json"
