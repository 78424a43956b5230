#!/usr/bin/env bash
# Installs what builds, tests and runs mm: Debian 12 packages, then the engine (PyPI's
# torch==2.11.0, a CUDA 13 build, with the CUDA compiler wheels its CMake config needs) and the
# Python test references into the project-local virtual environment .venv (MM_VENV overrides).
# Idempotent; works as root or through sudo. Skips apt and pip when everything is present.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${MM_VENV:-$ROOT/.venv}"

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas-dev libgloo-dev   # gloo's headers declare c10d's Gloo group (its code is in libtorch)
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  fortunes fortunes-min
  python3-numpy
  libpcre2-dev libicu-dev
  libsentencepiece-dev sentencepiece
  libjpeg62-turbo-dev libpng-dev libwebp-dev python3-pil
  libavformat-dev libavcodec-dev libavutil-dev libswscale-dev ffmpeg
  zlib1g-dev dataset-fashion-mnist
  libcairo2-dev                 # mm report draws its plots (SVG for the page, PNG copies)
  chromium                      # the report's browser test (headless)
  clang-16 libclang-rt-16-dev   # libFuzzer + AddressSanitizer for tests/fuzz (make test runs the harnesses)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} Debian packages present"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python packages, pinned. torch pulls its CUDA 13 runtime wheels (about 4.5 GB installed; pip's
# cache keeps the downloads). nvcc/cccl/crt and nvvm at the versions of torch's cuda-toolkit pin
# let torch's CMake config find a toolkit without /usr/local/cuda; mm compiles no .cu files.
PY_PACKAGES=(
  torch==2.11.0
  "cuda-toolkit[nvcc,cccl,crt]==13.0.2" nvidia-nvvm==13.0.88
  numpy==2.4.6
  transformers==5.25.0   # the test references (tests/conformance/hf_reference.py)
  diffusers==0.42.1      # Wan2.1's reference (tests/conformance/diffusers_reference.py)
  peft==0.21.2 accelerate==1.16.0   # LoRA's reference (tests/conformance/peft_reference.py)
  tensorboard==2.20.0    # reads our event files (tests/conformance/tensorboard_reference.py)
  torchvision==0.26.0 pillow==12.0.0 av==16.0.1   # bench/loader_baseline.py (the pipeline mm's loader is measured against)
)
STAMP="$VENV/.mm_packages"
WANT="$(printf '%s\n' "${PY_PACKAGES[@]}")"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "install_deps: $VENV has the ${#PY_PACKAGES[@]} Python packages"
else
  PYTHON="${PYTHON:-python3}"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  echo "install_deps: pip install into $VENV: ${PY_PACKAGES[*]}"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  # FindCUDA wants lib64/ and unversioned library names; the wheels ship libcudart.so.13 & co.
  CU="$("$VENV/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cu13"))' 2>/dev/null)"
  if [ -d "$CU/lib" ]; then
    (cd "$CU/lib" && for f in *.so.*; do l="${f%%.so.*}.so"; [ -e "$l" ] || ln -s "$f" "$l"; done)
    [ -e "$CU/lib64" ] || ln -s lib "$CU/lib64"
  fi
  printf '%s\n' "${PY_PACKAGES[@]}" > "$STAMP"
fi
