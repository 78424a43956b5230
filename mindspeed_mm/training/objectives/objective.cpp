#include "mindspeed_mm/training/objectives/objective.h"

namespace mm::training {

Registry<ObjectiveFactory>& objective_registry() {
  static Registry<ObjectiveFactory> r("objective");
  return r;
}

std::unique_ptr<Objective> make_objective(const config::Config& cfg, const models::Model& model) {
  const std::string& id = cfg.training.objective;
  if (id == "auto") return objective_registry().get(model.default_objective(), "the model's objective")(cfg);
  return objective_registry().get(id, "training.objective")(cfg);
}

}  // namespace mm::training
