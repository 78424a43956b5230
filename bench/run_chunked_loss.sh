#!/usr/bin/env bash
# Peak memory of the language-model loss at Qwen2's vocabulary (151,936) and 16k tokens a step,
# whole logits against training.loss_chunk_size (issue 22): a one-layer Qwen2 (hidden 64) on
# Debian's fortunes, one row of SEQ tokens, two steps, the measured peak of live tensors
# (`peak tensor memory in the steps`, the counting allocator) and `mm memory`'s estimate.
# The whole-logits run at 16k needs about 40 GiB (the logits, their log-softmax and both
# gradients are 9.3 GiB each): it is measured at 4k tokens here and estimated at 16k, unless
# WHOLE_SEQ is set higher on a machine with the memory.
# Usage: bash bench/run_chunked_loss.sh [BUILD_DIR]
set -euo pipefail
BUILD_DIR=${1:-build}
MM="$BUILD_DIR/mm"
WORK=${WORK:-out/bench_chunked_loss}
SEQ=${SEQ:-16384}
WHOLE_SEQ=${WHOLE_SEQ:-4096}
CHUNK=${CHUNK:-2048}
export OMP_NUM_THREADS=2
rm -rf "$WORK" && mkdir -p "$WORK"
cat > "$WORK/lm.yaml" <<YAML
data: {paths: [/usr/share/games/fortunes], format: fortune, seq_len: $SEQ, val_fraction: 0.05}
model: {id: qwen2, config: {vocab_size: 151936, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, tie_word_embeddings: true}}
training: {train_iters: 2, micro_batch_size: 1, optimizer: {lr: 0.001}, eval_iters: 0, eval_interval: 0, seed: 1}
tools: {progress: lines}
YAML
peak() { sed -n 's/.*peak tensor memory in the steps (MiB) by rank: \([0-9.]*\).*/\1/p' "$1"; }
estimate() { "$MM" memory "$WORK/lm.yaml" "$@" | sed -n 's/^  peak *\([0-9.]*\) MiB.*/\1/p'; }
"$MM" train "$WORK/lm.yaml" training.loss_chunk_size=$CHUNK training.save_dir="$WORK/chunked" > "$WORK/chunked.log" 2>&1
"$MM" train "$WORK/lm.yaml" data.seq_len=$WHOLE_SEQ training.save_dir="$WORK/whole" > "$WORK/whole.log" 2>&1
echo "| tokens | loss | measured peak | mm memory |"
echo "|---|---|---|---|"
echo "| $WHOLE_SEQ | whole logits | $(peak "$WORK/whole.log") MiB | $(estimate data.seq_len=$WHOLE_SEQ) MiB |"
echo "| $SEQ | whole logits | (needs more memory than this machine) | $(estimate) MiB |"
echo "| $SEQ | chunks of $CHUNK tokens | $(peak "$WORK/chunked.log") MiB | $(estimate training.loss_chunk_size=$CHUNK) MiB |"
