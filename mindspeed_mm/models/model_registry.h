// Models by id ("qwen2", "qwen2_vl"), built from an HF config.json object. Each model family
// registers itself from its own .cpp with a static mm::Registrar, so adding a model touches no
// shared file.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mindspeed_mm/core/registry.h"
#include "mindspeed_mm/models/causal_lm.h"
#include "mindspeed_mm/models/model.h"

namespace mm::models {

// strict: true for configs written in our YAML (unknown keys are errors), false for HF
// config.json files (unknown keys such as architectures are ignored). source names where the
// config came from in error messages ("model.config in tiny.yaml", "/models/qwen2/config.json").
using ModelFactory =
    std::function<std::shared_ptr<Model>(const nlohmann::json& hf_config, const std::string& source, bool strict)>;

mm::Registry<ModelFactory>& model_registry();

// Parameter counts by part ("vision tower", "projector", "language model") from the config
// alone, without building the model: how `mm flops` sizes full-size models on any machine.
struct ModelSize {
  std::vector<std::pair<std::string, int64_t>> parts;
  // Training FLOPs per text token at a sequence length (null for models without text tokens);
  // of one image of (height, width) pixels after the processor's resize (null for text models).
  std::function<double(int64_t seq_len)> flops_per_token;
  std::function<double(int64_t height, int64_t width)> image_flops;
  // Training FLOPs of typical samples, in words ("480p 81-frame clip (32,760 latent tokens)").
  std::vector<std::pair<std::string, double>> sample_flops;
  int64_t total() const;
};
using ModelSizeFn = std::function<ModelSize(const nlohmann::json& hf_config, const std::string& source, bool strict)>;
mm::Registry<ModelSizeFn>& model_size_registry();

}  // namespace mm::models
