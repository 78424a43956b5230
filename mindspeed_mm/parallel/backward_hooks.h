// Autograd triggers that DDP and FSDP hang their communication on (libtorch's C++ modules have
// no forward/backward hooks). Both are identity custom Functions: the value passes through
// unchanged, and the callback runs when backward reaches that point of the graph.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>

namespace mm::parallel {

// x unchanged; fn runs when backward reaches x, before the gradients of whatever produced x
// (FSDP re-gathers a unit's parameters here, just before that unit's backward).
at::Tensor call_before_backward_of(const at::Tensor& x, std::function<void()> fn);

// loss unchanged; when backward starts from it, fn is queued on the autograd engine and runs
// once after every gradient of that backward, those of reentrant (recomputed) blocks included.
// A callback queued from a parameter hook instead would run at the end of the first recomputed
// block's nested backward, too early.
at::Tensor call_after_backward(const at::Tensor& loss, std::function<void()> fn);

// fn runs each time backward has written param's final .grad for this backward (a post-hook on
// its AccumulateGrad node: launching an async collective on the incoming gradient from a
// tensor hook instead races with accumulation). Autograd holds the node only weakly: keep the
// returned handle as long as the hook must fire.
std::shared_ptr<void> on_gradient_ready(const at::Tensor& param, std::function<void()> fn);

}  // namespace mm::parallel
