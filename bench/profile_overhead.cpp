// What the always-on instrumentation costs a training step when no profile is taken: the
// step's trace scopes (one relaxed atomic load each while no window is open) and the per-step
// memory reading (mm::memory_stats twice, mm::reset_peak_memory once). Prints microseconds per
// step; bench/run_profile_overhead.sh divides it by measured step times. Then what the counting
// CPU tensor allocator (core/allocator.h) adds to one allocation and free of a small tensor:
// libtorch's allocator first, then ours, in this process.
//   profile_overhead [REPEATS]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/tools/trace.h"

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20000;
  const at::Device cpu(at::kCPU);
  int64_t sink = 0;
  auto one_step = [&] {
    // Scopes a step opens with no window: step, data, forward, backward, grad_sync, optimizer
    // (x2 for accumulation) plus a validation's and a checkpoint's.
    for (int i = 0; i < 12; ++i) mm::tools::TraceScope scope("forward", "phase");
    sink += mm::memory_stats(cpu).peak_allocated;
    mm::reset_peak_memory(cpu);
    sink += mm::memory_stats(cpu).allocated;
  };
  for (int i = 0; i < 200; ++i) one_step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) one_step();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / repeats;
  std::printf("instrumentation per step (profile off): %.2f us (%d repeats; checksum %lld)\n", us, repeats,
              static_cast<long long>(sink % 7));
  auto alloc_ns = [&] {
    const int n = 200000;
    const auto a0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) sink += at::empty({256}, at::kFloat).numel();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - a0).count() / n;
  };
  alloc_ns();
  const double plain = alloc_ns();
  mm::count_cpu_tensor_memory();
  alloc_ns();
  const double counted = alloc_ns();
  std::printf("tensor allocation + free: %.1f ns with libtorch's allocator, %.1f ns counted (+%.1f ns)\n", plain, counted,
              counted - plain);
  return 0;
}
