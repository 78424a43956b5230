#!/usr/bin/env bash
# Data-parallel step time: one process against DDP and FSDP over N ranks (mm launch, Gloo over
# loopback) at the same per-rank batch, on the tiny Qwen2 text model of examples/qwen2. Prints the
# median step time of each, its ratio to one process, and the share of the step spent waiting for
# collectives (the trainer's comm_s metric).
#
# On a 2-core machine the ranks share two cores, so this shows overhead only, never speed-up:
# N ranks do N times the work of one process on the same cores, and a ratio near N is expected.
#
# Usage: bash bench/run_dist_step.sh [BUILD_DIR]   (default: build)
# Environment: RANKS (2), STEPS (30), MBS (4, per rank), CORPUS (/usr/share/games/fortunes/fortunes)
set -euo pipefail
BUILD_DIR=${1:-build}
RANKS=${RANKS:-2}
STEPS=${STEPS:-30}
MBS=${MBS:-4}
CORPUS=${CORPUS:-/usr/share/games/fortunes/fortunes}
MM="$BUILD_DIR/mm"
[[ -x "$MM" ]] || { echo "run_dist_step: $MM not found; build first" >&2; exit 1; }
[[ -s "$CORPUS" ]] || { echo "run_dist_step: $CORPUS missing (apt-get install fortunes)" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
COMMON=(examples/qwen2/tiny_fortunes.yaml "data.paths=[$CORPUS]" training.train_iters=$STEPS
        training.micro_batch_size=$MBS training.gradient_accumulation_steps=1 training.eval_iters=1
        training.save_dir= training.resume= tools.sample.prompt= tools.progress=lines training.threads=1)
run() {  # name ranks overrides...
  local name=$1 n=$2; shift 2
  local cmd=("$MM" train "${COMMON[@]}" "training.metrics_file=$OUT/$name.jsonl" "$@")
  if [[ $n -gt 1 ]]; then
    "$MM" launch --nproc-per-node "$n" --master-port $((20000 + RANDOM % 20000)) -- "${cmd[@]}" > "$OUT/$name.log" 2>&1
  else
    "${cmd[@]}" > "$OUT/$name.log" 2>&1
  fi || { echo "run_dist_step: $name failed:"; tail -5 "$OUT/$name.log"; exit 1; }
}
run one 1
run ddp "$RANKS" parallel.data_parallel_replicate_size=$RANKS
run fsdp "$RANKS" parallel.data_parallel_shard_size=$RANKS
/usr/bin/python3 - "$OUT" "$RANKS" "$MBS" <<'PY'
import json, statistics, sys
out, ranks, mbs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def stats(name):
    recs = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"loss"' in l]
    recs = recs[3:]  # warm-up steps
    t = statistics.median(r["step_time_s"] for r in recs)
    c = statistics.median(r.get("comm_s", 0.0) for r in recs)
    return t, c
base, _ = stats("one")
print(f"per-rank batch {mbs} rows; median step time over the steps after 3 warm-up steps")
print(f"{'layout':<22}{'step ms':>9}{'vs one process':>16}{'in collectives':>16}")
print(f"{'one process':<22}{1e3*base:>9.1f}{1.0:>15.2f}x{'-':>16}")
for name, label in (("ddp", f"DDP over {ranks}"), ("fsdp", f"FSDP over {ranks}")):
    t, c = stats(name)
    print(f"{label:<22}{1e3*t:>9.1f}{t/base:>15.2f}x{100*c/t:>15.1f}%")
print(f"({ranks} ranks on {__import__('os').cpu_count()} cores: overhead only; each rank does one process's work)")
PY
