#include "mindspeed_mm/training/objectives/objective.h"

namespace mm::training {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t Objective::draw_seed(uint64_t seed, int64_t step, uint64_t id) {
  return splitmix64(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(step))) ^ id);
}

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
