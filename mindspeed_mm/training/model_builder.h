// Building the model a config's `model` section describes, on the run's device.
#pragma once

#include <memory>
#include <string>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/models/model_registry.h"

namespace mm::training {

// The HF config a model section describes: model.pretrained's or model.config_path's config.json
// with model.config's fields on top. vocab_size defaults to the tokenizer's when the data has one
// (tokenizer_vocab > 0) and may not be smaller. *strict: the fields came from our YAML alone.
nlohmann::json resolve_hf_config(const config::ModelConfig& m, int64_t tokenizer_vocab, bool* strict);

// Builds the model on `device`, initialised from seed or loaded from model.pretrained: the
// parameters are made without storage, then given it on the device, where the initial values
// and the checkpoint's tensors are written directly (no full copy of the model on the host).
// source_file (the YAML's name) only improves error messages. deferred: parameters left
// without storage (core/param_init.h), neither initialised nor loaded: FSDP materialises its shards.
std::shared_ptr<models::Model> build_model(const config::ModelConfig& m, int64_t tokenizer_vocab, uint64_t seed,
                                           const std::string* source_file = nullptr, bool deferred = false,
                                           at::Device device = at::kCPU);

// The same for a run's data: what the model takes from it (today the tokenizer's vocabulary size,
// for text data; nothing for data without a vocabulary).
std::shared_ptr<models::Model> build_model(const config::ModelConfig& m, const data::TrainData& data, uint64_t seed,
                                           const std::string* source_file = nullptr, bool deferred = false,
                                           at::Device device = at::kCPU);

// model.parts: each listed part's tensors from its directory (after model.pretrained's), through
// `store` as load_model_weights takes it. ConfigError for an unknown part or a malformed entry.
void load_part_weights(models::Model& model, const config::ModelConfig& m, const checkpoint::WeightStore& store = {});
// model.parts entries with trainable: false: their parameters frozen. Returns how many tensors.
int64_t freeze_parts(models::Model& model, const config::ModelConfig& m);

}  // namespace mm::training
