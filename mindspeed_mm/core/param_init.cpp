#include "mindspeed_mm/core/param_init.h"

#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>

#include <mutex>
#include <unordered_map>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/module.h"

namespace mm::nn {
namespace {

thread_local bool t_deferred = false;
thread_local ParamInitHook t_hook;

// Constants of deferred parameters, by TensorImpl (the parameter keeps that impl for life).
std::mutex g_mu;
std::unordered_map<const c10::TensorImpl*, double>& deferred_values() {
  static std::unordered_map<const c10::TensorImpl*, double> m;
  return m;
}

// Full shapes of sliced parameters. The weak reference keeps a dead tensor's TensorImpl from
// being reused at the same address while its entry exists, and tells a stale entry apart.
struct FullShape {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl;
  std::vector<int64_t> shape;
};
std::unordered_map<const c10::TensorImpl*, FullShape>& full_shapes() {
  static std::unordered_map<const c10::TensorImpl*, FullShape> m;
  return m;
}

}  // namespace

void set_full_shape(const at::Tensor& p, std::vector<int64_t> shape) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& m = full_shapes();
  for (auto it = m.begin(); it != m.end();) it = it->second.impl.expired() ? m.erase(it) : std::next(it);
  m.erase(p.unsafeGetTensorImpl());
  m.emplace(p.unsafeGetTensorImpl(),
            FullShape{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(p.getIntrusivePtr()), std::move(shape)});
}

std::vector<int64_t> full_shape(const at::Tensor& p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = full_shapes().find(p.unsafeGetTensorImpl());
  return it == full_shapes().end() || it->second.impl.expired() ? p.sizes().vec() : it->second.shape;
}

void reshape_deferred(at::Tensor& p, const std::vector<int64_t>& shape) {
  at::NoGradGuard no_grad;
  p.set_data(at::empty(shape, p.options()));
  at::native::resize_bytes_cpu(p.storage().unsafeGetStorageImpl(), 0);
}

DeferredInitGuard::DeferredInitGuard() : previous_(t_deferred) { t_deferred = true; }
DeferredInitGuard::~DeferredInitGuard() { t_deferred = previous_; }
bool deferred_init_active() { return t_deferred; }

at::Tensor defer_parameter(at::Tensor t) {
  if (!t_deferred || !t.device().is_cpu()) return t;
  // Only a tensor that owns all of its storage can give it back without touching another.
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (!t.is_contiguous() || t.storage_offset() != 0 || t.storage().nbytes() != bytes || t.storage().use_count() > 1)
    return t;
  at::Tensor flat = t.reshape({-1});
  // min == max: no temporary as large as the tensor (a bool mask of an embedding is 1/4 of it).
  const bool constant = flat.numel() == 0 || (flat.min() == flat.max()).item<bool>();
  if (!constant) return t;  // rare; kept as built (a few small tensors at most)
  const double value = flat.numel() ? flat[0].item<double>() : 0.0;
  flat = at::Tensor();
  // The shape stays; the storage shrinks to nothing (a CPU tensor still, so FSDP can point the
  // parameter at its own buffer with set_data, which a meta tensor would refuse).
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), 0);
  std::lock_guard<std::mutex> lock(g_mu);
  deferred_values()[t.unsafeGetTensorImpl()] = value;
  return t;
}

std::optional<double> deferred_value(const at::Tensor& p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = deferred_values().find(p.unsafeGetTensorImpl());
  if (it == deferred_values().end()) return std::nullopt;
  return it->second;
}

void materialize(Module& model, at::Device device) {
  at::NoGradGuard no_grad;
  for (auto& [name, p] : model.named_parameters()) {
    std::optional<double> v;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      auto it = deferred_values().find(p.unsafeGetTensorImpl());
      if (it != deferred_values().end()) {
        v = it->second;
        deferred_values().erase(it);  // a tied parameter listed twice is materialised once
      }
    }
    if (v) p.set_data(at::full(p.sizes(), *v, at::TensorOptions().dtype(p.scalar_type()).device(device)));
    else if (p.device() != device) p.set_data(p.to(device));
  }
  model.to(device);  // buffers (rotary tables and the like)
}

ParamInitHookGuard::ParamInitHookGuard(ParamInitHook hook) : previous_(std::move(t_hook)) { t_hook = std::move(hook); }
ParamInitHookGuard::~ParamInitHookGuard() { t_hook = std::move(previous_); }

void init_param(at::Tensor& p, const at::Tensor& value) {
  if (t_hook && t_hook(p, value)) return;
  at::NoGradGuard no_grad;
  MM_CHECK(value.sizes() == p.sizes(), "init_param: a value of shape ", value.sizes(), " for a parameter of shape ",
           p.sizes(), " (a sliced parameter needs its plan's initialisation hook)");
  p.copy_(value);
}

void init_param_normal(at::Tensor& p, double std, at::Generator& gen) {
  init_param(p, at::empty(full_shape(p), at::TensorOptions().dtype(at::kFloat)).normal_(0.0, std, gen));
}

void init_param_uniform(at::Tensor& p, double bound, at::Generator& gen) {
  init_param(p, at::empty(full_shape(p), at::TensorOptions().dtype(at::kFloat)).uniform_(-bound, bound, gen));
}

void init_param_fill(at::Tensor& p, double value) {
  init_param(p, at::full(full_shape(p), value, at::TensorOptions().dtype(at::kFloat)));
}

}  // namespace mm::nn
