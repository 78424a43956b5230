// Training checkpoints and Hugging Face directories.
//
// save/iter_0000100/            one iteration's full training state
//   config.json                 the model's HF config (so the folder is also an HF model dir)
//   model.safetensors           weights under their HF names
//   optimizer.safetensors       optimizer state ("step", "exp_avg.<param>", ...)
//   rng.safetensors             CPU generator state
//   train_state.json            iteration, consumed samples, sampler state, resolved config
// save/latest                   name of the newest complete iteration folder, written last
//
// Each folder is written under a temporary name and renamed into place, and `latest` is
// replaced atomically after it, so a crash mid-save never damages the previous checkpoint.
#pragma once

#include <nlohmann/json.hpp>
#include <functional>
#include <string>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/training/optimizer.h"

namespace mm::checkpoint {

struct TrainState {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  nlohmann::json sampler;      // data sampler state
  std::string config_yaml;     // resolved config, for reference
};

std::string iteration_dir_name(int64_t iteration);  // "iter_0000100"

// Writes save_dir/iter_XXXXXXX and then save_dir/latest. Returns the folder written.
std::string save_train_checkpoint(const std::string& save_dir, const TrainState& state, const nlohmann::json& hf_config,
                                  const mm::nn::Module& model, const training::Optimizer& optimizer);

// "auto" -> the folder named by save_dir/latest, or "" when there is none yet; a path -> itself
// (an error if it does not exist).
std::string resolve_resume_dir(const std::string& resume, const std::string& save_dir);

// Restores model weights, optimizer state and the CPU RNG; returns the rest of the state.
TrainState load_train_checkpoint(const std::string& dir, mm::nn::Module& model, training::Optimizer& optimizer);

// Loads weights (an HF directory or a .safetensors file) into the model by name. Every model
// parameter must be present with its exact shape; extra checkpoint tensors are an error too,
// except `ignorable` ones. The message lists the first offenders. `rename` maps a checkpoint
// name to the model's (e.g. transformers' newer "model.language_model.*" to "model.*"); the
// error names the checkpoint's own spelling.
void load_model_weights(mm::nn::Module& model, const std::string& source,
                        const std::vector<std::string>& ignorable = {},
                        const std::function<std::string(const std::string&)>& rename = {});

// Writes an HF model directory: config.json + model.safetensors (sharded past max_shard_bytes).
void export_hf_directory(const std::string& dir, const nlohmann::json& hf_config, const mm::nn::Module& model,
                         uint64_t max_shard_bytes = 5ull << 30);

// Reads DIR/config.json.
nlohmann::json read_hf_config(const std::string& dir);

}  // namespace mm::checkpoint
