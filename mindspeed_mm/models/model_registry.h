// Causal language models by id ("qwen2"), built from an HF config.json object. Each model family
// registers itself from its own .cpp with a static mm::Registrar, so adding a model touches no
// shared file.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/core/registry.h"

namespace mm::models {

// A batch as a model sees it: the token inputs of forward() plus what a vision-language model
// also needs. Vision fields are undefined when a batch has no images or videos.
struct MultimodalInputs {
  at::Tensor input_ids, position_ids, attn_mask;  // as forward()
  at::Tensor attention_mask;                      // int64 [B, S], 1 = real token (undefined: all)
  at::Tensor segment_ids;                         // packed rows: the sample of each token, -1 = padding
  // Packed rows without a mask (instead of attn_mask): int32 boundaries over the flattened B*S
  // tokens, every token in exactly one segment and no segment across rows (packed_cu_seqlens),
  // and the longest segment. On CUDA they go to the varlen flash kernel.
  at::Tensor cu_seqlens;
  int64_t max_seqlen = 0;
  at::Tensor pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw;
  std::vector<double> video_second_per_grid;
  // Incremental decoding (mindspeed_mm/models/common/kv_cache.h): the keys and values of the
  // tokens before input_ids; input_ids are appended. Positions continue after the cache.
  mm::nn::KVCache* kv_cache = nullptr;
};

// What training, checkpointing and FLOPs accounting need from a decoder-only LM.
class CausalLM : public mm::nn::Module {
 public:
  // input_ids [B, S] int64 -> logits [B, S, vocab]. position_ids [B, S]; undefined = 0..S-1.
  // attn_mask (optional) bool [B, 1, S, S], true = may attend, combined with the causal mask:
  // packed rows pass segment_attention_mask() so each sample sees only itself.
  virtual at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& position_ids = {},
                             const at::Tensor& attn_mask = {}) = 0;
  // Deterministic given the seed, independent of device and dtype.
  virtual void init_weights(uint64_t seed) = 0;
  // The HF config.json that reproduces this model.
  virtual nlohmann::json hf_config() const = 0;
  // Training FLOPs (forward + backward) per text token at sequence length seq_len.
  virtual double flops_per_token(int64_t seq_len) const = 0;
  // Training FLOPs of one batch: its real (non-padding) tokens at flops_per_token(S), plus what a
  // vision tower spends on the batch's images and videos.
  virtual double training_flops(const MultimodalInputs& in) const;
  // The repeated blocks (decoder layers) in order: the units plans wrap and shard.
  virtual std::vector<std::shared_ptr<mm::nn::Block>> blocks() = 0;
  virtual int64_t vocab_size() const = 0;
  // A checkpoint's parameter name in this model's tree (for HF naming schemes other than the
  // one the tree uses); identity by default.
  virtual std::string parameter_name(const std::string& checkpoint_name) const { return checkpoint_name; }
  // Whether forward_multimodal uses the vision fields (a text model ignores them).
  virtual bool has_vision() const { return false; }
  // Logits of a (possibly multimodal) batch, using in.kv_cache when set; text models use the
  // token fields only.
  virtual at::Tensor forward_multimodal(const MultimodalInputs& in) = 0;
};

// strict: true for configs written in our YAML (unknown keys are errors), false for HF
// config.json files (unknown keys such as architectures are ignored). source names where the
// config came from in error messages ("model.config in tiny.yaml", "/models/qwen2/config.json").
using ModelFactory =
    std::function<std::shared_ptr<CausalLM>(const nlohmann::json& hf_config, const std::string& source, bool strict)>;

mm::Registry<ModelFactory>& model_registry();

// Parameter counts by part ("vision tower", "projector", "language model") from the config
// alone, without building the model: how `mm flops` sizes full-size models on any machine.
struct ModelSize {
  std::vector<std::pair<std::string, int64_t>> parts;
  // Training FLOPs per text token at a sequence length; of one image of (height, width) pixels
  // after the processor's resize (null for text models).
  std::function<double(int64_t seq_len)> flops_per_token;
  std::function<double(int64_t height, int64_t width)> image_flops;
  int64_t total() const;
};
using ModelSizeFn = std::function<ModelSize(const nlohmann::json& hf_config, const std::string& source, bool strict)>;
mm::Registry<ModelSizeFn>& model_size_registry();

// Real tokens of a batch: attention_mask ones, else non-negative segment ids, else B * S.
int64_t real_tokens(const MultimodalInputs& in);

}  // namespace mm::models
