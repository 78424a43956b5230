// The one place that knows which libtorch we are built against (1.13 on Debian 12, 2.x on GPU
// machines). Everything version-dependent goes through these helpers.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/api/include/torch/version.h>

#define MM_TORCH_AT_LEAST(maj, min) \
  (TORCH_VERSION_MAJOR > (maj) || (TORCH_VERSION_MAJOR == (maj) && TORCH_VERSION_MINOR >= (min)))

// at::scaled_dot_product_attention exists from 2.0 on.
#define MM_HAS_SDPA MM_TORCH_AT_LEAST(2, 0)

namespace mm::compat {

inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// CPU autocast (bf16 compute with fp32 weights): the API was renamed in 2.4.
inline void set_cpu_autocast(bool enabled, at::ScalarType dtype) {
#if MM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
  at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
  at::autocast::set_cpu_enabled(enabled);
  at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

inline void set_cuda_autocast(bool enabled, at::ScalarType dtype) {
#if MM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
  at::autocast::set_enabled(enabled);
  at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}

}  // namespace mm::compat
