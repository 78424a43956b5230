// Measures this machine's dense matmul ceiling, the denominator of MFU when no datasheet peak
// applies (`mm bench peak`).
#pragma once

#include <ATen/ATen.h>

namespace mm::tools {

struct PeakResult {
  double tflops = 0;      // best of the repetitions
  int64_t size = 0;       // square matrix side
  at::ScalarType dtype;
  int threads = 0;
  at::Device device = at::kCPU;
};

// Times C = A @ B for n x n matrices: 2 n^3 FLOPs per product; returns the best rate of `reps`.
// On CUDA each repetition is timed to its completion (the device is synchronised around it).
PeakResult measure_matmul_peak(int64_t n, at::ScalarType dtype, int reps, at::Device device = at::kCPU);

}  // namespace mm::tools
