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
//
// Qwen2.5-VL (HF Qwen2_5_VisionTransformerPretrainedModel) keeps the names and changes:
//   norm1 / norm2 / merger.ln_q are RMSNorms (weight only); the MLP is SwiGLU with biases
//   (blocks.N.mlp.{gate,up,down}_proj.{weight,bias}); most blocks attend only inside windows of
//   window_size pixels (window_size / patch / merge merged units per side, edge windows smaller),
//   the blocks in fullatt_block_indexes over the whole frame. The patches are reordered so that
//   each window is contiguous (qwen2_5_vl_window_index) before the blocks, and the merged
//   features are put back into the processor's order after the merger.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/hf_config.h"
#include "mindspeed_mm/models/common/linear.h"
#include "mindspeed_mm/models/common/mlp.h"
#include "mindspeed_mm/models/common/norm.h"

namespace mm::models {

// HF vision_config fields (Qwen2VLVisionConfig names and defaults; the official config.json
// spells in_channels "in_chans", which is read too). With qwen2_5 the JSON is a
// Qwen2_5_VLVisionConfig: there "hidden_size" is the tower width (embed_dim here) and
// "out_hidden_size" the merger's output (hidden_size here).
struct Qwen2VLVisionConfig {
  int64_t depth = 32, embed_dim = 1280, hidden_size = 3584, num_heads = 16;
  double mlp_ratio = 4.0;
  std::string hidden_act = "quick_gelu";
  int64_t in_channels = 3, patch_size = 14, spatial_merge_size = 2, temporal_patch_size = 2;
  // Qwen2.5-VL only.
  bool qwen2_5 = false;
  int64_t intermediate_size = 3420;  // SwiGLU width
  int64_t window_size = 112;         // window side in pixels
  std::vector<int64_t> fullatt_block_indexes = {7, 15, 23, 31};
  int64_t tokens_per_second = 4;     // M-RoPE temporal scaling of videos

  int64_t head_dim() const { return embed_dim / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t mlp_hidden() const {
    return qwen2_5 ? intermediate_size : static_cast<int64_t>(static_cast<double>(embed_dim) * mlp_ratio);
  }
  // Merged units per window side (window_size / patch_size / spatial_merge_size).
  int64_t window_units() const { return window_size / patch_size / spatial_merge_size; }
  // The fields in config.json's names (models/common/hf_config.h); qwen2_5 picks the spelling.
  template <class IO>
  void io(IO& io) {
    io("depth", depth, config::gt(0));
    io("num_heads", num_heads, config::gt(0));
    io("in_chans", in_channels, config::gt(0));
    io("patch_size", patch_size, config::gt(0));
    io("spatial_merge_size", spatial_merge_size, config::gt(0));
    io("temporal_patch_size", temporal_patch_size, config::gt(0));
    io("hidden_act", hidden_act);
    if (qwen2_5) {
      io("hidden_size", embed_dim, config::gt(0));
      io("out_hidden_size", hidden_size, config::gt(0));
      io("intermediate_size", intermediate_size, config::gt(0));
      io("window_size", window_size, config::gt(0));
      io("fullatt_block_indexes", fullatt_block_indexes, config::ge(0));
      io("tokens_per_second", tokens_per_second, config::gt(0));
    } else {
      io("embed_dim", embed_dim, config::gt(0));
      io("hidden_size", hidden_size, config::gt(0));
      io.integral_number("mlp_ratio", mlp_ratio, config::gt(0));
    }
  }
  // ConfigError naming the key and source for wrong types or inconsistent sizes.
  static Qwen2VLVisionConfig from_json(const nlohmann::json& j, const std::string& source, bool qwen2_5 = false);
  nlohmann::json to_json() const;
  int64_t num_parameters() const;  // closed form, checked against the module tree in tests
  // Training FLOPs (forward + backward, 6 per matmul weight and patch; attention 12 * embed *
  // keys per query and block, over each frame or window) of the tower on these grids [n, 3].
  double training_flops(const at::Tensor& grid_thw) const;
  // The PatchMerger's share of it (its two Linear layers over the merged units).
  double merger_training_flops(const at::Tensor& grid_thw) const;
};

class Qwen2VLVisionAttention : public mm::nn::Module, public HeadSplittable, public AttentionCoreHost {
 public:
  Qwen2VLVisionAttention(const Qwen2VLVisionConfig& c, at::ScalarType dtype);
  // x [N, embed]; ctx.cos/sin [1, 1, N, head_dim]; ctx.cu_seqlens: the segments attention stays in
  // (else ctx.attn_mask, bool [1, 1, N, N]). With an attention_core (context parallelism) x is
  // this rank's share of the patches and the core attends over all of them.
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) const;
  std::string type_name() const override { return "Qwen2VLVisionAttention"; }
  std::pair<int64_t, int64_t> heads() const override { return {num_heads, num_heads}; }
  void keep_heads(int64_t q_heads, int64_t) override { num_heads = q_heads; }

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

// Qwen2.5-VL's block: RMSNorms and a SwiGLU MLP with biases around the same attention.
class Qwen2_5_VLVisionBlock : public mm::nn::Block {
 public:
  Qwen2_5_VLVisionBlock(const Qwen2VLVisionConfig& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) override;
  std::string type_name() const override { return "Qwen2_5_VLVisionBlock"; }

  std::shared_ptr<RMSNorm> norm1, norm2;
  std::shared_ptr<Qwen2VLVisionAttention> attn;
  std::shared_ptr<SwiGLUMLP> mlp;
};

class Qwen2VLPatchMerger : public mm::nn::Module {
 public:
  // rms_norm: Qwen2.5-VL's ln_q (weight only) instead of a LayerNorm.
  Qwen2VLPatchMerger(int64_t out_dim, int64_t context_dim, int64_t merge_size, at::ScalarType dtype,
                     bool rms_norm = false);
  at::Tensor forward(const at::Tensor& x) const;  // [N, context] -> [N / merge^2, out_dim]
  std::string type_name() const override { return "Qwen2VLPatchMerger"; }

  int64_t window_dim;
  std::shared_ptr<LayerNorm> ln_q;      // Qwen2-VL
  std::shared_ptr<RMSNorm> ln_q_rms;    // Qwen2.5-VL (also registered as ln_q)
  std::shared_ptr<Linear> fc_in, fc_out;  // registered as mlp.0 and mlp.2
};

// Qwen2.5-VL's window order (transformers' get_window_index). Each frame's merged units
// (row-major over its (h / merge) x (w / merge) grid) are split into windows of `units` x
// `units` from the top-left, the last row and column of windows smaller when the sides do not
// divide; `index` lists the units window by window (row-major inside a window), frames and
// images in order, so index[k] is the processor-order unit at window-order position k.
// cu_seqlens: 0 and the cumulative patch counts (units x merge^2) at each window's end.
struct WindowIndex {
  std::vector<int64_t> index;
  std::vector<int64_t> cu_seqlens;
};
WindowIndex qwen2_5_vl_window_index(const at::Tensor& grid_thw, int64_t units, int64_t spatial_merge_size);

// The order the tower's blocks take the patches in: for Qwen2.5-VL the window order (int64 [N],
// the processor-order patch at each position), for Qwen2-VL undefined (the processor's).
at::Tensor qwen2vl_patch_block_order(const Qwen2VLVisionConfig& c, const at::Tensor& grid_thw);

class Qwen2VisionTransformer : public mm::nn::Module {
 public:
  Qwen2VisionTransformer(const Qwen2VLVisionConfig& c, at::ScalarType dtype = at::kFloat);
  // pixel_values [N, patch_dim], grid_thw int64 [n, 3] with sum(t * h * w) = N ->
  // [N / merge^2, hidden_size]. mm::Error for shapes that disagree. cut: pixel_values holds a
  // context-parallel rank's rows in block order (qwen2vl_patch_block_order), which the blocks'
  // plan gathers (training/context_parallel.h): the count is not N and no reorder is made.
  at::Tensor forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw, bool cut = false);
  // The same in pieces (a pipeline stage runs some blocks): prepare checks the shapes and builds
  // the blocks' context (rotary tables, segments, Qwen2.5-VL's window order) and, when embed, the
  // patch embeddings; run_blocks runs blocks [begin, end); finish merges (and restores the order).
  struct Run {
    at::Tensor h;  // patch embeddings [N, embed_dim] (prepare with embed)
    mm::nn::ForwardContext ctx;
    at::Tensor frame_cu, window_cu, unit_order;
  };
  Run prepare(const at::Tensor& pixel_values, const at::Tensor& grid_thw, bool embed = true, bool cut = false) const;
  at::Tensor run_blocks(Run& run, at::Tensor h, int64_t begin, int64_t end);
  at::Tensor finish(const Run& run, const at::Tensor& h) const;
  // The 2-D rotary angles [N, head_dim / 2] (row angles, then column angles) of the patches.
  at::Tensor rotary_angles(const at::Tensor& grid_thw) const;
  std::string type_name() const override { return "Qwen2VisionTransformer"; }

  Qwen2VLVisionConfig config;
  at::Tensor patch_embed_weight;  // patch_embed.proj.weight
  std::vector<std::shared_ptr<mm::nn::Block>> blocks;  // Qwen2VLVisionBlock or Qwen2_5_VLVisionBlock
  std::shared_ptr<Qwen2VLPatchMerger> merger;
};

}  // namespace mm::models
