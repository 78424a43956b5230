#!/usr/bin/env bash
# Wan2.1 DiT train step: mm's train_step (bench/dit_step.cpp) against the same model and step in
# PyPI's diffusers + torch 2.11 (bench/dit_step_baseline.py), same threads, same weights and
# inputs (prepared once by the baseline), alternating mm, diffusers, mm, diffusers (ROUNDS) and
# keeping the best of each. Prints a table and the ratio. Meaningful on an otherwise idle machine.
#
# Usage: bash bench/run_dit_step.sh [BUILD_DIR]      (default: build)
# Environment: THREADS (1), STEPS (5), WARMUP (2), ROUNDS (2), PRECISIONS ("fp32 bf16"), DEVICE (cpu),
#              SHAPE (baseline flags for the model and batch; default: 8 heads x 64, ffn 1536,
#              4 layers, text 512 x 64 tokens, batch 2 of 16x5x16x16 latents = 320 tokens each),
#              PYTHON (the project's .venv python).
set -euo pipefail
BUILD_DIR=${1:-build}
THREADS=${THREADS:-1}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
PRECISIONS=${PRECISIONS:-"fp32 bf16"}
DEVICE=${DEVICE:-cpu}
SHAPE=${SHAPE:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-$HERE/../.venv/bin/python}
if [[ ! -x "$BUILD_DIR/dit_step" ]]; then
  echo "run_dit_step: $BUILD_DIR/dit_step not found; build first (cmake --build $BUILD_DIR --target dit_step)" >&2
  exit 1
fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# shellcheck disable=SC2086
"$PYTHON" "$HERE/dit_step_baseline.py" --prepare "$WORK" --steps "$STEPS" --warmup "$WARMUP" $SHAPE
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
run_one() {  # IMPL PRECISION -> RESULT line
  local out
  if [[ $1 == mm ]]; then
    out=$("$BUILD_DIR/dit_step" --dir "$WORK" --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS" --precision "$2" --device "$DEVICE")
  else
    out=$("$PYTHON" "$HERE/dit_step_baseline.py" --dir "$WORK" --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS" \
          --precision "$2" --device "$DEVICE")
  fi
  grep '^RESULT ' <<<"$out" | tail -n 1
}
echo "DiT train step, Wan2.1 architecture (${SHAPE:-8 heads x 64, ffn 1536, 4 layers, 2 x 320 latent tokens, 64 text tokens}), $DEVICE, threads $THREADS, $STEPS timed steps after $WARMUP, best of $ROUNDS"
printf '%-10s %-5s %12s %10s %12s %12s\n' impl prec tokens/s ms/step loss_first loss_last
for prec in $PRECISIONS; do
  declare -A best=() line=()
  for ((r = 0; r < ROUNDS; r++)); do
    for impl in mm diffusers; do
      res=$(run_one "$impl" "$prec")
      ms=$(field step_ms "$res")
      if [[ -z ${best[$impl]:-} ]] || awk "BEGIN{exit !($ms < ${best[$impl]})}"; then best[$impl]=$ms; line[$impl]=$res; fi
    done
  done
  for impl in mm diffusers; do
    r=${line[$impl]}
    printf '%-10s %-5s %12s %10s %12s %12s\n' "$impl" "$prec" "$(field tokens_per_s "$r")" "$(field step_ms "$r")" \
      "$(field loss_first "$r")" "$(field loss_last "$r")"
  done
  echo "ratio ($prec): mm is $(awk "BEGIN{printf \"%.2f\", ${best[diffusers]} / ${best[mm]}}")x diffusers' speed"
  unset best line
done
