#!/usr/bin/env bash
# Runs one libFuzzer harness for SECONDS from its seeds: run_one.sh HARNESS CORPUS SEEDS FIXTURES SECONDS
# CORPUS keeps what earlier runs found; a crash leaves its input in CORPUS/../artifacts/ and fails.
set -uo pipefail
exe=$1 corpus=$2 seeds=$3 fixtures=$4 seconds=${MM_FUZZ_SECONDS_OVERRIDE:-$5}
# make test's short pass uses a fixed seed, so a fresh build explores the same inputs each time
# (a slower machine a prefix of them): the pass checks for regressions and does not fail at
# random on a bug nobody has seen yet. make fuzz-long (an override) draws a new seed each run.
seed_flag="-seed=1"
[ -n "${MM_FUZZ_SECONDS_OVERRIDE:-}" ] && seed_flag=""
name=$(basename "$exe")
mkdir -p "$corpus" "$(dirname "$corpus")/../artifacts"
artifacts=$(cd "$(dirname "$corpus")/../artifacts" && pwd)
log=$(mktemp)
# Every input that once was a finding is run again first (tests/fuzz/regressions/<harness>/).
regressions="$(cd "$(dirname "$0")" && pwd)/regressions/$name"
[ -d "$regressions" ] || regressions=""
# LeakSanitizer on: libFuzzer checks each input that allocates for a leak.
MM_FUZZ_FIXTURES="$fixtures" ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:${ASAN_OPTIONS:-}" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  "$exe" "$corpus" "$seeds" $regressions -max_total_time="$seconds" $seed_flag -timeout=30 -rss_limit_mb=6144 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$artifacts/$name-" >"$log" 2>&1
rc=$?
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
n=$(ls "$corpus" | wc -l)
if [ $rc -ne 0 ]; then
  tail -60 "$log"
  echo "$name: FINDING after ${runs:-?} runs (exit $rc); the input is in $artifacts"
  rm -f "$log"
  exit 1
fi
echo "$name: ${runs:-0} runs in ${seconds} s, coverage ${cov:-?} edges, corpus $n inputs (+ $(ls "$seeds" | wc -l) seeds), no finding"
rm -f "$log"
