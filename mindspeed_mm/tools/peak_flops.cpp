#include "mindspeed_mm/tools/peak_flops.h"

#include <ATen/Parallel.h>

#include <chrono>

#include "mindspeed_mm/core/device.h"

namespace mm::tools {

PeakResult measure_matmul_peak(int64_t n, at::ScalarType dtype, int reps, at::Device device) {
  at::Tensor a = at::randn({n, n}).to(device, dtype), b = at::randn({n, n}).to(device, dtype);
  at::Tensor c = at::empty({n, n}, a.options());
  at::mm_out(c, a, b);  // warm up: first call pays for allocation, thread start, kernel selection
  synchronize(device);
  double best = 1e30;
  // On a GPU one product is short: time a few back to back so launch gaps do not count.
  const int inner = device.is_cuda() ? 10 : 1;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) at::mm_out(c, a, b);
    synchronize(device);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / inner);
  }
  PeakResult res;
  res.tflops = 2.0 * n * n * n / best / 1e12;
  res.size = n;
  res.dtype = dtype;
  res.threads = at::get_num_threads();
  res.device = device;
  return res;
}

double datasheet_bf16_tflops(const std::string& device_name) {
  if (device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos) return 989.4;
  if (device_name.find("A100") != std::string::npos) return 312.0;
  return 0;
}

}  // namespace mm::tools
