// LLaVA (HF LlavaForConditionalGeneration, registry id `llava`): a CLIP ViT, a 2-layer MLP
// projector and a LLaMA (or Qwen2) decoder. Parameter names as in the llava-hf checkpoints:
//   vision_tower.vision_model.embeddings.class_embedding            [E]
//   vision_tower.vision_model.embeddings.patch_embedding.weight     Conv2d [E, 3, P, P], no bias
//   vision_tower.vision_model.embeddings.position_embedding.weight  [(S / P)^2 + 1, E]
//   vision_tower.vision_model.pre_layrnorm.{weight,bias}            (sic, as in CLIP)
//   vision_tower.vision_model.encoder.layers.N.{layer_norm1,layer_norm2}.{weight,bias}
//   vision_tower.vision_model.encoder.layers.N.self_attn.{q,k,v,out}_proj.{weight,bias}
//   vision_tower.vision_model.encoder.layers.N.mlp.{fc1,fc2}.{weight,bias}
//   vision_tower.vision_model.post_layernorm.{weight,bias}          (in checkpoints, unused here)
//   multi_modal_projector.linear_{1,2}.{weight,bias}
//   language_model.model.* / language_model.lm_head.weight          the decoder (qwen2.h)
// transformers >= 4.52 names them model.vision_tower.*, model.multi_modal_projector.*,
// model.language_model.* and lm_head.*: read too.
//
// Forward: the image's patches (the fixed processor's [n, 3, S, S] planes) through the ViT;
// the hidden states after layer vision_feature_layer (negative: from the end; -2 = the
// second-to-last layer, as LLaVA-1.5) with the class token dropped ("default") or kept
// ("full"); the projector (Linear, act, Linear) maps them to the decoder's width and they
// replace, in order, the image_token_index tokens of the prompt.
#pragma once

#include <memory>
#include <string>

#include "mindspeed_mm/models/qwen2/qwen2.h"

namespace mm::models {

// HF CLIPVisionConfig fields.
struct ClipVisionConfig {
  int64_t hidden_size = 768, intermediate_size = 3072, num_hidden_layers = 12, num_attention_heads = 12;
  int64_t num_channels = 3, image_size = 224, patch_size = 32;
  std::string hidden_act = "quick_gelu";
  double layer_norm_eps = 1e-5;
  int64_t projection_dim = 512;  // kept for the config round trip (the CLIP text/vision projection is not used)

  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  template <class IO>
  void io(IO& io) {
    io("hidden_size", hidden_size, config::gt(0));
    io("intermediate_size", intermediate_size, config::gt(0));
    io("num_hidden_layers", num_hidden_layers, config::gt(0));
    io("num_attention_heads", num_attention_heads, config::gt(0));
    io("num_channels", num_channels, config::gt(0));
    io("image_size", image_size, config::gt(0));
    io("patch_size", patch_size, config::gt(0));
    io("projection_dim", projection_dim, config::gt(0));
    io("hidden_act", hidden_act);
    io("layer_norm_eps", layer_norm_eps, config::gt(0));
  }
  static ClipVisionConfig from_json(const nlohmann::json& j, const std::string& source);
  nlohmann::json to_json() const;
};

struct LlavaConfig {
  Qwen2Config text;
  std::string text_model_type = "llama";  // llama | qwen2
  ClipVisionConfig vision;
  int64_t image_token_index = 32000;
  std::string projector_hidden_act = "gelu";
  int64_t vision_feature_layer = -2;
  std::string vision_feature_select_strategy = "default";  // default (drop CLS) | full
  bool multimodal_projector_bias = true;

  // The top-level fields (text_config and vision_config are read by from_json).
  template <class IO>
  void io(IO& io) {
    io("image_token_index", image_token_index, config::gt(0));
    io("projector_hidden_act", projector_hidden_act);
    io("vision_feature_select_strategy", vision_feature_select_strategy, config::one_of({"default", "full"}));
    io("multimodal_projector_bias", multimodal_projector_bias);
    io("vision_feature_layer", vision_feature_layer);
  }
  // Image tokens per image: the patches, plus the class token for "full".
  int64_t image_tokens() const;
  // Vision layers that run: up to the selected one.
  int64_t vision_layers_used() const;
  static LlavaConfig from_json(const nlohmann::json& j, const std::string& source, bool strict);
  nlohmann::json to_json() const;
  int64_t num_parameters() const;  // closed form, as the module tree counts
  int64_t vision_parameters() const;     // vision_tower.*
  int64_t projector_parameters() const;  // multi_modal_projector.*
  // Training FLOPs of the tower (up to the feature layer) and projector on `images` images.
  double vision_training_flops(int64_t images) const;  // tower and projector
  double projector_training_flops(int64_t images) const;
};

class ClipAttention : public mm::nn::Module {
 public:
  ClipAttention(const ClipVisionConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x) const;  // [n, T, E], full attention within each image
  std::string type_name() const override { return "CLIPAttention"; }

  int64_t num_heads, head_dim;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
};

class ClipEncoderLayer : public mm::nn::Block {
 public:
  ClipEncoderLayer(const ClipVisionConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) override;
  std::string type_name() const override { return "CLIPEncoderLayer"; }

  std::shared_ptr<LayerNorm> layer_norm1, layer_norm2;
  std::shared_ptr<ClipAttention> self_attn;
  std::shared_ptr<FcMLP> mlp;
};

// The `vision_model` subtree of CLIPVisionModel.
class ClipVisionTransformer : public mm::nn::Module {
 public:
  ClipVisionTransformer(const ClipVisionConfig& c, at::ScalarType dtype);
  // pixel_values [n, C, S, S] -> hidden states after `layers` encoder layers [n, 1 + patches, E]
  // (0: the embeddings after pre_layrnorm).
  at::Tensor forward(const at::Tensor& pixel_values, int64_t layers);
  std::string type_name() const override { return "CLIPVisionTransformer"; }

  ClipVisionConfig config;
  at::Tensor class_embedding, patch_embedding_weight, position_embedding_weight;
  std::shared_ptr<LayerNorm> pre_layrnorm, post_layernorm;
  std::vector<std::shared_ptr<ClipEncoderLayer>> layers;
};

class LlavaForConditionalGeneration : public CausalLM {
 public:
  explicit LlavaForConditionalGeneration(const LlavaConfig& c, at::ScalarType dtype = at::kFloat);

  using CausalLM::forward;  // forward(const data::Batch&) too
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& position_ids = {},
                     const at::Tensor& attn_mask = {}) override;
  at::Tensor forward_multimodal(const MultimodalInputs& in) override;
  at::Tensor forward_hidden(const MultimodalInputs& in) override;
  at::Tensor head_weight() const override { return language_model->head_weight(); }
  // pixel_values [n, C, S, S] -> projected features [n, image_tokens, text hidden].
  at::Tensor image_features(const at::Tensor& pixel_values);
  void init_weights(uint64_t seed) override;
  nlohmann::json hf_config() const override { return config.to_json(); }
  double flops_per_token(int64_t seq_len) const override { return config.text.flops_per_token(seq_len); }
  double training_flops(const MultimodalInputs& in) const override;
  std::vector<std::pair<std::string, double>> training_flops_by_part(const data::Batch& host) const override;
  using CausalLM::training_flops;
  // llava_memory.cpp: the CLIP tower's and the projector's saved tensors, then the language model's.
  std::optional<ActivationEstimate> estimate_activations(const data::Batch& host, const MemoryQuery& q) const override;
  std::vector<std::shared_ptr<mm::nn::Block>> blocks() override { return language_model->blocks(); }
  PlanTable plans() const override {
    return {{"vision_tower.vision_model.encoder.layers.{*}", "language_model.model.layers.{*}"}};
  }
  std::vector<ModelPart> parts() const override {
    return {{"vision_tower", "vision_tower."}, {"projector", "multi_modal_projector."}, {"language_model", "language_model."}};
  }
  int64_t vocab_size() const override { return config.text.vocab_size; }
  bool has_vision() const override { return true; }
  std::string parameter_name(const std::string& checkpoint_name) const override;
  std::string hf_module_path(const std::string& name) const override;
  std::string type_name() const override { return "LlavaForConditionalGeneration"; }

  LlavaConfig config;
  std::shared_ptr<ClipVisionTransformer> vision_model;  // under vision_tower.vision_model
  std::shared_ptr<Linear> linear_1, linear_2;           // under multi_modal_projector
  Activation projector_act;
  std::shared_ptr<Qwen2ForCausalLM> language_model;
};

}  // namespace mm::models
