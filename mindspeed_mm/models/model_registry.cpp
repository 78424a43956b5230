#include "mindspeed_mm/models/model_registry.h"

namespace mm::models {

mm::Registry<ModelFactory>& model_registry() {
  static mm::Registry<ModelFactory> registry("model");
  return registry;
}

mm::Registry<ModelSizeFn>& model_size_registry() {
  static mm::Registry<ModelSizeFn> registry("model");
  return registry;
}

int64_t ModelSize::total() const {
  int64_t n = 0;
  for (const auto& [_, c] : parts) n += c;
  return n;
}

}  // namespace mm::models
