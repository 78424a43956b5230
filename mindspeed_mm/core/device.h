// Which device a process computes on, and the few device operations the trainer needs that
// differ between CPU and CUDA (current device, pinned host memory, synchronisation). Everything
// here goes through ATen's device-generic hooks, so the same binary runs on a machine without a
// GPU, and a build against a CPU-only libtorch still compiles.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace mm {

// CUDA devices this process sees (0 without a GPU, driver or CUDA build).
int cuda_device_count();

// `spec` is auto | cpu | cuda | cuda:N. auto: cuda when a device is visible, else cpu. cuda picks
// device local_rank (one device per rank on a node, as torchrun's LOCAL_RANK). ConfigError naming
// `key` when cuda is asked for and there is no such device.
at::Device resolve_device(const std::string& spec, int local_rank, const std::string& key);

// Makes `device` the current CUDA device of this thread (kernels, NCCL, the caching allocator);
// nothing for the CPU.
void set_current_device(const at::Device& device);

// Waits for the device's queued work (CUDA: the current stream); nothing for the CPU.
void synchronize(const at::Device& device);

// t on `device`. A CPU tensor bound for a CUDA device goes through pinned memory with a
// non-blocking copy (the copy is ordered on the current stream, so kernels queued after it see
// the data). Undefined stays undefined; a tensor already there is returned as is.
at::Tensor to_device(const at::Tensor& t, const at::Device& device);

// "cpu" or "cuda:0 (NVIDIA H200, 139.8 GiB)".
std::string describe_device(const at::Device& device);

// Memory now and at its peak since the last reset_peak_memory. `allocated`: the bytes of live
// tensors (CUDA: the caching allocator's; CPU: the counting allocator's of core/allocator.h, or
// the resident set where that is not installed). `reserved`: CUDA: what the caching allocator
// holds from the driver; CPU: the process's resident set (/proc/self/statm) and its high-water
// mark (VmHWM, which reset_peak_memory clears through /proc/self/clear_refs). Zeros where unknown.
struct MemoryStats {
  int64_t allocated = 0, peak_allocated = 0;
  int64_t reserved = 0, peak_reserved = 0;
};
MemoryStats memory_stats(const at::Device& device);
// memory_stats(device).allocated, cheaply (no /proc read): for sampling often.
int64_t allocated_bytes(const at::Device& device);
void reset_peak_memory(const at::Device& device);

}  // namespace mm
