// Measures this machine's dense matmul ceiling, the denominator of MFU when no datasheet peak
// applies (`mm bench peak`).
#pragma once

#include <ATen/ATen.h>

#include <string>

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

// The datasheet's dense bf16 peak of a known GPU by its name (NVIDIA H100 / H200 SXM: 989.4
// TFLOP/s, A100: 312), 0 for anything else: the MFU denominator when tools.peak_tflops is 0 and
// a run computes in bf16 on such a device.
double datasheet_bf16_tflops(const std::string& device_name);

}  // namespace mm::tools
