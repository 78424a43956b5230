#!/usr/bin/env bash
# Loader benchmark: mm's DataLoader (bench/loader.cpp) against the same per-sample work in Python
# (bench/loader_baseline.py: PIL, numpy, torchvision.io + torch DataLoader) on real media from
# pinned Debian packages (tests/media/fetch_media.sh), with 1 and 2 workers, plus the rate at which
# the trainer consumes the same data on the quickstart model. Prints a table and the ratios.
# Timings are only meaningful on an otherwise idle machine.
#
# Usage: bash bench/run_loader.sh [BUILD_DIR]          (default: build)
# Environment: SAMPLES (images per measurement, default 120), VIDEO_SAMPLES (24), PYTHON (the project's .venv python)
set -euo pipefail

BUILD_DIR=${1:-build}
SAMPLES=${SAMPLES:-120}
VIDEO_SAMPLES=${VIDEO_SAMPLES:-24}
PYTHON=${PYTHON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN="$BUILD_DIR/loader"
[[ -x "$BIN" ]] || { echo "run_loader: $BIN not found; build first (cmake --build $BUILD_DIR --target loader)" >&2; exit 1; }
"$PYTHON" -c 'import torch, torchvision, av, PIL' 2>/dev/null \
  || { echo "run_loader: $PYTHON needs torch, torchvision, av and pillow (scripts/install_deps.sh puts them in .venv)" >&2; exit 1; }

MEDIA="$BUILD_DIR/test_media"
bash "$ROOT/tests/media/fetch_media.sh" "$MEDIA"
WORK="$BUILD_DIR/bench_loader"
rm -rf "$WORK" && mkdir -p "$WORK/clips"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# Images: every photo and PNG variant of the test media, one VQA-style sample each.
: > "$WORK/images.jsonl"
for f in "$MEDIA"/images/*; do
  printf '{"messages":[{"role":"user","content":"<image>Describe this picture."},{"role":"assistant","content":"A picture."}],"images":["%s"]}\n' \
    "$(realpath "$f")" >> "$WORK/images.jsonl"
done
# Videos: 3-second clips of the test videos: OpenCV's vtest.avi as AVI (MPEG-4 part 2) and as
# H.264 MP4, GNOME's help animation as VP8 WebM.
: > "$WORK/videos.jsonl"
i=0
clip() {  # clip SRC START EXT CODEC_ARGS...
  local src="$1" start="$2" ext="$3"; shift 3
  local out="$WORK/clips/clip$i.$ext"
  ffmpeg -loglevel error -y -ss "$start" -i "$src" -t 3 "$@" "$out"
  printf '{"messages":[{"role":"user","content":"<video>What happens?"},{"role":"assistant","content":"Things move."}],"videos":["%s"]}\n' \
    "$(realpath "$out")" >> "$WORK/videos.jsonl"
  i=$((i + 1))
}
for start in 0 20 40; do
  clip "$MEDIA/videos/vtest.avi" "$start" avi -c:v mpeg4 -q:v 3
  clip "$MEDIA/videos/vtest.avi" "$start" mp4 -c:v libx264 -pix_fmt yuv420p
  clip "$MEDIA/videos/display-dual-monitors.webm" "$((start / 4))" webm -c:v libvpx -b:v 1M
done

results=()
while read -r line; do results+=("$line"); done < <(
  "$BIN" --data "$WORK/images.jsonl" --kind images --samples "$SAMPLES" | grep '^RESULT'
  "$PYTHON" "$HERE/loader_baseline.py" "$WORK/images.jsonl" images "$SAMPLES" 4 | grep '^RESULT'
  "$BIN" --data "$WORK/videos.jsonl" --kind videos --samples "$VIDEO_SAMPLES" --warmup 2 --train-batch 2 --train-steps 6 | grep '^RESULT'
  "$PYTHON" "$HERE/loader_baseline.py" "$WORK/videos.jsonl" videos "$VIDEO_SAMPLES" 2 | grep '^RESULT'
)
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
rate() {  # rate IMPL KIND WORKERS
  for r in "${results[@]}"; do
    if [[ "$(field impl "$r")" == "$1" && "$(field kind "$r")" == "$2" && "$(field workers "$r")" == "$3" ]]; then
      field samples_per_s "$r"; return
    fi
  done
}
printf '\n%-7s %-8s %14s %14s %8s\n' kind workers "mm samples/s" "python" "ratio"
for kind in images videos; do
  for w in 1 2; do
    m=$(rate mm "$kind" "$w"); p=$(rate python "$kind" "$w")
    printf '%-7s %-8s %14s %14s %7.2fx\n' "$kind" "$w" "$m" "$p" "$(awk -v a="$m" -v b="$p" 'BEGIN{print a/b}')"
  done
done
printf '\n%-7s %22s %20s %22s\n' kind "train consumes (s/s)" "loader 2w (s/s)" "loader / consumption"
for r in "${results[@]}"; do
  [[ "$(field impl "$r")" == mm-train ]] || continue
  kind=$(field kind "$r"); c=$(field samples_per_s "$r"); l=$(rate mm "$kind" 2)
  printf '%-7s %22s %20s %21.2fx   (step %s ms at batch %s; fed by the loader: %s samples/s)\n' "$kind" "$c" "$l" \
    "$(awk -v a="$l" -v b="$c" 'BEGIN{print a/b}')" "$(field step_ms "$r")" "$(field batch "$r")" "$(field fed_samples_per_s "$r")"
done
