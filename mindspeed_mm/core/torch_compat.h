// The engine's version and the few helpers that name libtorch APIs by device. The project builds
// against libtorch 2.11 (PyPI's torch==2.11.0; the GPU machine's own torch is the same version);
// the 1.13 build and its workarounds are retired.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/api/include/torch/version.h>

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 8)
#error "mm needs libtorch >= 2.8 (PyPI's torch==2.11.0: run scripts/install_deps.sh)"
#endif

namespace mm::compat {

inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// Autocast for one device type (kCPU or kCUDA): compute in `dtype`, weights stay fp32.
inline void set_autocast(at::DeviceType device, bool enabled, at::ScalarType dtype) {
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
}

}  // namespace mm::compat
