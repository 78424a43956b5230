#include "mindspeed_mm/models/model_registry.h"

namespace mm::models {

mm::Registry<ModelFactory>& model_registry() {
  static mm::Registry<ModelFactory> registry("model");
  return registry;
}

}  // namespace mm::models
