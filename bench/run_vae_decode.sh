#!/usr/bin/env bash
# Wan2.1 VAE decode (bench/vae_decode.cpp): frames/s and peak memory of the chunked decode with
# the feature cache (one latent frame at a time, what `mm sample` does) against decoding the whole
# clip in one pass, each in its own process, for clips of increasing length.
#
# Usage: bash bench/run_vae_decode.sh [BUILD_DIR]   (default: build)
# Environment: SIZE (latent side, 16 = 128x128 video), LENGTHS ("2 4 8" latent frames), THREADS (2).
set -euo pipefail
BUILD_DIR=${1:-build}
SIZE=${SIZE:-16}
LENGTHS=${LENGTHS:-"2 4 8"}
THREADS=${THREADS:-2}
if [[ ! -x "$BUILD_DIR/vae_decode" ]]; then
  echo "run_vae_decode: $BUILD_DIR/vae_decode not found; build first (cmake --build $BUILD_DIR --target vae_decode)" >&2
  exit 1
fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
for n in $LENGTHS; do
  for mode in chunked whole; do
    echo -n "latent frames $n, "
    "$BUILD_DIR/vae_decode" "$mode" "$n" "$SIZE" "$SIZE" "$THREADS"
  done
done
