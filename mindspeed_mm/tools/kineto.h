// libtorch's own profiler (Kineto) inside a `tools.profile` window, for what our trace cannot
// see from the host: on CUDA the kernels, copies and memsets each stream ran, with CUPTI's
// timestamps. Their events join the window's Chrome trace (tools/trace.h) on one timeline: an
// anchor range recorded in both traces at the start gives the offset between their clocks.
// Also the CUDA caching allocator's history around the window (PyTorch's
// memory_snapshot.pickle, for https://pytorch.org/memory_viz).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace mm::tools {

class KinetoSession {
 public:
  // Starts Kineto with CPU activities, and CUDA's when `cuda`. mm::Error when libtorch has no
  // Kineto.
  KinetoSession(bool cuda, bool record_shapes);
  ~KinetoSession();
  KinetoSession(const KinetoSession&) = delete;
  KinetoSession& operator=(const KinetoSession&) = delete;

  // Stops it, saves Kineto's own trace to `raw_path` (TensorBoard's profiler plugin and Perfetto
  // read it) and adds its device events (kernels, memcpy, memset; with cpu_ops also its CPU
  // operators, on a thread of their own) to the open Trace, on the Trace's clock. Returns the
  // number of events added; mm::Error naming raw_path if Kineto's trace cannot be read.
  int64_t finish(const std::string& raw_path, bool cpu_ops);

 private:
  double anchor_us_ = 0;
  bool running_ = false;
};

// The CUDA caching allocator's history (allocations, frees, segments) from now on, and its
// snapshot in PyTorch's pickle format. Without CUDA in this build: mm::Error.
void start_cuda_memory_history(int64_t max_entries);
void write_cuda_memory_snapshot(const std::string& path);  // also stops the recording

}  // namespace mm::tools
