// Deferred parameter initialisation, so that a model too large for one process can be built
// sharded. While a DeferredInitGuard is alive, Module::register_parameter gives back the storage
// of each parameter the constructor filled with a constant (zeros, ones for norms), keeping its
// shape and remembering the constant; FSDP then creates only this rank's chunks. A deferred
// parameter has no data: nothing may read it before FSDP takes it over.
// Models initialise parameters through init_param*, which a ParamInitHook (FSDP's) can take over
// to keep just the slice its rank owns: values and random draws are the same as an eager build.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <vector>

namespace mm::nn {

class Module;

class DeferredInitGuard {
 public:
  DeferredInitGuard();
  ~DeferredInitGuard();
  DeferredInitGuard(const DeferredInitGuard&) = delete;
  DeferredInitGuard& operator=(const DeferredInitGuard&) = delete;

 private:
  bool previous_;
};
bool deferred_init_active();

// What register_parameter makes of t: t itself, under DeferredInitGuard with its storage freed.
at::Tensor defer_parameter(at::Tensor t);
// The constant a deferred parameter was constructed with (nullopt: not deferred).
std::optional<double> deferred_value(const at::Tensor& p);

// A parameter that holds a slice of a larger logical tensor (tensor parallelism) is initialised,
// loaded and checkpointed by that tensor's full shape: init_param_normal draws it whole, so the
// values are the ones one process draws. Registered by the plan that slices it; p.sizes() else.
void set_full_shape(const at::Tensor& p, std::vector<int64_t> shape);
std::vector<int64_t> full_shape(const at::Tensor& p);
// A deferred parameter (storage freed, constant remembered) given a new shape, still deferred.
void reshape_deferred(at::Tensor& p, const std::vector<int64_t>& shape);

// hook(param, value) with value a full tensor of param's full shape; returns true when it took the value.
using ParamInitHook = std::function<bool(const at::Tensor& param, const at::Tensor& value)>;
class ParamInitHookGuard {
 public:
  explicit ParamInitHookGuard(ParamInitHook hook);
  ~ParamInitHookGuard();
  ParamInitHookGuard(const ParamInitHookGuard&) = delete;
  ParamInitHookGuard& operator=(const ParamInitHookGuard&) = delete;

 private:
  ParamInitHook previous_;
};

// Gives every parameter of a model built under DeferredInitGuard storage on `device`: a deferred
// one its constructor's constant, any other a copy of what it holds; buffers move too. Then
// init_weights and checkpoint loads write straight into the device's memory.
void materialize(Module& model, at::Device device);

// p = value (without autograd), or the hook's.
void init_param(at::Tensor& p, const at::Tensor& value);
// p ~ N(0, std^2), drawn as a full fp32 tensor from gen (the same draws whoever keeps the values).
void init_param_normal(at::Tensor& p, double std, at::Generator& gen);
// p ~ U(-bound, bound), drawn the same way (Xavier's uniform: bound = sqrt(6 / (fan_in + fan_out))).
void init_param_uniform(at::Tensor& p, double bound, at::Generator& gen);
void init_param_fill(at::Tensor& p, double value);

}  // namespace mm::nn
