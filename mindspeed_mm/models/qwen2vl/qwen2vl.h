// Qwen2-VL (HF Qwen2VLForConditionalGeneration) and Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration,
// registry id qwen2_5_vl: the same decoder, the vision tower's Qwen2.5 variant and tokens_per_second
// temporal scaling of video positions): the Qwen2 decoder with M-RoPE, fed by the vision tower. Parameter names as in the original checkpoints:
//   visual.*                                    the vision tower (vision.h)
//   model.embed_tokens / model.layers.N.* / model.norm / lm_head   the language model (qwen2.h)
// Forward: token embeddings; the embedding of every <|image_pad|> / <|video_pad|> token is
// replaced, in order, by the vision tower's merged features of the batch's images / videos; the
// M-RoPE (t, h, w) positions of get_rope_index (per packed sample when rows are packed) pick the
// rotary angles of each mrope_section; then the decoder and the head.
#pragma once

#include <memory>
#include <vector>

#include "mindspeed_mm/models/qwen2/qwen2.h"
#include "mindspeed_mm/models/qwen2vl/rope_index.h"
#include "mindspeed_mm/models/qwen2vl/vision.h"

namespace mm::models {

// config.json of a Qwen2-VL model: the Qwen2 text fields at the top level (or, as newer
// transformers write them, in text_config), plus vision_config, the vision token ids and
// rope_scaling {"type": "mrope", "mrope_section": [t, h, w]}. qwen2_5: a Qwen2.5-VL config
// (model_type qwen2_5_vl; its vision_config as Qwen2VLVisionConfig describes).
struct Qwen2VLConfig {
  bool qwen2_5 = false;
  Qwen2Config text;
  Qwen2VLVisionConfig vision;
  RopeIndexConfig rope_index;  // token ids and spatial merge size for get_rope_index
  int64_t vision_end_token_id = 151653;
  std::vector<int64_t> mrope_section = {16, 24, 24};

  static Qwen2VLConfig from_json(const nlohmann::json& j, const std::string& source, bool strict, bool qwen2_5 = false);
  nlohmann::json to_json() const;
};

// The (t, h, w) positions [3, B, S] of a batch: get_rope_index over each row, or over each
// packed sample (positions restart per sample, as when it runs alone).
at::Tensor qwen2vl_mrope_positions(const RopeIndexConfig& rc, const MultimodalInputs& in);

class Qwen2VLForConditionalGeneration : public Qwen2ForCausalLM {
 public:
  explicit Qwen2VLForConditionalGeneration(const Qwen2VLConfig& c, at::ScalarType dtype = at::kFloat);

  at::Tensor forward_multimodal(const MultimodalInputs& in) override;
  at::Tensor forward_hidden(const MultimodalInputs& in) override;
  bool has_vision() const override { return true; }
  // CausalLM's, and a context-parallel rank's positions and feature rows (context_parallel_prepare).
  std::vector<std::string> optional_fields() const override;
  std::vector<int64_t> image_placeholder(int64_t features) const override;
  // transformers >= 4.52 saves model.visual.* and model.language_model.*: read as visual.* and model.*.
  std::string parameter_name(const std::string& checkpoint_name) const override;
  std::string hf_module_path(const std::string& name) const override;
  // The language model as in Qwen2ForCausalLM; the vision tower N(0, initializer_range) for
  // matrices and the patch embedding, zero biases, unit LayerNorms.
  void init_weights(uint64_t seed) override;
  nlohmann::json hf_config() const override { return vl_config.to_json(); }
  // The decoder's FLOPs on the real tokens plus the vision tower's on the batch's grids.
  double training_flops(const MultimodalInputs& in) const override;
  // vision_tower (patch embedding and blocks), projector (the PatchMerger), language_model.
  std::vector<std::pair<std::string, double>> training_flops_by_part(const data::Batch& host) const override;
  using CausalLM::training_flops;
  // The language model's plans (qwen2.h) plus the vision tower's and the projector's.
  PlanTable plans() const override;
  // Pipeline pieces: "vision" (the patch embedding before its blocks, the merger after them;
  // carry image_hidden / video_hidden, then image_features / video_features), then "text" as
  // in Qwen2 with the features placed into its embeddings.
  std::vector<PipelineSubmodule> pipeline_submodules() const override;
  void pipeline_forward(size_t submodule, int64_t begin, int64_t end, Outputs& carry, const data::Batch& batch) override;
  // qwen2vl_memory.cpp: the vision tower's and the merger's saved tensors, then Qwen2's.
  std::optional<ActivationEstimate> estimate_activations(const data::Batch& host, const MemoryQuery& q) const override;
  std::vector<ModelPart> parts() const override {
    return {{"vision_tower", "visual."}, {"projector", "visual.merger."}, {"language_model", ""}};
  }
  std::string type_name() const override {
    return vl_config.qwen2_5 ? "Qwen2_5_VLForConditionalGeneration" : "Qwen2VLForConditionalGeneration";
  }

  // The (t, h, w) positions [3, B, S] of a batch: in.mrope_position_ids when given (a cp rank's
  // share), else qwen2vl_mrope_positions.
  at::Tensor mrope_positions(const MultimodalInputs& in) const;

  Qwen2VLConfig vl_config;

 protected:
  at::Tensor pipeline_embeddings(const MultimodalInputs& in, const Outputs& carry) override;
  std::pair<at::Tensor, at::Tensor> pipeline_rope(const MultimodalInputs& in, at::ScalarType dtype,
                                                  at::Device device) const override;

 public:
  std::shared_ptr<Qwen2VisionTransformer> visual;
};

}  // namespace mm::models
