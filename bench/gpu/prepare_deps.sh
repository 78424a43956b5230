#!/usr/bin/env bash
# Downloads the Debian packages the mm build needs besides torch (headers and shared libraries
# of yaml-cpp, CLI11, nlohmann-json, GoogleTest, PCRE2, ICU, libjpeg/png/webp, SentencePiece,
# gloo's headers, zlib) as .deb files into .gpu-deps/debs (ignored by git), for the GPU machine,
# which has no package registry: bench/gpu/run.sh unpacks them there. FFmpeg is left out (its
# dependency closure is >100 packages): the GPU build is configured with -DMM_WITH_VIDEO=OFF.
# Run here, then pass `carry: [".gpu-deps"]` to the device call. Prints the folder's size (the
# carry limit is 64 MiB).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/.gpu-deps/debs"
PACKAGES=(
  libgloo-dev libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu-dev libicu72
  libsentencepiece-dev libsentencepiece0 libprotobuf-lite32
  libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 libwebp-dev libwebp7 libwebpmux3 libwebpdemux2
  zlib1g-dev pkgconf pkgconf-bin libpkgconf3
)
mkdir -p "$OUT"
cd "$OUT"
rm -f ./*.deb
apt-get download "${PACKAGES[@]}" >/dev/null
echo "prepare_deps: $(ls | wc -l) packages, $(du -sh . | cut -f1) in $OUT"
# diffusers (pure Python) for the DiT bench, from the project's venv, in case the GPU machine's
# Python lacks it.
PY_OUT="$ROOT/.gpu-deps/py"
rm -rf "$PY_OUT" && mkdir -p "$PY_OUT"
cp -r "$ROOT/.venv/lib/python3.11/site-packages/diffusers" "$PY_OUT/"
find "$PY_OUT" -name __pycache__ -prune -exec rm -rf {} +
echo "prepare_deps: diffusers $(du -sh "$PY_OUT" | cut -f1) in $PY_OUT"
