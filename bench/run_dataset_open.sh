#!/usr/bin/env bash
# Opening a large mllm training set (issue 17, part 9): bench/dataset_open.cpp at 1M and 10M
# synthetic records. For each size: the first open (scan + cache), then a rank's open in a fresh
# process (the cached index, split, mixture, sampler); at 1M also the whole-file reader the
# dataset used before (records in memory), as the baseline. Prints a table.
#
# Usage: bash bench/run_dataset_open.sh [BUILD_DIR]     Environment: SIZES (default "1000000 10000000")
set -euo pipefail
BUILD_DIR=${1:-build}
BIN="$BUILD_DIR/dataset_open"
[[ -x "$BIN" ]] || { echo "run_dataset_open: $BIN not found; build first (cmake --build $BUILD_DIR --target dataset_open)" >&2; exit 1; }
WORK="$BUILD_DIR/bench_dataset_open"
SIZES=${SIZES:-"1000000 10000000"}
printf '%-10s %-9s %10s %18s %18s\n' records phase seconds "RSS B/record" "index B/record"
for n in $SIZES; do
  "$BIN" --records "$n" --dir "$WORK" --phase write
  phases="build open"
  [[ "$n" -le 1000000 ]] && phases="$phases baseline"
  for phase in $phases; do
    line=$("$BIN" --records "$n" --dir "$WORK" --phase "$phase" 2>/dev/null | grep '^RESULT')
    get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
    printf '%-10s %-9s %10s %18s %18s\n' "$n" "$phase" "$(get seconds)" "$(get rss_bytes_per_record)" "$(get index_bytes_per_record)"
  done
done
