#include "mindspeed_mm/tools/peak_flops.h"

#include <ATen/Parallel.h>

#include <chrono>

namespace mm::tools {

PeakResult measure_matmul_peak(int64_t n, at::ScalarType dtype, int reps) {
  at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype), c = at::empty({n, n}, a.options());
  at::mm_out(c, a, b);  // warm up: first call pays for allocation and thread start
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  PeakResult res;
  res.tflops = 2.0 * n * n * n / best / 1e12;
  res.size = n;
  res.dtype = dtype;
  res.threads = at::get_num_threads();
  return res;
}

}  // namespace mm::tools
