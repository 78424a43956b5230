#!/usr/bin/env bash
# Train-step profile of the quickstart's vision-language model (bench/vl_step.cpp): tokens/s,
# MFU against the matmul ceiling measured in the same run, and the share of step time spent in
# the vision tower, the language model and waiting for the data loader.
#
# Usage: bash bench/run_vl_step.sh [BUILD_DIR]   (default: build)
# Environment: CONFIG (examples/qwen2vl/tiny_fashion_mnist.yaml), DATA (out/fashion_mnist; made
#              with `mm data fashion-mnist` when missing), STEPS (40), WARMUP (5), THREADS (1).
set -euo pipefail
BUILD_DIR=${1:-build}
CONFIG=${CONFIG:-examples/qwen2vl/tiny_fashion_mnist.yaml}
DATA=${DATA:-out/fashion_mnist}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-5}
THREADS=${THREADS:-1}
if [[ ! -x "$BUILD_DIR/vl_step" ]]; then
  echo "run_vl_step: $BUILD_DIR/vl_step not found; build first (cmake --build $BUILD_DIR --target vl_step)" >&2
  exit 1
fi
if [[ ! -s "$DATA/train.jsonl" ]]; then
  "$BUILD_DIR/mm" data fashion-mnist --out "$DATA" --max-train 4000 --max-test 100 --threads 0
fi
busy=$(ps -eo comm= | grep -c -x -E 'cc1plus|mm|vl_step' || true)
if [[ $busy -gt 0 ]]; then
  echo "run_vl_step: warning: $busy compiler/mm processes already running; timings will be noisy" >&2
fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
"$BUILD_DIR/vl_step" "$CONFIG" "$DATA" "$STEPS" "$WARMUP" "$THREADS"
