#include "mindspeed_mm/training/recompute.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/pattern.h"
#include "mindspeed_mm/core/torch_compat.h"
#include "mindspeed_mm/training/plans.h"

namespace mm::training {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autocast settings of the forward pass, re-applied while recomputing so the re-run sees the
// same dtypes (backward itself runs outside autocast).
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;

  static AutocastState current() {
    AutocastState s;
    s.cpu = at::autocast::is_autocast_enabled(at::kCPU);
    s.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    return s;
  }
  void apply() const {
    mm::compat::set_autocast(at::kCPU, cpu, cpu_dtype);
    mm::compat::set_autocast(at::kCUDA, cuda, cuda_dtype);
  }
};

// RNG state of the generators a block may draw from (dropout): the CPU one, and the CUDA one of
// the input's device when it lives there.
struct RngState {
  at::Tensor cpu, device;
  c10::optional<at::Device> dev;

  static at::Tensor get(at::Generator gen) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }
  static void set(at::Generator gen, const at::Tensor& state) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
  static RngState capture(const at::Tensor& x) {
    RngState s;
    s.cpu = get(at::detail::getDefaultCPUGenerator());
    if (!x.device().is_cpu()) {
      s.dev = x.device();
      s.device = get(at::globalContext().defaultGenerator(x.device()));
    }
    return s;
  }
  void restore() const {
    set(at::detail::getDefaultCPUGenerator(), cpu);
    if (dev) set(at::globalContext().defaultGenerator(*dev), device);
  }
};

// Travels from forward to backward inside the autograd context (as an IValue capsule): the
// chain, the context it ran in, and which of the context's tensors are Function inputs.
struct RecomputeState : torch::CustomClassHolder {
  mm::nn::BlockCtxFn fn;
  mm::nn::ForwardContext context;
  bool anchor = false;                 // extra[0] is the anchor
  std::vector<at::Tensor mm::nn::ForwardContext::*> conditioning;  // then these fields, in order
  RngState rng;
  AutocastState autocast;
};

// The context tensors that carry gradient back out of a block: a diffusion transformer's text
// and timestep conditioning are computed from parameters outside the block.
const std::vector<at::Tensor mm::nn::ForwardContext::*> kConditioning = {&mm::nn::ForwardContext::context,
                                                                         &mm::nn::ForwardContext::modulation};

// Inputs: x (the block input); extra: when x does not require grad but the block's parameters
// do, an anchor (an empty grad-requiring leaf that makes the output require grad so backward
// still reaches the parameters), then the context's conditioning tensors that require grad, so
// their gradients flow out of the recomputed block to what made them.
struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList extra,
                            c10::intrusive_ptr<RecomputeState> state) {
    at::NoGradGuard no_grad;
    state->rng = RngState::capture(x);
    state->autocast = AutocastState::current();
    at::Tensor out = state->fn(x, state->context);
    std::vector<at::Tensor> saved = {x};
    saved.insert(saved.end(), extra.begin(), extra.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["state"] = at::IValue::make_capsule(std::move(state));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    auto state = c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());

    at::Tensor input = x.detach();
    input.set_requires_grad(x.requires_grad());
    mm::nn::ForwardContext context = state->context;
    std::vector<at::Tensor> cond;
    for (size_t k = 0; k < state->conditioning.size(); ++k) {
      at::Tensor c = saved[1 + (state->anchor ? 1 : 0) + k].detach();
      c.set_requires_grad(true);
      context.*(state->conditioning[k]) = c;
      cond.push_back(c);
    }
    const RngState rng_now = RngState::capture(x);
    const AutocastState autocast_now = AutocastState::current();
    state->rng.restore();
    state->autocast.apply();
    at::Tensor out;
    try {
      at::AutoGradMode grad_on(true);
      out = state->fn(input, context);
    } catch (...) {
      autocast_now.apply();
      rng_now.restore();
      throw;
    }
    autocast_now.apply();
    rng_now.restore();

    at::Tensor grad_out = grad_outputs[0].defined() ? grad_outputs[0] : at::zeros_like(out);
    if (out.requires_grad()) torch::autograd::backward({out}, {grad_out});
    // One gradient per forward input: x, the extra tensors (none for the anchor), the state.
    variable_list grads = {x.requires_grad() ? input.grad() : at::Tensor()};
    if (state->anchor) grads.emplace_back();
    for (auto& c : cond) grads.push_back(c.grad());
    grads.emplace_back();
    return grads;
  }
};

bool any_param_requires_grad(const mm::nn::Module& m) {
  for (auto& [_, p] : m.named_parameters())
    if (p.requires_grad()) return true;
  return false;
}

at::Tensor checkpoint_impl(const mm::nn::BlockCtxFn& fn, const at::Tensor& x, const mm::nn::ForwardContext& context,
                           bool params_need_grad) {
  if (!at::GradMode::is_enabled()) return fn(x, context);
  auto state = c10::make_intrusive<RecomputeState>();
  state->fn = fn;
  state->context = context;
  std::vector<at::Tensor> extra;
  for (auto field : kConditioning) {
    const at::Tensor& c = context.*field;
    if (c.defined() && c.requires_grad()) state->conditioning.push_back(field);
  }
  if (!x.requires_grad() && state->conditioning.empty()) {
    if (!params_need_grad) return fn(x, context);
    at::Tensor anchor = at::empty({0}, x.options());
    anchor.set_requires_grad(true);
    extra.push_back(anchor);
    state->anchor = true;
  }
  for (auto field : state->conditioning) extra.push_back(context.*field);
  return RecomputeFunction::apply(x, at::TensorList(extra), std::move(state));
}

}  // namespace

at::Tensor checkpoint(const mm::nn::BlockFn& fn, const at::Tensor& x) {
  return checkpoint_impl([fn](const at::Tensor& in, const mm::nn::ForwardContext&) { return fn(in); }, x, {}, true);
}

int64_t apply_recompute_plan(mm::nn::Module& root, const std::vector<std::string>& patterns) {
  const auto compiled = mm::compile_patterns(patterns);
  std::vector<bool> used(compiled.size(), false);
  int64_t wrapped = 0;
  for_each_module(root, [&](const std::string& path, mm::nn::Module& mod) {
    bool hit = false;
    for (size_t i = 0; i < compiled.size(); ++i)
      if (compiled[i].matches(path)) used[i] = hit = true;
    if (!hit) return;
    auto* block = dynamic_cast<mm::nn::Block*>(&mod);
    if (!block)
      throw ConfigError(cat("config: recompute plan matches '", path.empty() ? "<root>" : path, "', a ",
                            mod.type_name(), ", which is not a block (recompute wraps blocks such as decoder layers)"));
    ++wrapped;
    if (block->has_wrapper("recompute")) return;
    block->add_wrapper("recompute", [](mm::nn::Block& b, const at::Tensor& x, const mm::nn::ForwardContext& c,
                                       const mm::nn::BlockCtxFn& inner) {
      return checkpoint_impl(inner, x, c, any_param_requires_grad(b));
    });
  });
  for (size_t i = 0; i < compiled.size(); ++i)
    if (!used[i]) throw ConfigError(cat("config: recompute plan pattern '", patterns[i], "' matches no module"));
  return wrapped;
}

}  // namespace mm::training
