#!/usr/bin/env bash
# What profiling costs (issue 21's goal: < 1% of step time when off).
#   1. bench/profile_overhead: the always-on per-step instrumentation (trace scopes with no window
#      open, the per-step memory reading), in microseconds.
#   2. The median step time of two real runs measured here: the tiny Qwen2 text model (the
#      smallest step we have) and the Fashion-MNIST VL quickstart's model; (1) as a share of each.
#   3. What the counting CPU allocator (the live-tensor bytes of the memory readings) adds: its
#      cost per allocation (against libtorch's, in bench/profile_overhead) times the tensors the
#      tiny text model's train step allocates (bench/train_step).
#   4. The same VL run with a 10-step profile window (operators, shapes, modules): the steps inside
#      it against those outside, i.e. what taking a profile costs while it runs.
# Usage: bash bench/run_profile_overhead.sh [BUILD_DIR]   (default: build)
set -euo pipefail
BUILD_DIR=${1:-build}
MM="$BUILD_DIR/mm"
DATA=${DATA:-out/fashion_mnist}
WORK=${WORK:-out/bench_profile}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[[ -x "$BUILD_DIR/profile_overhead" && -x "$BUILD_DIR/train_step" ]] ||
  { echo "build first: cmake --build $BUILD_DIR --target profile_overhead train_step mm" >&2; exit 1; }
if [[ ! -s "$DATA/train.jsonl" ]]; then "$MM" data fashion-mnist --out "$DATA" --max-train 4000 --max-test 100 --threads 0; fi
rm -rf "$WORK" && mkdir -p "$WORK"
"$BUILD_DIR/profile_overhead" 20000 > "$WORK/micro.txt"
over=$(head -1 "$WORK/micro.txt" | sed 's/.*: \([0-9.]*\) us.*/\1/')
alloc=$(tail -1 "$WORK/micro.txt" | sed 's/.*(+\([0-9.-]*\) ns).*/\1/')
# The tiny text model of the distributed tests (48 wide, 2 layers: a ~6 ms step, the smallest we
# have, where a fixed per-step cost shows most) on Debian's fortunes, and the VL quickstart's.
cat > "$WORK/text.yaml" <<YAML
data: {paths: [/usr/share/games/fortunes], format: text, seq_len: 32, val_fraction: 0.05}
model: {id: qwen2, config: {hidden_size: 48, intermediate_size: 96, num_hidden_layers: 2, num_attention_heads: 4,
        num_key_value_heads: 2, tie_word_embeddings: false}}
training: {train_iters: 400, micro_batch_size: 8, optimizer: {lr: 0.003}, eval_iters: 0, seed: 7}
tools: {progress: lines}
YAML
"$MM" train "$WORK/text.yaml" training.metrics_file="$WORK/text.jsonl" training.log_interval=1000 > "$WORK/text.log" 2>&1
# CPU tensors the same model's train step allocates (each one pays the counting allocator's cost).
allocs=$("$BUILD_DIR/train_step" --hidden 48 --layers 2 --heads 4 --kv-heads 2 --intermediate 96 --seq 32 --batch 8 \
  --steps 100 --warmup 10 | sed -n 's/^ALLOCATIONS.*per_step=\([0-9]*\).*/\1/p')
"$MM" train examples/qwen2vl/tiny_fashion_mnist.yaml data.paths="[$DATA/train.jsonl]" data.val_paths="[$DATA/test.jsonl]" \
  training.train_iters=60 training.eval_iters=1 training.metrics_file="$WORK/vl.jsonl" tools.progress=lines \
  training.log_interval=1000 tools.profile.start_step=21 tools.profile.steps=10 tools.profile.record_shapes=true \
  tools.profile.with_stack=true tools.profile.dir="$WORK/prof" > "$WORK/vl.log" 2>&1
python3 - "$WORK" "$over" "$alloc" "$allocs" <<'PY'
import json, statistics, sys
work, over, alloc, allocs = sys.argv[1], float(sys.argv[2]), max(0.0, float(sys.argv[3])), int(sys.argv[4])
def steps(path, lo, hi):
    out = []
    for line in open(path):
        j = json.loads(line)
        if "step_time_s" in j and lo <= j["iter"] <= hi:
            out.append(j["step_time_s"] * 1e6)
    return statistics.median(out)
text = steps(work + "/text.jsonl", 50, 400)
vl_off = statistics.median([steps(work + "/vl.jsonl", 6, 20), steps(work + "/vl.jsonl", 41, 60)])
vl_on = steps(work + "/vl.jsonl", 21, 30)
print("| what | per step | share |")
print("|---|---|---|")
print("| instrumentation with profiling off (trace scopes, memory reading) | %.1f us | |" % over)
print("| tiny Qwen2 text step (median, steps 50-400) | %.0f us | off: %.2f%% |" % (text, 100 * over / text))
print("| Fashion-MNIST VL quickstart step (median outside the window) | %.0f us | off: %.3f%% |" % (vl_off, 100 * over / vl_off))
print("| the same step inside a profile window (operators, shapes, modules) | %.0f us | on: %.2fx |" % (vl_on, vl_on / vl_off))
counting = allocs * alloc / 1000
print("| counting allocator: %d tensor allocations per tiny text step x %.1f ns | %.1f us | off: %.2f%% |" % (allocs, alloc, counting, 100 * counting / text))
print("| all of it on the tiny text step | %.1f us | off: %.2f%% |" % (over + counting, 100 * (over + counting) / text))
PY
