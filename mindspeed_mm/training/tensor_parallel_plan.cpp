#include "mindspeed_mm/training/tensor_parallel_plan.h"

#include <ATen/core/grad_mode.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/pattern.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/linear.h"
#include "mindspeed_mm/training/plans.h"

namespace mm::training {
namespace {

struct Target {
  std::string path, style;
  mm::nn::Module* module;
};

void keep_slice(at::Tensor& param, int64_t dim, int rank, int size) {
  at::NoGradGuard no_grad;
  param.set_data(parallel::tp_slice(param, dim, rank, size).clone());
}

}  // namespace

int64_t apply_tensor_parallel_plan(mm::nn::Module& root, const std::vector<std::pair<std::string, std::string>>& plan,
                                   const parallel::TpGroup& tp) {
  const int n = tp ? tp->size() : 1, r = tp ? tp->rank() : 0;
  std::vector<PathPattern> patterns;
  for (const auto& [pattern, style] : plan) {
    if (style != "colwise" && style != "rowwise" && style != "heads")
      throw ConfigError(cat("config: tensor-parallel plan '", pattern, "': unknown style '", style,
                            "' (colwise, rowwise, heads)"));
    patterns.emplace_back(pattern);
  }
  // Every target first, checked, so a bad plan changes nothing.
  std::vector<Target> targets;
  std::vector<bool> used(plan.size(), false);
  auto fail = [&](const std::string& path, const std::string& what) -> void {
    throw ConfigError(cat("config: tensor parallel over ", n, " ranks: ", path, " ", what));
  };
  for_each_module(root, [&](const std::string& path, mm::nn::Module& m) {
    for (size_t i = 0; i < plan.size(); ++i) {
      if (!patterns[i].matches(path)) continue;
      used[i] = true;
      const std::string& style = plan[i].second;
      if (style == "heads") {
        auto* h = dynamic_cast<models::HeadSplittable*>(&m);
        if (!h) fail(path, cat("is a ", m.type_name(), ", not an attention module whose heads split"));
        const auto [q, kv] = h->heads();
        if (q % n != 0 || kv % n != 0)
          fail(path, cat("has ", q, " query and ", kv, " key/value heads; both must divide by ", n));
      } else {
        auto* lin = dynamic_cast<models::Linear*>(&m);
        if (!lin) fail(path, cat("is a ", m.type_name(), ", not a Linear (", style, ")"));
        const int64_t features = style == "colwise" ? lin->out_features : lin->in_features;
        if (features % n != 0)
          fail(path, cat("has ", features, style == "colwise" ? " output" : " input", " features, which do not divide by ", n));
      }
      targets.push_back({path, style, &m});
      break;
    }
  });
  for (size_t i = 0; i < plan.size(); ++i)
    if (!used[i]) throw ConfigError(cat("config: tensor-parallel plan pattern '", plan[i].first, "' matches no module"));
  if (n == 1) return static_cast<int64_t>(targets.size());

  for (const Target& t : targets) {
    if (t.style == "heads") {
      auto* h = dynamic_cast<models::HeadSplittable*>(t.module);
      const auto [q, kv] = h->heads();
      h->keep_heads(q / n, kv / n);
      continue;
    }
    auto* lin = static_cast<models::Linear*>(t.module);
    if (t.style == "colwise") {
      keep_slice(lin->weight, 0, r, n);
      if (lin->bias.defined()) keep_slice(lin->bias, 0, r, n);
      lin->out_features /= n;
      lin->parallel_forward = [tp](const models::Linear& l, const at::Tensor& x) {
        return at::linear(parallel::copy_to_tp_region(x, tp), l.weight, l.bias);
      };
    } else {
      keep_slice(lin->weight, 1, r, n);  // the bias stays whole, added once after the sum
      lin->in_features /= n;
      lin->parallel_forward = [tp](const models::Linear& l, const at::Tensor& x) {
        at::Tensor y = parallel::reduce_from_tp_region(at::linear(x, l.weight), tp);
        return l.bias.defined() ? y + l.bias : y;
      };
    }
  }
  return static_cast<int64_t>(targets.size());
}

}  // namespace mm::training
