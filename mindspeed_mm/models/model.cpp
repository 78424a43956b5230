#include "mindspeed_mm/models/model.h"

#include "mindspeed_mm/core/errors.h"

namespace mm::models {

size_t part_of(const std::vector<ModelPart>& parts, const std::string& parameter) {
  size_t best = parts.size(), best_len = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& prefix = parts[i].prefix;
    if (parameter.compare(0, prefix.size(), prefix) == 0 && (best == parts.size() || prefix.size() > best_len)) {
      best = i;
      best_len = prefix.size();
    }
  }
  return best;
}

std::vector<std::pair<std::string, int64_t>> parameters_by_part(const Model& model) {
  const std::vector<ModelPart> parts = model.parts();
  std::vector<std::pair<std::string, int64_t>> counts;
  for (const auto& p : parts) counts.emplace_back(p.name, 0);
  for (const auto& [name, t] : model.named_parameters())
    if (size_t i = part_of(parts, name); i < parts.size()) counts[i].second += t.numel();
  return counts;
}

std::vector<std::pair<std::string, double>> Model::training_flops_by_part(const data::Batch& host) const {
  const std::vector<ModelPart> p = parts();
  return {{p.size() == 1 ? p[0].name : std::string("model"), training_flops(host)}};
}

void Model::pipeline_forward(size_t, int64_t, int64_t, Outputs&, const data::Batch&) {
  throw ConfigError(cat("config: parallel.pipeline_parallel_size > 1: model ", type_name(), " has no pipeline pieces"));
}

}  // namespace mm::models
