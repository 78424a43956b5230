// Activation checkpointing (recompute) for blocks. The forward of a wrapped block runs without
// building a graph and keeps only its input; backward re-runs the block with grad enabled and
// back-propagates through the fresh graph. Memory per block drops to one input tensor at the
// cost of one extra forward. Conditioning in the block's context that needs gradient (a DiT's text
// and timestep: ForwardContext::context, modulation) is an input of the recomputed region, so its
// gradient flows on. Gradients equal the un-checkpointed ones exactly (same kernels,
// same order; the CPU/CUDA RNG state and autocast state of the forward are restored for the re-run).
#pragma once

#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"

namespace mm::training {

// Runs fn(x) checkpointed. Without grad mode (inference) this is just fn(x).
at::Tensor checkpoint(const mm::nn::BlockFn& fn, const at::Tensor& x);

// Installs a "recompute" wrapper on every Block whose path matches a pattern, and runs every
// attention or MLP (mm::nn::ForwardThrough) a pattern names checkpointed on its own: selective
// recompute ("model.layers.{*}.self_attn", "model.layers.{*}.mlp"), the rest of the block keeping
// its activations. Returns the number of modules wrapped (a block already wrapped counts once and
// is not wrapped twice). ConfigError for a pattern matching nothing, or matching another module.
int64_t apply_recompute_plan(mm::nn::Module& root, const std::vector<std::string>& patterns);

// Activation offload (features.offload, CUDA): every Block a pattern names is recomputed, and the
// one input it keeps goes to pinned host memory on a side stream during forward; the backward of
// the block after it brings it back on that stream, so it is on the device when backward reaches
// it. ConfigError for a pattern matching nothing or a non-block, a block also in the recompute
// plan, or a build without CUDA (the trainer refuses a CPU device first).
int64_t apply_offload_plan(mm::nn::Module& root, const std::vector<std::string>& patterns);

}  // namespace mm::training
