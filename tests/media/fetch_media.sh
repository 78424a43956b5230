#!/usr/bin/env bash
# Fetches real test images (DIR/images) and videos (DIR/videos) from pinned Debian packages into
# DIR (default build/test_media, gitignored): the packages are downloaded with `apt-get download`
# (no root) and only the files listed below are extracted. Idempotent through DIR/.fetch_media.stamp.
# Silent on success; on failure one line naming the package, exit 1.
# Usage: bash tests/media/fetch_media.sh [DIR]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DIR="${1:-$ROOT/build/test_media}"
mkdir -p "$DIR"
exec 9>"$DIR/.fetch_media.lock"
flock -w 900 9 || { echo "fetch_media: timed out waiting for $DIR/.fetch_media.lock" >&2; exit 1; }

# package=version, then the files taken from it (paths inside the package).
OPENCV="opencv-doc=4.6.0+dfsg-12"
OPENCV_FILES=(
  usr/share/doc/opencv-doc/examples/data/baboon.jpg
  usr/share/doc/opencv-doc/examples/data/fruits.jpg
  usr/share/doc/opencv-doc/examples/data/building.jpg
  usr/share/doc/opencv-doc/examples/data/butterfly.jpg
  usr/share/doc/opencv-doc/examples/data/HappyFish.jpg
  usr/share/doc/opencv-doc/examples/data/aloeL.jpg
  usr/share/doc/opencv-doc/examples/data/chicky_512.png
  usr/share/doc/opencv-doc/examples/data/graf1.png
  usr/share/doc/opencv-doc/examples/data/box.png
  usr/share/doc/opencv-doc/examples/data/gradient.png
)
# Videos: OpenCV's sample clip (MS-MPEG4 v3 in AVI) and a GNOME help animation (VP8 in WebM).
OPENCV_VIDEOS=(
  usr/share/doc/opencv-doc/examples/data/vtest.avi
)
GNOME_HELP="gnome-user-docs=43.0-2"
GNOME_HELP_VIDEOS=(
  usr/share/help/C/gnome-help/figures/display-dual-monitors.webm
)
JXL="libjxl-testdata=0.0~git20230110.d6168ff-1"
JXL_FILES=(
  usr/share/libjxl-testdata/external/pngsuite/ccwn3p08.png
  usr/share/libjxl-testdata/external/pngsuite/ct1n0g04.png
  usr/share/libjxl-testdata/external/pngsuite/g10n3p04.png
  usr/share/libjxl-testdata/external/pngsuite/g04n2c08.png
  usr/share/libjxl-testdata/external/wesaturate/500px/tmshre_riaphotographs_alpha.png
  usr/share/libjxl-testdata/external/wesaturate/500px/cvo9xd_keong_macan_grayscale.png
  usr/share/libjxl-testdata/external/wesaturate/64px/Nikon-D3-14bit_2020_g1.png
  usr/share/libjxl-testdata/external/raw.pixls/DJI-FC6310-16bit_srgb8_v4_krita.png
)
EXPECTED="$(printf '%s\n' "$OPENCV" "${OPENCV_FILES[@]}" "${OPENCV_VIDEOS[@]}" "$JXL" "${JXL_FILES[@]}" \
  "$GNOME_HELP" "${GNOME_HELP_VIDEOS[@]}" v2)"
STAMP="$DIR/.fetch_media.stamp"
[ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$EXPECTED" ] && exit 0
rm -f "$STAMP"
LOG="$DIR/fetch_media.log"
: > "$LOG"
fail() { echo "fetch_media: $*" >&2; exit 1; }
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

fetch() {  # fetch SUBDIR PKG=VER FILE...: FILEs end up flat in DIR/SUBDIR
  local sub="$1" key="$2"; shift 2
  local pkg="${key%%=*}" ver="${key#*=}"
  mkdir -p "$DIR/debian"
  local deb
  deb="$(ls "$DIR/debian/${pkg}_${ver//:/%3a}_"*.deb 2>/dev/null | head -n1 || true)"
  if [ -z "$deb" ]; then
    (cd "$DIR/debian" && apt-get download "$key") >>"$LOG" 2>&1 \
      || { $SUDO apt-get update -qq >>"$LOG" 2>&1 || true; (cd "$DIR/debian" && apt-get download "$key") >>"$LOG" 2>&1; } \
      || fail "Debian package $key: apt-get download failed (see $LOG)"
    deb="$(ls "$DIR/debian/${pkg}_${ver//:/%3a}_"*.deb | head -n1)"
  fi
  local args=()
  for f in "$@"; do args+=("./$f"); done
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$DIR/debian" "${args[@]}" >>"$LOG" 2>&1 \
    || fail "Debian package $key: extracting its files failed (see $LOG)"
  mkdir -p "$DIR/$sub"
  for f in "$@"; do cp "$DIR/debian/$f" "$DIR/$sub/"; done
}
fetch images "$OPENCV" "${OPENCV_FILES[@]}"
fetch videos "$OPENCV" "${OPENCV_VIDEOS[@]}"
fetch images "$JXL" "${JXL_FILES[@]}"
fetch videos "$GNOME_HELP" "${GNOME_HELP_VIDEOS[@]}"
rm -f "$DIR"/debian/*.deb   # 170 MB; the extracted files are what the tests use
printf '%s\n' "$EXPECTED" > "$STAMP"
