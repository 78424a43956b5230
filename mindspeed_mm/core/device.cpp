#include "mindspeed_mm/core/device.h"

#include <ATen/Context.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#ifdef MM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/errors.h"

namespace mm {

int cuda_device_count() {
  try {
    return at::globalContext().hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().deviceCount()) : 0;
  } catch (const std::exception&) {
    return 0;  // a CUDA build on a machine whose driver is missing or too old
  }
}

at::Device resolve_device(const std::string& spec, int local_rank, const std::string& key) {
  if (spec == "cpu") return at::Device(at::kCPU);
  const char* where = key.rfind("--", 0) == 0 ? "" : "config: ";  // a command-line flag or a config key
  const int n = cuda_device_count();
  if (spec == "auto") {
    if (n == 0) return at::Device(at::kCPU);
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank % n));
  }
  int index = local_rank;
  if (spec.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      index = std::stoi(spec.substr(5), &used);
      if (used != spec.size() - 5 || index < 0) index = -1;
    } catch (const std::exception&) {
      index = -1;
    }
    if (index < 0) throw ConfigError(cat(where, key, " '", spec, "' must be auto, cpu, cuda or cuda:N"));
  } else if (spec != "cuda") {
    throw ConfigError(cat(where, key, " '", spec, "' must be auto, cpu, cuda or cuda:N"));
  }
#ifdef MM_WITH_CUDA
  const char* why = "no CUDA device is visible (no GPU or driver; `mm version` lists devices)";
#else
  const char* why = "this build of mm has no CUDA";
#endif
  if (n == 0) throw ConfigError(cat(where, key, " is ", spec, " but ", why, "; use auto or cpu"));
  if (index >= n)
    throw ConfigError(cat(where, key, " ", spec, " asks for CUDA device ", index, " (LOCAL_RANK ", local_rank, ") but ",
                          n, " are visible; start at most ", n, " ranks per node"));
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void set_current_device(const at::Device& device) {
  if (!device.is_cuda()) return;
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

void synchronize(const at::Device& device) {
  if (!device.is_cuda()) return;
  c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
}

at::Tensor to_device(const at::Tensor& t, const at::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  if (device.is_cuda() && t.device().is_cpu()) {
    at::Tensor pinned = t.is_pinned() ? t : t.contiguous().pin_memory();
    return pinned.to(device, /*non_blocking=*/true);
  }
  return t.to(device);
}

std::string describe_device(const at::Device& device) {
  if (!device.is_cuda()) return device.str();
#ifdef MM_WITH_CUDA
  const auto* p = at::cuda::getDeviceProperties(device.index());
  return cat(device.str(), " (", p->name, ", ", p->totalGlobalMem >> 30, " GiB)");
#else
  return device.str();
#endif
}

namespace {

// The resident set's high-water mark (VmHWM) in bytes: getrusage's ru_maxrss, which on Linux is
// that of the process's memory map and so follows clear_refs' reset; reading /proc/self/status
// instead costs the kernel most of 30 us per call.
int64_t peak_resident_bytes() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace

MemoryStats memory_stats(const at::Device& device) {
  MemoryStats m;
#ifdef MM_WITH_CUDA
  if (device.is_cuda()) {
    using c10::CachingDeviceAllocator::StatType;
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    m.allocated = s.allocated_bytes[agg].current;
    m.peak_allocated = s.allocated_bytes[agg].peak;
    m.reserved = s.reserved_bytes[agg].current;
    m.peak_reserved = s.reserved_bytes[agg].peak;
    return m;
  }
#endif
  (void)device;
  m.reserved = resident_bytes();
  m.peak_reserved = std::max<int64_t>(peak_resident_bytes(), m.reserved);
  if (counting_cpu_tensor_memory()) {
    m.allocated = cpu_tensor_bytes();
    m.peak_allocated = peak_cpu_tensor_bytes();
  } else {
    m.allocated = m.reserved;
    m.peak_allocated = m.peak_reserved;
  }
  return m;
}

int64_t allocated_bytes(const at::Device& device) {
#ifdef MM_WITH_CUDA
  if (device.is_cuda()) {
    using c10::CachingDeviceAllocator::StatType;
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index())
        .allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)]
        .current;
  }
#endif
  (void)device;
  return counting_cpu_tensor_memory() ? cpu_tensor_bytes() : resident_bytes();
}

void reset_peak_memory(const at::Device& device) {
#ifdef MM_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    return;
  }
#endif
  (void)device;
  reset_peak_cpu_tensor_bytes();
  // "5" resets the peak resident size (Linux 4.0+); without permission the peak stays the run's.
  if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

}  // namespace mm
