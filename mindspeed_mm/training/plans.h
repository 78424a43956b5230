// Plans: module-path patterns (core/pattern.h) that say what to do to which part of a built model.
// Applied after construction, in the order TorchTitan uses (TP, activation checkpointing, FSDP);
// model code knows nothing of them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"

namespace mm::training {

// Visits `root` (path `prefix`) and every module below it, depth first, with its dotted path.
// Unlike Module::named_modules it needs no shared_ptr to the root.
void for_each_module(mm::nn::Module& root, const std::function<void(const std::string&, mm::nn::Module&)>& fn,
                     const std::string& prefix = "");

// Calls fn(path, module) for every module (depth first) whose path matches one of `patterns`;
// then ConfigError "config: <what> pattern '<p>' matches no module" for a pattern that matched none.
void for_each_matching_module(mm::nn::Module& root, const std::vector<std::string>& patterns, const std::string& what,
                              const std::function<void(const std::string&, mm::nn::Module&)>& fn);

// Sets requires_grad=false on every parameter under a module whose path matches a pattern,
// and on every parameter whose full name matches ("model.norm.weight"). Returns the number of
// distinct parameter tensors the plan covers. A pattern matching nothing is a ConfigError.
int64_t apply_freeze_plan(mm::nn::Module& root, const std::vector<std::string>& patterns);

// The blocks that are FSDP units: those whose path matches a pattern, every block when
// patterns is empty. ConfigError for a pattern matching nothing or a module that is not a block.
std::vector<std::pair<std::string, mm::nn::Block*>> fsdp_units(mm::nn::Module& root, const std::vector<std::string>& patterns);

}  // namespace mm::training
