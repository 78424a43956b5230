#!/usr/bin/env bash
# Train-step benchmark: the tiny Qwen2 LM (examples/qwen2/tiny_fortunes.yaml sizes) in our engine
# (bench/train_step.cpp) against the same model and loop in eager PyTorch
# (bench/train_step_baseline.py), same threads, same batch, same weights and data.
# Runs mm, pytorch, mm, pytorch (ROUNDS rounds) and keeps the best of each; prints a table and
# the ratio. Timings are only meaningful on an otherwise idle machine.
#
# Usage: bash bench/run_train_step.sh [BUILD_DIR]      (default: build)
# Environment: THREADS (default 1), STEPS (20), WARMUP (3), ROUNDS (2), PRECISIONS ("fp32 bf16"),
#              PYTHON (the project's .venv python: PyPI's torch 2.11, the same engine as mm).
set -euo pipefail

BUILD_DIR=${1:-build}
THREADS=${THREADS:-1}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
ROUNDS=${ROUNDS:-2}
PRECISIONS=${PRECISIONS:-"fp32 bf16"}
PYTHON=${PYTHON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MM_BIN="$BUILD_DIR/train_step"

if [[ ! -x "$MM_BIN" ]]; then
  echo "run_train_step: $MM_BIN not found; build first (cmake --build $BUILD_DIR --target train_step)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "run_train_step: $PYTHON cannot import torch; run scripts/install_deps.sh or set PYTHON" >&2
  exit 1
fi

# Both sides get the same intra-op threads, and OpenBLAS/OpenMP pools of the same size.
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
ARGS=(--threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP")

# field NAME LINE -> the value of NAME=... in a RESULT line
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

# run_one IMPL PRECISION -> the RESULT line (exits non-zero if the run fails or prints none)
run_one() {
  local out rc=0
  if [[ $1 == mm ]]; then
    out=$("$MM_BIN" "${ARGS[@]}" --precision "$2") || rc=$?
  else
    out=$("$PYTHON" "$HERE/train_step_baseline.py" "${ARGS[@]}" --precision "$2") || rc=$?
  fi
  [[ $rc == 0 ]] || { echo "run_train_step: $1 $2 failed (exit status $rc)" >&2; return 1; }
  out=$(grep '^RESULT ' <<<"$out" | tail -n 1 || true)
  [[ -n $out ]] || { echo "run_train_step: $1 $2 printed no RESULT line" >&2; return 1; }
  echo "$out"
}

busy=$(ps -eo comm= | grep -c -x -E 'cc1plus|train_step' || true)
if [[ $busy -gt 0 ]]; then
  echo "run_train_step: warning: $busy compiler/train_step processes already running; timings will be noisy" >&2
fi
echo "train step, tiny Qwen2 (hidden 192, 4 layers, vocab 260), batch 16 x seq 128, threads $THREADS, $STEPS timed steps after $WARMUP warm-up, best of $ROUNDS"
printf '%-9s %-5s %12s %10s %11s %10s\n' impl prec tokens/s ms/step loss_first loss_last
for prec in $PRECISIONS; do
  declare -A best=()
  declare -A line=()
  for ((round = 1; round <= ROUNDS; round++)); do
    for impl in mm pytorch; do
      r=$(run_one "$impl" "$prec")
      t=$(field tokens_per_s "$r")
      if [[ -z ${best[$impl]:-} ]] || awk -v a="$t" -v b="${best[$impl]}" 'BEGIN{exit !(a>b)}'; then
        best[$impl]=$t
        line[$impl]=$r
      fi
    done
  done
  for impl in mm pytorch; do
    r=${line[$impl]}
    printf '%-9s %-5s %12s %10s %11s %10s\n' "$impl" "$prec" "$(field tokens_per_s "$r")" "$(field step_ms "$r")" \
      "$(field loss_first "$r")" "$(field loss_last "$r")"
  done
  awk -v a="${best[mm]}" -v b="${best[pytorch]}" -v p="$prec" 'BEGIN{printf "ratio mm/pytorch (%s) = %.2f\n", p, a/b}'
  unset best line
done
