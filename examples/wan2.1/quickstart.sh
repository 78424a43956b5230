#!/usr/bin/env bash
# The job of `make quickstart-video`: Wan2.1 text-to-video trained from nothing on a CPU, judged.
#   1. mm data moving-fashion-mnist: real Fashion-MNIST garments (Debian's dataset-fashion-mnist)
#      sliding left/right/up/down over 5 frames at 48x48, captioned "a sandal moving left"
#   2. mm train tiny_vae.yaml: a tiny causal 3-D VAE; mm data latent-stats: its latents' mean/std
#   3. mm init tokenizer / text-encoder: the captions' words and a small random umT5
#   4. mm data extract-features: VAE latents + umT5 text features, once, to safetensors shards
#   5. mm train tiny_dit.yaml: a tiny Wan DiT by flow matching on them
#   6. mm sample: every class x direction twice (80 prompts) with seeds never used in training
#   7. mm judge: a classifier trained only on real Fashion-MNIST images, plus the garment's
#      centroid track, scores the generated videos (goals: class >= 70%, direction >= 80%)
# The sizes below are the quickstart's; the environment variables shrink it for the smoke test.
set -euo pipefail
MM=${1:-build/mm}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${QV_DATA:-out/moving_fashion_mnist}
OUT=${QV_OUT:-out/quickstart_video}
TRAIN_CLIPS=${QV_TRAIN_CLIPS:-6000}
TEST_CLIPS=${QV_TEST_CLIPS:-200}
VAE_ITERS=${QV_VAE_ITERS:-1200}
DIT_ITERS=${QV_DIT_ITERS:-6000}
STEPS=${QV_STEPS:-30}
SEED=${QV_SEED:-100000}                 # sampling seeds: 100000..100079, none used in training
JUDGE_EPOCHS=${QV_JUDGE_EPOCHS:-2}
SIZE=48 FRAMES=5 TEXT_LEN=16
# Every core for the math (the Makefile sets OMP_NUM_THREADS=1 for the tests, which nproc would echo; the smoke test keeps 1).
export OMP_NUM_THREADS=${QV_THREADS:-$(getconf _NPROCESSORS_ONLN)}
start=$(date +%s)
stage() { echo "== quickstart-video: $1 ($(( $(date +%s) - start )) s)"; }
"$MM" version | head -2

stage "data"
if [ ! -s "$DATA/test.jsonl" ] || [ "$(wc -l < "$DATA/train.jsonl")" -ne "$TRAIN_CLIPS" ] ||
   [ "$(wc -l < "$DATA/test.jsonl")" -ne "$TEST_CLIPS" ]; then
  rm -rf "$DATA"
  "$MM" data moving-fashion-mnist --out "$DATA" --train "$TRAIN_CLIPS" --test "$TEST_CLIPS" \
    --size $SIZE --frames $FRAMES --speed 4
fi
rm -rf "$OUT"
mkdir -p "$OUT/pipe"

stage "VAE"
"$MM" train "$HERE/tiny_vae.yaml" data.paths="[$DATA/train.jsonl]" training.train_iters="$VAE_ITERS" \
  training.save_dir="$OUT/vae_run" training.export_dir="$OUT/pipe/vae"
"$MM" data latent-stats --model "$OUT/pipe/vae" --data "$DATA/train.jsonl" --size ${SIZE}x${SIZE}x${FRAMES}

stage "text encoder"
"$MM" init tokenizer --captions "$DATA/train.jsonl" --max-length $TEXT_LEN --out "$OUT/pipe/tokenizer"
"$MM" init text-encoder --tokenizer "$OUT/pipe/tokenizer" \
  --config '{"d_model": 64, "d_kv": 16, "num_heads": 4, "d_ff": 128, "num_layers": 2}' --out "$OUT/pipe/text_encoder"

stage "features"
"$MM" data extract-features --model "$OUT/pipe" --data "$DATA/train.jsonl" --out "$OUT/features" \
  --buckets ${SIZE}x${SIZE}x${FRAMES} --max-sequence-length $TEXT_LEN

stage "DiT"
"$MM" train "$HERE/tiny_dit.yaml" data.paths="[$OUT/features]" training.train_iters="$DIT_ITERS" \
  training.save_dir="$OUT/dit_run" training.export_dir="$OUT/pipe/transformer"

stage "sampling"
: > "$OUT/prompts.txt"
for round in 1 2; do
  for garment in "a t-shirt" "a trouser" "a pullover" "a dress" "a coat" "a sandal" "a shirt" "a sneaker" "a bag" "an ankle boot"; do
    for direction in left right up down; do echo "$garment moving $direction" >> "$OUT/prompts.txt"; done
  done
done
"$MM" sample --model "$OUT/pipe" --prompts "$OUT/prompts.txt" --seed "$SEED" --frames $FRAMES --height $SIZE --width $SIZE \
  --steps "$STEPS" --max-sequence-length $TEXT_LEN --out "$OUT/samples/clip.mp4"

stage "judge"
"$MM" judge --data "$OUT/samples/clip.jsonl" --data "$DATA/test.jsonl" --epochs "$JUDGE_EPOCHS" --report "$OUT/judge.json"
echo "quickstart-video: $(( $(date +%s) - start )) s; pipeline in $OUT/pipe, videos and contact sheets in $OUT/samples, scores in $OUT/judge.json"
