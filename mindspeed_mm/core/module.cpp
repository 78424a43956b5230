#include "mindspeed_mm/core/module.h"

#include <ATen/core/grad_mode.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/param_init.h"

namespace mm::nn {

at::Tensor Module::register_parameter(const std::string& name, at::Tensor t, bool requires_grad) {
  MM_CHECK(name.find('.') == std::string::npos, "module: parameter name '", name, "' contains a dot");
  t = defer_parameter(std::move(t));  // a meta tensor under DeferredInitGuard
  if (requires_grad) t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

at::Tensor Module::register_buffer(const std::string& name, at::Tensor t, bool persistent) {
  buffers_.push_back({name, t, persistent});
  return t;
}

std::vector<std::pair<std::string, at::Tensor>> Module::named_parameters(const std::string& prefix) const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::string p = prefix.empty() ? "" : prefix + ".";
  for (auto& [n, t] : params_) out.emplace_back(p + n, t);
  for (auto& [n, c] : children_) {
    auto sub = c->named_parameters(p + n);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<at::Tensor> Module::parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [_, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Module::named_buffers(const std::string& prefix) const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::string p = prefix.empty() ? "" : prefix + ".";
  for (auto& b : buffers_)
    if (b.persistent) out.emplace_back(p + b.name, b.t);
  for (auto& [n, c] : children_) {
    auto sub = c->named_buffers(p + n);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  out.emplace_back(prefix, shared_from_this());
  const std::string p = prefix.empty() ? "" : prefix + ".";
  for (auto& [n, c] : children_) {
    auto sub = c->named_modules(p + n);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

void Module::to(at::ScalarType dtype) {
  at::NoGradGuard ng;
  for (auto& [_, mod] : named_modules()) {
    for (auto& [n, t] : mod->params_)
      if (t.is_floating_point()) t.set_data(t.to(dtype));
    for (auto& b : mod->buffers_)
      if (b.t.is_floating_point()) b.t.set_data(b.t.to(dtype));
  }
}

void Module::to(at::Device device) {
  at::NoGradGuard ng;
  for (auto& [_, mod] : named_modules()) {
    for (auto& [n, t] : mod->params_) t.set_data(t.to(device));
    for (auto& b : mod->buffers_) b.t.set_data(b.t.to(device));
  }
}

void Module::zero_grad() {
  for (auto& t : parameters())
    if (t.grad().defined()) t.mutable_grad() = at::Tensor();
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [_, t] : named_parameters()) n += t.numel();
  return n;
}

at::Tensor Block::call(const at::Tensor& x, const ForwardContext& ctx) {
  // A wrapper that re-runs the forward during backward (recompute) keeps its own copy of the
  // context and of this chain.
  BlockCtxFn fn = [this](const at::Tensor& in, const ForwardContext& c) { return forward(in, c); };
  for (auto it = wrappers_.rbegin(); it != wrappers_.rend(); ++it) {
    BlockWrapper w = it->second;
    fn = [this, w, inner = std::move(fn)](const at::Tensor& in, const ForwardContext& c) { return w(*this, in, c, inner); };
  }
  return fn(x, ctx);
}

bool Block::has_wrapper(const std::string& tag) const {
  for (auto& [t, _] : wrappers_)
    if (t == tag) return true;
  return false;
}

std::shared_ptr<Module> Module::take_module(const std::string& name) {
  for (auto it = children_.begin(); it != children_.end(); ++it)
    if (it->first == name) {
      std::shared_ptr<Module> m = it->second;
      children_.erase(it);
      return m;
    }
  return nullptr;
}

}  // namespace mm::nn
