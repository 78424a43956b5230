// Host allocator settings for training processes.
#pragma once

namespace mm {

// Keeps freed activation memory in the process between steps. glibc's defaults return large
// blocks to the kernel on free and fault them back in on the next step (measured: ~19.6k minor
// faults per step on the tiny Qwen2 train step, ~100 after this, and ~8% faster steps; see
// bench/README.md). Allocations above 64 MiB still use mmap, and up to 1 GiB of free heap is kept
// before trimming: the behaviour of a caching allocator, for the price of a higher resident size.
// MM_HOST_ALLOCATOR=system in the environment leaves glibc's defaults.
void configure_host_allocator();

// This process's resident memory now (Linux /proc/self/statm), in bytes; 0 when unknown.
long long resident_bytes();

}  // namespace mm
