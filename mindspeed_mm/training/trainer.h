// The train engine of `mm train`: build data, model and optimizer from the config, apply plans,
// resume, then loop over steps of gradient-accumulated micro-batches with validation, logging,
// checkpoints, HF export and a greedy sample at the end.
#pragma once

#include <memory>
#include <string>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/training/data_parallel.h"

namespace mm::training {

struct TrainSummary {
  double val_loss_before = NAN, val_loss_after = NAN;  // nats per token
  double unigram_baseline = NAN;                       // nats per token on the val split
  int64_t iterations = 0;
  double mean_tokens_per_s = 0;
  int64_t skipped_samples = 0;                         // bad samples the data skipped
  std::string sample;
};

TrainSummary train(const config::Config& cfg);

// The HF config a model section describes: model.pretrained's or model.config_path's config.json
// with model.config's fields on top; vocab_size defaults to the tokenizer's.
nlohmann::json resolve_hf_config(const config::ModelConfig& m, int64_t tokenizer_vocab, bool* strict);

// Builds the model on `device`, initialised from seed or loaded from model.pretrained: the
// parameters are made without storage, then given it on the device, where the initial values
// and the checkpoint's tensors are written directly (no full copy of the model on the host).
// source_file (the YAML's name) only improves error messages. deferred: parameters left
// without storage (core/param_init.h), neither initialised nor loaded: FSDP materialises its shards.
std::shared_ptr<models::CausalLM> build_model(const config::ModelConfig& m, int64_t tokenizer_vocab, uint64_t seed,
                                              const std::string* source_file = nullptr, bool deferred = false,
                                              at::Device device = at::kCPU);

// A batch as the model sees it: its position ids, and a per-sample attention mask for packed rows.
models::MultimodalInputs batch_inputs(const data::Batch& batch);
// The same for a batch on a CUDA device (host: the loader's copy): packed rows as cu_seqlens for
// the varlen kernel instead of a mask.
models::MultimodalInputs device_inputs(const data::Batch& host, const data::Batch& device_batch);
// Logits of one batch (forward_multimodal of batch_inputs).
at::Tensor forward_batch(models::CausalLM& model, const data::Batch& batch);

// Mean per-token loss over the first max_batches validation batches (all when 0), in order, on
// the model's device (bf16: autocast for that device).
// With dp and par, each data-parallel rank runs its share of the batches and the sums are added
// over the ranks (FSDP: every rank runs them all).
double evaluate(models::CausalLM& model, const data::ValPass& val, int64_t batch_size, int64_t max_batches, bool bf16,
                DataParallelModel* dp = nullptr, const TrainParallel* par = nullptr);

// Greedy decoding of max_new_tokens after the prompt ids, stopping at eos, on the model's device.
std::vector<int64_t> greedy_generate(models::CausalLM& model, std::vector<int64_t> ids, int64_t max_new_tokens,
                                     int64_t eos_id, int64_t max_context);

}  // namespace mm::training
