#!/usr/bin/env bash
# Causal attention time per token (forward + backward) at 4k, 16k and 64k tokens: one process
# against Ulysses and ring (zigzag) context parallelism over N ranks (mm launch, Gloo over
# loopback), 8 query and 2 key/value heads of 64, fp32. The same cores in all three: one process
# uses N threads, each rank one. On a 2-core machine this compares the algorithms' overheads
# (communication, blocking, the skipped blocks of the causal mask); it cannot show the memory
# win, which is the point of context parallelism: each rank holds 1/N of the sequence.
#
# Usage: bash bench/run_cp_attention.sh [BUILD_DIR]   (default: build)
# Environment: RANKS (2), SEQS ("4096 16384 65536"), DEVICE (cpu; cuda on a GPU machine)
set -euo pipefail
BUILD_DIR=${1:-build}
RANKS=${RANKS:-2}
SEQS=${SEQS:-"4096 16384 65536"}
DEVICE=${DEVICE:-cpu}
BIN="$BUILD_DIR/cp_attention"
MM="$BUILD_DIR/mm"
[[ -x "$BIN" && -x "$MM" ]] || { echo "run_cp_attention: $BIN or $MM not found; build first" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
printf "%-8s %-8s %12s %14s %10s\n" tokens algo "s/iter" "us/token" "vs one"
for S in $SEQS; do
  # Long sequences: one timed iteration, no warm-up (a 64k step takes minutes on 2 cores).
  if [[ $S -ge 16384 ]]; then IT=(--iters 1 --warmup 0); else IT=(--iters 3 --warmup 1); fi
  one=$("$BIN" --algo one --seq "$S" --threads "$RANKS" --device "$DEVICE" "${IT[@]}")
  base=$(sed -E 's/.*: ([0-9.]+) s per.*/\1/' <<<"$one")
  printf "%-8s %-8s %12s %14s %10s\n" "$S" one "$base" "$(sed -E 's/.*, ([0-9.]+) us per token/\1/' <<<"$one")" 1.00
  for algo in ulysses ring; do
    line=$("$MM" launch --nproc-per-node "$RANKS" --master-port $((20000 + RANDOM % 20000)) -- \
             "$BIN" --algo "$algo" --seq "$S" --threads 1 --device "$DEVICE" "${IT[@]}" | grep "^\[rank 0\]")
    t=$(sed -E 's/.*: ([0-9.]+) s per.*/\1/' <<<"$line")
    printf "%-8s %-8s %12s %14s %10.2f\n" "$S" "$algo" "$t" "$(sed -E 's/.*, ([0-9.]+) us per token/\1/' <<<"$line")" \
      "$(python3 -c "print($t / $base)")"
  done
done
