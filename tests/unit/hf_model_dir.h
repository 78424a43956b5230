// Test helper: a model back from an HF directory, built by config.json's model_type and loaded
// with the model's own checkpoint-name mapping (as mm generate and mm export load them).
#pragma once

#include <memory>
#include <string>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/models/model_registry.h"

namespace mm::test {

inline std::shared_ptr<mm::models::CausalLM> load_hf_model(const std::string& dir) {
  nlohmann::json cfg = mm::checkpoint::read_hf_config(dir);
  auto m = mm::models::as_causal_lm(
      mm::models::model_registry().get(cfg.value("model_type", ""), "model_type")(cfg, dir, false), dir);
  mm::checkpoint::load_model_weights(*m, dir, {}, [&](const std::string& k) { return m->parameter_name(k); });
  return m;
}

}  // namespace mm::test
