#!/usr/bin/env bash
# Tensor and pipeline parallel steps against one process, on the tiny Qwen2 text model of
# examples/qwen2 (4 layers) with the same global batch: one process, TP2, TP2+SP and PP2 (1F1B)
# with 2, 4 and 8 micro-batches per step, 1 thread per rank, ranks under `mm launch` (Gloo over
# loopback). Prints the median step time, its ratio to one process, and the share of the step
# rank 0 spends blocked in communication (the trainer's comm_s: all-gathers / reduce-scatters for
# TP; for PP stage 0's waits for activations' gradients, i.e. its bubble plus the transfers),
# beside 1F1B's ideal bubble (p-1)/(m+p-1).
#
# With 2 ranks on 2 cores PP can show speed-up (each stage has a core); TP2 splits every matrix
# product in two, so its ratio shows the per-layer collectives' cost against halved GEMMs.
#
# Usage: bash bench/run_parallel_step.sh [BUILD_DIR]   (default: build)
# Environment: STEPS (20), MBS (4), CORPUS (/usr/share/games/fortunes/fortunes)
set -euo pipefail
BUILD_DIR=${1:-build}
STEPS=${STEPS:-20}
MBS=${MBS:-4}
CORPUS=${CORPUS:-/usr/share/games/fortunes/fortunes}
MM="$BUILD_DIR/mm"
[[ -x "$MM" ]] || { echo "run_parallel_step: $MM not found; build first" >&2; exit 1; }
[[ -s "$CORPUS" ]] || { echo "run_parallel_step: $CORPUS missing (apt-get install fortunes)" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
COMMON=(examples/qwen2/tiny_fortunes.yaml "data.paths=[$CORPUS]" training.train_iters=$STEPS
        training.micro_batch_size=$MBS training.eval_iters=1 training.save_dir= training.resume=
        tools.sample.prompt= tools.progress=lines training.threads=1)
run() {  # name ranks overrides...
  local name=$1 n=$2; shift 2
  local cmd=("$MM" train "${COMMON[@]}" "training.metrics_file=$OUT/$name.jsonl" "$@")
  if [[ $n -gt 1 ]]; then
    "$MM" launch --nproc-per-node "$n" --master-port $((20000 + RANDOM % 20000)) -- "${cmd[@]}" > "$OUT/$name.log" 2>&1
  else
    "${cmd[@]}" > "$OUT/$name.log" 2>&1
  fi || { echo "run_parallel_step: $name failed:"; tail -5 "$OUT/$name.log"; exit 1; }
}
for m in 2 4 8; do
  run "one_m$m" 1 training.gradient_accumulation_steps=$m
  run "pp2_m$m" 2 parallel.pipeline_parallel_size=2 training.gradient_accumulation_steps=$m
done
run tp2 2 parallel.tensor_parallel_size=2 training.gradient_accumulation_steps=4
run tp2sp 2 parallel.tensor_parallel_size=2 parallel.sequence_parallel=true training.gradient_accumulation_steps=4
/usr/bin/python3 - "$OUT" "$MBS" <<'PY'
import json, statistics, sys
out, mbs = sys.argv[1], int(sys.argv[2])
def stats(name):
    recs = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"loss"' in l][3:]  # after 3 warm-up steps
    return statistics.median(r["step_time_s"] for r in recs), statistics.median(r.get("comm_s", 0.0) for r in recs)
print(f"micro-batch {mbs} rows of 128 tokens; median step time after 3 warm-up steps; 1 thread per rank")
print(f"{'layout':<24}{'step ms':>9}{'vs one process':>16}{'rank 0 blocked':>16}{'1F1B bubble':>13}")
for m in (2, 4, 8):
    base, _ = stats(f"one_m{m}")
    print(f"{f'one process, m={m}':<24}{1e3*base:>9.1f}{1.0:>15.2f}x{'-':>16}{'-':>13}")
    t, c = stats(f"pp2_m{m}")
    print(f"{f'PP2 1F1B, m={m}':<24}{1e3*t:>9.1f}{t/base:>15.2f}x{100*c/t:>15.1f}%{100/(m+1):>12.1f}%")
    if m == 4:
        for name, label in (("tp2", "TP2, m=4"), ("tp2sp", "TP2+SP, m=4")):
            t, c = stats(name)
            print(f"{label:<24}{1e3*t:>9.1f}{t/base:>15.2f}x{100*c/t:>15.1f}%{'-':>13}")
PY
