#include "mindspeed_mm/core/device.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#ifdef MM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

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

}  // namespace mm
