// Qwen2-VL's vision tower (HF Qwen2VisionTransformerPretrainedModel), parameter names as in the
// checkpoints under `visual.`:
//   patch_embed.proj.weight                      Conv3d [embed, 3, temporal, patch, patch], no bias
//   blocks.N.norm1.{weight,bias}  blocks.N.attn.qkv.{weight,bias}  blocks.N.attn.proj.{weight,bias}
//   blocks.N.norm2.{weight,bias}  blocks.N.mlp.fc1.{weight,bias}   blocks.N.mlp.fc2.{weight,bias}
//   merger.ln_q.{weight,bias}  merger.mlp.0.{weight,bias}  merger.mlp.2.{weight,bias}
//
// Input: the image processor's flattened patches [N, 3 * temporal * patch^2] in merge-window
// order and the (t, h, w) grid of each image or video. The patch embedding is a Conv3d whose
// kernel equals its stride, i.e. one matmul per patch. Each block is pre-norm attention + MLP;
// the attention of a patch sees only the patches of its own frame (cu_seqlens over t * h * w:
// one segment per temporal patch of each image), with 2-D rotary embeddings: the first half of
// each head's rotary angles come from the patch row, the second half from its column. The
// PatchMerger LayerNorms each patch, concatenates the merge_size^2 patches of a window and maps
// them through Linear-GELU-Linear to the language model's width: [N / merge^2, hidden_size].
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/models/common/linear.h"
#include "mindspeed_mm/models/common/mlp.h"
#include "mindspeed_mm/models/common/norm.h"

namespace mm::models {

// HF vision_config fields (Qwen2VLVisionConfig names and defaults; the official config.json
// spells in_channels "in_chans", which is read too).
struct Qwen2VLVisionConfig {
  int64_t depth = 32, embed_dim = 1280, hidden_size = 3584, num_heads = 16;
  double mlp_ratio = 4.0;
  std::string hidden_act = "quick_gelu";
  int64_t in_channels = 3, patch_size = 14, spatial_merge_size = 2, temporal_patch_size = 2;

  int64_t head_dim() const { return embed_dim / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t mlp_hidden() const { return static_cast<int64_t>(static_cast<double>(embed_dim) * mlp_ratio); }
  // ConfigError naming the key and source for wrong types or inconsistent sizes.
  static Qwen2VLVisionConfig from_json(const nlohmann::json& j, const std::string& source);
  nlohmann::json to_json() const;
  int64_t num_parameters() const;  // closed form, checked against the module tree in tests
};

class Qwen2VLVisionAttention : public mm::nn::Module {
 public:
  Qwen2VLVisionAttention(const Qwen2VLVisionConfig& c, at::ScalarType dtype);
  // x [N, embed]; ctx.cos/sin [1, 1, N, head_dim]; ctx.attn_mask bool [1, 1, N, N].
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) const;
  std::string type_name() const override { return "Qwen2VLVisionAttention"; }

  int64_t num_heads, head_dim;
  std::shared_ptr<Linear> qkv, proj;
};

class Qwen2VLVisionBlock : public mm::nn::Block {
 public:
  Qwen2VLVisionBlock(const Qwen2VLVisionConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) override;
  std::string type_name() const override { return "Qwen2VLVisionBlock"; }

  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Qwen2VLVisionAttention> attn;
  std::shared_ptr<FcMLP> mlp;
};

class Qwen2VLPatchMerger : public mm::nn::Module {
 public:
  Qwen2VLPatchMerger(int64_t out_dim, int64_t context_dim, int64_t merge_size, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x) const;  // [N, context] -> [N / merge^2, out_dim]
  std::string type_name() const override { return "Qwen2VLPatchMerger"; }

  int64_t window_dim;
  std::shared_ptr<LayerNorm> ln_q;
  std::shared_ptr<Linear> fc_in, fc_out;  // registered as mlp.0 and mlp.2
};

class Qwen2VisionTransformer : public mm::nn::Module {
 public:
  Qwen2VisionTransformer(const Qwen2VLVisionConfig& c, at::ScalarType dtype = at::kFloat);
  // pixel_values [N, patch_dim], grid_thw int64 [n, 3] with sum(t * h * w) = N ->
  // [N / merge^2, hidden_size]. mm::Error for shapes that disagree.
  at::Tensor forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw);
  // The 2-D rotary angles [N, head_dim / 2] (row angles, then column angles) of the patches.
  at::Tensor rotary_angles(const at::Tensor& grid_thw) const;
  std::string type_name() const override { return "Qwen2VisionTransformer"; }

  Qwen2VLVisionConfig config;
  at::Tensor patch_embed_weight;  // patch_embed.proj.weight
  std::vector<std::shared_ptr<Qwen2VLVisionBlock>> blocks;
  std::shared_ptr<Qwen2VLPatchMerger> merger;
};

}  // namespace mm::models
