#include "mindspeed_mm/training/plans.h"

#include <unordered_set>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/pattern.h"

namespace mm::training {

void for_each_module(mm::nn::Module& root, const std::function<void(const std::string&, mm::nn::Module&)>& fn,
                     const std::string& prefix) {
  fn(prefix, root);
  for (auto& [name, child] : root.children())
    for_each_module(*child, fn, prefix.empty() ? name : prefix + "." + name);
}

void for_each_matching_module(mm::nn::Module& root, const std::vector<std::string>& patterns, const std::string& what,
                              const std::function<void(const std::string&, mm::nn::Module&)>& fn) {
  const auto compiled = mm::compile_patterns(patterns);
  std::vector<bool> used(compiled.size(), false);
  for_each_module(root, [&](const std::string& path, mm::nn::Module& mod) {
    bool hit = false;
    for (size_t i = 0; i < compiled.size(); ++i)
      if (compiled[i].matches(path)) used[i] = hit = true;
    if (hit) fn(path, mod);
  });
  for (size_t i = 0; i < compiled.size(); ++i)
    if (!used[i]) throw ConfigError(cat("config: ", what, " pattern '", patterns[i], "' matches no module"));
}

int64_t apply_freeze_plan(mm::nn::Module& root, const std::vector<std::string>& patterns) {
  const auto compiled = mm::compile_patterns(patterns);
  std::vector<bool> used(compiled.size(), false);
  std::unordered_set<const void*> frozen;
  auto freeze = [&](const at::Tensor& t) {
    at::Tensor p = t;
    p.set_requires_grad(false);
    frozen.insert(p.unsafeGetTensorImpl());
  };
  for_each_module(root, [&](const std::string& path, mm::nn::Module& mod) {
    for (size_t i = 0; i < compiled.size(); ++i) {
      if (!compiled[i].matches(path)) continue;
      used[i] = true;
      for (auto& [_, t] : mod.named_parameters()) freeze(t);
    }
  });
  for (auto& [name, t] : root.named_parameters()) {
    for (size_t i = 0; i < compiled.size(); ++i) {
      if (!compiled[i].matches(name)) continue;
      used[i] = true;
      freeze(t);
    }
  }
  for (size_t i = 0; i < compiled.size(); ++i)
    if (!used[i])
      throw ConfigError(cat("config: freeze plan pattern '", patterns[i], "' matches no module or parameter"));
  return static_cast<int64_t>(frozen.size());
}

}  // namespace mm::training

namespace mm::training {

std::vector<std::pair<std::string, mm::nn::Block*>> fsdp_units(mm::nn::Module& root, const std::vector<std::string>& patterns) {
  const auto compiled = mm::compile_patterns(patterns);
  std::vector<bool> used(compiled.size(), false);
  std::vector<std::pair<std::string, mm::nn::Block*>> units;
  for_each_module(root, [&](const std::string& path, mm::nn::Module& mod) {
    auto* block = dynamic_cast<mm::nn::Block*>(&mod);
    bool hit = patterns.empty() && block;
    for (size_t i = 0; i < compiled.size(); ++i)
      if (compiled[i].matches(path)) used[i] = hit = true;
    if (!hit) return;
    if (!block)
      throw ConfigError(cat("config: parallel.fsdp.units matches '", path.empty() ? "<root>" : path, "', a ",
                            mod.type_name(), ", which is not a block (units are blocks such as decoder layers; the rest "
                            "of the model is the root unit)"));
    units.emplace_back(path, block);
  });
  for (size_t i = 0; i < compiled.size(); ++i)
    if (!used[i]) throw ConfigError(cat("config: parallel.fsdp.units pattern '", patterns[i], "' matches no module"));
  return units;
}

}  // namespace mm::training
