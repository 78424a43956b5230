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

// Installs a "recompute" wrapper on every Block whose path matches a pattern. Returns the
// number of blocks wrapped (a block already wrapped counts once and is not wrapped twice).
// ConfigError for a pattern matching nothing, or matching a module that is not a Block.
int64_t apply_recompute_plan(mm::nn::Module& root, const std::vector<std::string>& patterns);

}  // namespace mm::training
