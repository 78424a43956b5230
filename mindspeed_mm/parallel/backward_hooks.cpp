#include "mindspeed_mm/parallel/backward_hooks.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace mm::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Callback : torch::CustomClassHolder {
  std::function<void()> fn;
  bool queue = false;  // queue on the engine (after backward) rather than run now
};

struct CallOnBackward : public torch::autograd::Function<CallOnBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<Callback> cb) {
    ctx->saved_data["cb"] = at::IValue::make_capsule(std::move(cb));
    return x;  // autograd returns an input as a fresh view carrying this node
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto cb = c10::static_intrusive_pointer_cast<Callback>(ctx->saved_data["cb"].toCapsule());
    if (cb->queue) torch::autograd::Engine::get_default_engine().queue_callback(cb->fn);
    else cb->fn();
    return {grad_outputs[0], at::Tensor()};
  }
};

at::Tensor apply(const at::Tensor& x, std::function<void()> fn, bool queue) {
  if (!x.requires_grad()) return x;
  auto cb = c10::make_intrusive<Callback>();
  cb->fn = std::move(fn);
  cb->queue = queue;
  return CallOnBackward::apply(x, std::move(cb));
}

struct GradReadyHook : torch::autograd::FunctionPostHook {
  explicit GradReadyHook(std::function<void()> f) : fn(std::move(f)) {}
  variable_list operator()(const variable_list& outputs, const variable_list&) override {
    fn();
    return outputs;
  }
  std::function<void()> fn;
};

}  // namespace

std::shared_ptr<void> on_gradient_ready(const at::Tensor& param, std::function<void()> fn) {
  std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(param);
  acc->add_post_hook(std::make_unique<GradReadyHook>(std::move(fn)));
  return acc;
}

at::Tensor call_before_backward_of(const at::Tensor& x, std::function<void()> fn) { return apply(x, std::move(fn), false); }

at::Tensor call_after_backward(const at::Tensor& loss, std::function<void()> fn) { return apply(loss, std::move(fn), true); }

}  // namespace mm::parallel
