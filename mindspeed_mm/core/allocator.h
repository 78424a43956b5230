// Host allocator settings for training processes.
#pragma once

#include <cstdint>

namespace mm {

// Keeps freed activation memory in the process between steps. glibc's defaults return large
// blocks to the kernel on free and fault them back in on the next step (measured: ~19.6k minor
// faults per step on the tiny Qwen2 train step, ~100 after this, and ~8% faster steps; see
// bench/README.md). Allocations above 64 MiB still use mmap, and up to 1 GiB of free heap is kept
// before trimming: the behaviour of a caching allocator, for the price of a higher resident size.
// MM_HOST_ALLOCATOR=system in the environment leaves glibc's defaults.
// Also installs the counting CPU tensor allocator below.
void configure_host_allocator();

// libtorch's CPU tensors come from a counting allocator once this ran (idempotent; tensors made
// before keep their own deleters and are not counted): the bytes of live CPU tensors now and at
// their peak since reset_peak_tensor_bytes, the CPU's counterpart of the CUDA caching allocator's
// "allocated". Memory libtorch takes outside its CPU allocator (oneDNN scratch pads, pinned
// buffers) is not in it. Thread-safe; costs three relaxed atomic updates per allocation
// (bench/run_profile_overhead.sh). MM_COUNT_TENSORS=0 in the environment leaves libtorch's own.
void count_cpu_tensor_memory();
bool counting_cpu_tensor_memory();
int64_t cpu_tensor_bytes();
int64_t peak_cpu_tensor_bytes();
int64_t cpu_tensor_allocations();  // made so far
void reset_peak_cpu_tensor_bytes();

// This process's resident memory now (Linux /proc/self/statm), in bytes; 0 when unknown.
long long resident_bytes();

}  // namespace mm
