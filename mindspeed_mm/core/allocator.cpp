#include "mindspeed_mm/core/allocator.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace mm {

namespace {

std::atomic<int64_t> live_bytes{0}, peak_bytes{0}, allocations{0};
std::atomic<bool> installed{false};

// Each block carries its size in a header of one alignment unit (64 bytes, so the tensor's data
// keeps c10's alignment), which lets the deleter be a plain function: raw_allocate works too.
constexpr size_t kHeader = 64;

void note_allocated(int64_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = live_bytes.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void counted_delete(void* data) {
  if (!data) return;
  char* base = static_cast<char*>(data) - kHeader;
  size_t n = 0;
  std::memcpy(&n, base, sizeof n);
  c10::profiledCPUMemoryReporter().Delete(data);  // what libtorch's profiler sees, as before
  live_bytes.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
  c10::free_cpu(base);
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &counted_delete, c10::Device(c10::DeviceType::CPU)};
    char* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    std::memcpy(base, &n, sizeof n);
    void* data = base + kHeader;
    note_allocated(static_cast<int64_t>(n));
    c10::profiledCPUMemoryReporter().New(data, n);
    return {data, data, &counted_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

}  // namespace

void count_cpu_tensor_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    // MM_COUNT_TENSORS=0 keeps libtorch's allocator (to measure what counting costs).
    if (const char* v = std::getenv("MM_COUNT_TENSORS"); v && std::string(v) == "0") return;
    static CountingCpuAllocator counting;
    c10::SetCPUAllocator(&counting, /*priority=*/1);
    installed = true;
  });
}

bool counting_cpu_tensor_memory() { return installed.load(); }
int64_t cpu_tensor_bytes() { return live_bytes.load(std::memory_order_relaxed); }
int64_t cpu_tensor_allocations() { return allocations.load(std::memory_order_relaxed); }
int64_t peak_cpu_tensor_bytes() { return peak_bytes.load(std::memory_order_relaxed); }
void reset_peak_cpu_tensor_bytes() { peak_bytes.store(live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed); }

void configure_host_allocator() {
  count_cpu_tensor_memory();
  // MM_HOST_ALLOCATOR=system keeps glibc's defaults (freed blocks go back to the kernel): a lower
  // resident size, e.g. when measuring what a run really holds.
  const char* mode = std::getenv("MM_HOST_ALLOCATOR");
  if (mode && std::string(mode) == "system") return;
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

long long resident_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<long long>(resident) * sysconf(_SC_PAGESIZE);
}

}  // namespace mm
