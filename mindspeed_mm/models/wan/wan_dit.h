// Wan2.1's diffusion transformer (diffusers' WanTransformer3DModel), parameter names as in a
// diffusers `transformer/` directory:
//   patch_embedding.{weight,bias}                      Conv3d [dim, in, pt, ph, pw], kernel = stride
//   condition_embedder.time_embedder.linear_{1,2}.*    sinusoid(t) -> Linear-SiLU-Linear = temb
//   condition_embedder.time_proj.*                     Linear(SiLU(temb)) -> [6, dim] per sample
//   condition_embedder.text_embedder.linear_{1,2}.*    text features -> Linear-GELU(tanh)-Linear
//   blocks.N.attn1.{to_q,to_k,to_v,to_out.0}.*  blocks.N.attn1.norm_{q,k}.weight   self-attention
//   blocks.N.attn2.(the same)                                                       cross-attention
//   blocks.N.norm2.{weight,bias}   (cross_attn_norm)   blocks.N.ffn.net.{0.proj,2}.*
//   blocks.N.scale_shift_table     [1, 6, dim]
//   scale_shift_table [1, 2, dim]  proj_out.{weight,bias}
// The original Wan checkpoints' names (blocks.N.self_attn.q, ffn.0, modulation, head.head, ...)
// load too (parameter_name), and to_original_name() writes them.
//
// The computation, per sample: x [C, F, H, W] is cut into (pt, ph, pw) patches, F/pt * H/ph * W/pw
// tokens of width dim. Each block: modulated LayerNorm (shift, scale from the block's table +
// the timestep projection) -> self-attention with RMSNorm on q and k across heads and 3-D
// rotary embeddings (head_dim split into frame / height / width parts, d - 4(d/6), 2(d/6),
// 2(d/6), pairs (2i, 2i+1) rotated) -> gated residual; LayerNorm (affine) -> cross-attention to
// the projected text -> residual; modulated LayerNorm -> GELU(tanh) MLP -> gated residual.
// The head: LayerNorm modulated by temb and its own table, a Linear to C * pt * ph * pw, and the
// patches put back. Norms and modulation run in fp32 whatever the weights' dtype, as diffusers.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/hf_config.h"
#include "mindspeed_mm/models/common/linear.h"
#include "mindspeed_mm/models/common/norm.h"
#include "mindspeed_mm/models/model.h"

namespace mm::models {

// The prediction (shaped as the batch's noisy_latents, data/batch.h) under Outputs' name.
inline constexpr std::string_view kPrediction = "prediction";
using data::kNoisyLatents;
using data::kPromptEmbeds;
using data::kTimesteps;

// diffusers' config.json for WanTransformer3DModel (names and defaults as there: the 14B model).
struct WanDiTConfig {
  std::vector<int64_t> patch_size = {1, 2, 2};
  int64_t num_attention_heads = 40, attention_head_dim = 128;
  int64_t in_channels = 16, out_channels = 16;
  int64_t text_dim = 4096, freq_dim = 256, ffn_dim = 13824, num_layers = 40;
  bool cross_attn_norm = true;
  std::string qk_norm = "rms_norm_across_heads";
  double eps = 1e-6;
  int64_t rope_max_seq_len = 1024;

  int64_t dim() const { return num_attention_heads * attention_head_dim; }
  int64_t patch_volume() const { return patch_size[0] * patch_size[1] * patch_size[2]; }
  // The head_dim's rotary parts: frame, height, width (Wan's d - 4(d/6), 2(d/6), 2(d/6)).
  std::array<int64_t, 3> rope_dims() const;

  template <class IO>
  void io(IO& io) {
    io("patch_size", patch_size, config::gt(0));
    io("num_attention_heads", num_attention_heads, config::gt(0));
    io("attention_head_dim", attention_head_dim, config::gt(0));
    io("in_channels", in_channels, config::gt(0));
    io("out_channels", out_channels, config::gt(0));
    io("text_dim", text_dim, config::gt(0));
    io("freq_dim", freq_dim, config::gt(0));
    io("ffn_dim", ffn_dim, config::gt(0));
    io("num_layers", num_layers, config::gt(0));
    io("cross_attn_norm", cross_attn_norm);
    io("qk_norm", qk_norm, config::one_of({"rms_norm_across_heads"}));
    io("eps", eps, config::gt(0));
    io("rope_max_seq_len", rope_max_seq_len, config::gt(0));
  }
  // ConfigError naming the key and source: wrong types, a patch_size that is not 3 numbers,
  // image conditioning (image_dim, added_kv_proj_dim: image-to-video is a later model).
  static WanDiTConfig from_json(const nlohmann::json& j, const std::string& source, bool strict);
  nlohmann::json to_json() const;  // diffusers' config.json, _class_name WanTransformer3DModel
  int64_t num_parameters() const;  // closed form, checked against the module tree in tests
  // Training FLOPs (forward + backward) of one sample of `tokens` latent tokens and `text_len`
  // text tokens: 6 per weight and token for the matmuls, 12 * dim per attended key and query.
  double training_flops(int64_t tokens, int64_t text_len) const;
};

class WanAttention : public mm::nn::Module, public HeadSplittable, public AttentionCoreHost {
 public:
  WanAttention(const WanDiTConfig& c, at::ScalarType dtype);
  // Tensor parallelism (the plan's "heads"): this rank runs `q_heads` of the heads.
  std::pair<int64_t, int64_t> heads() const override { return {num_heads, num_heads}; }
  void keep_heads(int64_t q_heads, int64_t) override { num_heads = q_heads; }
  // x [B, S, dim]; context [B, L, dim] for cross-attention (undefined: self-attention with the
  // rotary tables cos, sin [S, head_dim / 2]).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& cos, const at::Tensor& sin) const;
  std::string type_name() const override { return "WanAttention"; }

  int64_t num_heads, head_dim;
  std::shared_ptr<Linear> to_q, to_k, to_v, to_out;
  std::shared_ptr<RMSNorm> norm_q, norm_k;
};

class WanTransformerBlock : public mm::nn::Block {
 public:
  WanTransformerBlock(const WanDiTConfig& c, at::ScalarType dtype);
  // x [B, S, dim]; ctx.cos/sin the rotary tables, ctx.context the projected text [B, L, dim],
  // ctx.modulation the timestep projection [B, 6, dim].
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) override;
  std::string type_name() const override { return "WanTransformerBlock"; }

  double eps;
  std::shared_ptr<WanAttention> attn1, attn2;
  std::shared_ptr<LayerNorm> norm2;  // null without cross_attn_norm
  std::shared_ptr<Linear> ffn_in, ffn_out;  // ffn.net.0.proj, ffn.net.2
  at::Tensor scale_shift_table;             // [1, 6, dim]
};

class WanTransformer3DModel : public Model {
 public:
  explicit WanTransformer3DModel(const WanDiTConfig& c, at::ScalarType dtype = at::kFloat);

  // latents [B, C, F, H, W] (F, H, W multiples of the patch), timesteps [B] (float or int),
  // text [B, L, text_dim] -> the prediction [B, out_channels, F, H, W]. mm::Error for shapes
  // that do not fit.
  at::Tensor forward(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& text);
  // The pieces of forward: temb [B, dim] and the blocks' modulation [B, 6, dim] of timesteps.
  std::pair<at::Tensor, at::Tensor> time_embedding(const at::Tensor& timesteps) const;
  // The rotary tables of an (f, h, w) token grid: cos, sin [f * h * w, head_dim / 2] (fp32).
  std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t f, int64_t h, int64_t w, at::Device device) const;

  // The Model interface: {"prediction"} from noisy_latents, timesteps, prompt_embeds.
  Outputs forward(const data::Batch& batch) override;
  std::vector<std::string> required_fields() const override;
  std::string default_objective() const override { return "flow_matching"; }
  void init_weights(uint64_t seed) override;
  nlohmann::json hf_config() const override { return config.to_json(); }
  std::vector<std::shared_ptr<mm::nn::Block>> blocks() override { return {blocks_.begin(), blocks_.end()}; }
  std::string parameter_name(const std::string& checkpoint_name) const override;
  std::vector<ModelPart> parts() const override { return {{"transformer", ""}}; }
  PlanTable plans() const override;
  // wan_dit_memory.cpp: the blocks' saved tensors per latent token and per text token.
  std::optional<ActivationEstimate> estimate_activations(const data::Batch& host, const MemoryQuery& q) const override;
  // Pipeline parallelism: the blocks, with the patch, time and text embedders before them and
  // the modulated head after; the text features, temb and modulation travel with the hidden states.
  std::vector<PipelineSubmodule> pipeline_submodules() const override;
  void pipeline_forward(size_t submodule, int64_t begin, int64_t end, Outputs& carry, const data::Batch& batch) override;
  double input_tokens(const data::Batch& host) const override;
  double training_flops(const data::Batch& host) const override;
  std::string cost_summary(int64_t seq_len) const override;
  std::string type_name() const override { return "WanTransformer3DModel"; }

  WanDiTConfig config;

 private:
  // Blocks [begin, end) on the carry of the blocks before (begin > 0) or on the inputs; the
  // prediction when end is the last block, else what the next blocks need.
  void run_blocks(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& text, int64_t begin,
                  int64_t end, Outputs& carry);

 public:
  at::Tensor patch_weight, patch_bias;              // patch_embedding.*
  std::shared_ptr<Linear> time_linear_1, time_linear_2, time_proj, text_linear_1, text_linear_2;
  std::vector<std::shared_ptr<WanTransformerBlock>> blocks_;
  at::Tensor scale_shift_table;                     // [1, 2, dim]
  std::shared_ptr<Linear> proj_out;
};

// A diffusers name -> the original Wan checkpoint's name, and back (original_to_diffusers_name:
// identity for a name that is already diffusers').
std::string wan_dit_original_name(const std::string& diffusers_name);
std::string wan_dit_diffusers_name(const std::string& original_name);

}  // namespace mm::models
