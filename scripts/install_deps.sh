#!/usr/bin/env bash
# Installs the Debian 12 packages that build, test and run mm. Idempotent; works as root or
# through sudo. Skips apt entirely when everything is already installed.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas-dev libgloo-dev
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  fortunes fortunes-min
  python3-torch python3-numpy
  libpcre2-dev libicu-dev
  libsentencepiece-dev sentencepiece
  libjpeg62-turbo-dev libpng-dev libwebp-dev python3-pil
  libavformat-dev libavcodec-dev libavutil-dev libswscale-dev ffmpeg
  zlib1g-dev dataset-fashion-mnist
  python3-torchvision python3-av   # bench/loader_baseline.py
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
