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

#ifdef MM_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

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
  // Offload: the kept input in pinned host memory instead of saved on the device (null: saved).
  std::shared_ptr<struct OffloadSlot> offload;
};

// Its way back is started early by the backward of the block after it (prev: the offloaded
// block before this one in forward order, whose backward comes next).
struct OffloadSlot {
  at::Tensor host_x, device_x;
  bool x_requires_grad = false, backward_done = false;
  std::weak_ptr<OffloadSlot> prev;
#ifdef MM_WITH_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> arrived;
#endif
};

thread_local std::weak_ptr<OffloadSlot> t_last_offloaded;

#ifdef MM_WITH_CUDA
c10::cuda::CUDAStream& copy_stream() {
  thread_local c10::cuda::CUDAStream s = c10::cuda::getStreamFromPool();
  return s;
}

// x to pinned host memory on the side stream, after what the current stream has queued.
at::Tensor offload_to_host(const at::Tensor& x) {
  at::Tensor host = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(true));
  auto main = c10::cuda::getCurrentCUDAStream(x.device().index());
  at::cuda::CUDAEvent ready;
  ready.record(main);
  auto& side = copy_stream();
  ready.block(side);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    host.copy_(x, /*non_blocking=*/true);
  }
  // The caching allocator keeps x's memory until the side stream's copy is done.
  c10::cuda::CUDACachingAllocator::recordStream(x.storage().data_ptr(), side);
  return host;
}

// Starts bringing a state's input back on the side stream.
void prefetch(OffloadSlot& s, at::Device device) {
  if (s.device_x.defined() || !s.host_x.defined()) return;
  auto& side = copy_stream();
  c10::cuda::CUDAStreamGuard guard(side);
  s.device_x = s.host_x.to(device, /*non_blocking=*/true);
  s.arrived = std::make_shared<at::cuda::CUDAEvent>();
  s.arrived->record(side);
  // Used on the main stream later: its memory is not reused before that work is done.
  c10::cuda::CUDACachingAllocator::recordStream(s.device_x.storage().data_ptr(),
                                                c10::cuda::getCurrentCUDAStream(device.index()));
}
#endif


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
    if (state->offload) {
#ifdef MM_WITH_CUDA
      OffloadSlot& slot = *state->offload;
      slot.host_x = offload_to_host(x);
      slot.x_requires_grad = x.requires_grad();
      saved[0] = at::empty({0}, x.options());  // the device only: the values wait on the host
      auto last = t_last_offloaded.lock();
      if (last && !last->backward_done) slot.prev = last;
      t_last_offloaded = state->offload;
#endif
    }
    saved.insert(saved.end(), extra.begin(), extra.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["state"] = at::IValue::make_capsule(std::move(state));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    auto state = c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    at::Tensor x = saved[0];
    bool x_grad = x.requires_grad();
    if (state->offload) {
#ifdef MM_WITH_CUDA
      OffloadSlot& slot = *state->offload;
      const at::Device device = x.device();
      prefetch(slot, device);  // already on its way unless this is the last block
      slot.arrived->block(c10::cuda::getCurrentCUDAStream(device.index()));
      x = slot.device_x;
      x_grad = slot.x_requires_grad;
      slot.device_x = slot.host_x = at::Tensor();
      slot.backward_done = true;
      if (auto prev = slot.prev.lock()) prefetch(*prev, device);  // the next block backward meets
#endif
    }

    at::Tensor input = x.detach();
    input.set_requires_grad(x_grad);
    mm::nn::ForwardContext context = state->context;
    std::vector<at::Tensor> cond;
    for (size_t k = 0; k < state->conditioning.size(); ++k) {
      at::Tensor c = saved[1 + (state->anchor ? 1 : 0) + k].detach();
      c.set_requires_grad(true);
      context.*(state->conditioning[k]) = c;
      cond.push_back(c);
    }
    const RngState rng_now = RngState::capture(x);  // x: on its device again
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
    variable_list grads = {x_grad ? input.grad() : at::Tensor()};
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
                           bool params_need_grad, bool offload = false) {
  if (!at::GradMode::is_enabled()) return fn(x, context);
  auto state = c10::make_intrusive<RecomputeState>();
  if (offload && x.is_cuda()) state->offload = std::make_shared<OffloadSlot>();
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

int64_t apply_offload_plan(mm::nn::Module& root, const std::vector<std::string>& patterns) {
#ifndef MM_WITH_CUDA
  throw ConfigError("config: features.offload needs a CUDA build of mm (this one has no CUDA)");
#endif
  int64_t wrapped = 0;
  for_each_matching_module(root, patterns, "features.offload", [&](const std::string& path, mm::nn::Module& mod) {
    auto* block = dynamic_cast<mm::nn::Block*>(&mod);
    if (!block)
      throw ConfigError(cat("config: features.offload matches '", path.empty() ? "<root>" : path, "', a ",
                            mod.type_name(), ", which is not a block"));
    if (block->has_wrapper("recompute"))
      throw ConfigError(cat("config: '", path, "' is in both features.recompute and features.offload (offload "
                            "recomputes it already)"));
    ++wrapped;
    block->add_wrapper("offload", [](mm::nn::Block& b, const at::Tensor& x, const mm::nn::ForwardContext& c,
                                     const mm::nn::BlockCtxFn& inner) {
      return checkpoint_impl(inner, x, c, any_param_requires_grad(b), /*offload=*/true);
    });
  });
  return wrapped;
}

int64_t apply_recompute_plan(mm::nn::Module& root, const std::vector<std::string>& patterns) {
  int64_t wrapped = 0;
  for_each_matching_module(root, patterns, "recompute plan", [&](const std::string& path, mm::nn::Module& mod) {
    auto* block = dynamic_cast<mm::nn::Block*>(&mod);
    if (auto* part = dynamic_cast<mm::nn::ForwardThrough*>(&mod); part && !block) {
      // Selective: this attention or MLP alone, the rest of its block keeping its activations.
      ++wrapped;
      const bool params = any_param_requires_grad(mod);
      part->through = [params](const at::Tensor& x, const mm::nn::BlockFn& own) {
        return checkpoint_impl([own](const at::Tensor& in, const mm::nn::ForwardContext&) { return own(in); }, x, {},
                               params);
      };
      return;
    }
    if (!block)
      throw ConfigError(cat("config: recompute plan matches '", path.empty() ? "<root>" : path, "', a ",
                            mod.type_name(), ", which is neither a block (a decoder layer: recomputed whole) nor an "
                            "attention or MLP that can be recomputed alone"));
    ++wrapped;
    if (block->has_wrapper("recompute")) return;
    block->add_wrapper("recompute", [](mm::nn::Block& b, const at::Tensor& x, const mm::nn::ForwardContext& c,
                                       const mm::nn::BlockCtxFn& inner) {
      return checkpoint_impl(inner, x, c, any_param_requires_grad(b));
    });
  });
  return wrapped;
}

}  // namespace mm::training
