// The model of `mm generate` / `mm eval`: a Hugging Face directory (config.json + safetensors),
// a training checkpoint folder (save/iter_XXXXXXX), or a save dir (its `latest`). The model type
// comes from config.json's model_type. A training checkpoint also carries the resolved YAML it
// was trained with, so prompts are built with the same tokenizer, chat template and processor.
#pragma once

#include <memory>
#include <string>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/models/model_registry.h"

namespace mm::inference {

struct LoadedModel {
  std::shared_ptr<models::CausalLM> model;
  std::string dir;           // the folder the weights came from
  std::string train_config;  // the training YAML of a checkpoint; "" for an HF directory
};

// mm::Error naming the path when there is no model there or the weights do not fit. The
// parameters get their storage on `device` and the checkpoint's tensors are copied there one by
// one (no host copy of the whole model).
LoadedModel load_model(const std::string& path, at::Device device = at::kCPU);

// The data settings prompts are encoded with: `config_path`'s data section when given, else the
// checkpoint's training config, else the defaults (byte tokenizer, qwen2vl template), with an HF
// directory's tokenizer.json and preprocessor_config.json (min_pixels, max_pixels, patch_size,
// temporal_patch_size, merge_size, image_mean, image_std) when present. `overrides` are
// `data.key=value` assignments applied last.
config::DataConfig inference_data_config(const LoadedModel& m, const std::string& config_path,
                                         const std::vector<std::string>& overrides);

}  // namespace mm::inference
