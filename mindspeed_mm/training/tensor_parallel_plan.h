// Tensor parallelism as a plan (Megatron-style, applied to unchanged model code): the model's
// PlanTable::tensor_parallel says, by module-path pattern, which Linear layers are column-parallel
// (their output features split over the group: q/k/v, gate/up), which row-parallel (input
// features split, the partial products summed: o, down) and which attention modules keep a share
// of the heads. Each rank keeps its slice of every split weight (set_data: the parameter objects
// stay the ones the optimizer and checkpoints see); the layers' forward goes through the regions
// of parallel/tensor_parallel.h, so gradients are exact.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/parallel/tensor_parallel.h"

namespace mm::training {

// Returns the number of modules the plan changed. ConfigError (before anything changes) for a
// pattern that matches nothing, a style that does not fit the module, an unknown style, or sizes
// (features, heads) that do not divide by the group size, each naming the module and the sizes.
int64_t apply_tensor_parallel_plan(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                                   const parallel::TpGroup& tp);

}  // namespace mm::training
