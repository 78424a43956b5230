// Qwen2 decoder-only language model (HF Qwen2ForCausalLM), parameter names identical to the HF
// checkpoint so a model directory loads without conversion:
//   model.embed_tokens.weight
//   model.layers.N.input_layernorm.weight
//   model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}   model.layers.N.self_attn.o_proj.weight
//   model.layers.N.post_attention_layernorm.weight
//   model.layers.N.mlp.{gate,up,down}_proj.weight
//   model.norm.weight
//   lm_head.weight                                          (absent when tie_word_embeddings)
// Qwen2-VL's language model is this decoder with M-RoPE tables in the ForwardContext.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>
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
#include "mindspeed_mm/models/model_registry.h"

namespace mm::models {

// HF config.json fields of a Qwen2 model (same names, same defaults where HF has one).
struct Qwen2Config {
  int64_t vocab_size = 0;                 // required
  int64_t hidden_size = 0;                // required
  int64_t intermediate_size = 0;          // required
  int64_t num_hidden_layers = 0;          // required
  int64_t num_attention_heads = 0;        // required
  int64_t num_key_value_heads = 0;        // default: num_attention_heads
  int64_t max_position_embeddings = 32768;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";        // only silu
  double attention_dropout = 0.0;         // only 0
  std::string torch_dtype;                // checkpoint dtype ("bfloat16"); empty when not given
  c10::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_id;      // HF allows an int or a list
  bool use_sliding_window = false;        // only false (sliding_window is then ignored)
  c10::optional<int64_t> sliding_window;
  c10::optional<int64_t> max_window_layers;
  double initializer_range = 0.02;
  // q/k/v projection biases: always in Qwen2; LLaMA's attention_bias (default false there).
  bool attention_bias = true;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // The plain fields, read and written by one list (models/common/hf_config.h); from_json and
  // to_json add the few that need more (dtype spellings, eos as an int or a list, rope_parameters).
  template <class IO>
  void io(IO& io) {
    io.required("vocab_size", vocab_size, config::gt(0));
    io.required("hidden_size", hidden_size, config::gt(0));
    io.required("intermediate_size", intermediate_size, config::gt(0));
    io.required("num_hidden_layers", num_hidden_layers, config::gt(0));
    io.required("num_attention_heads", num_attention_heads, config::gt(0));
    io("num_key_value_heads", num_key_value_heads, config::gt(0));
    io("max_position_embeddings", max_position_embeddings, config::gt(0));
    io("rms_norm_eps", rms_norm_eps, config::gt(0));
    io("rope_theta", rope_theta, config::gt(0));
    io("tie_word_embeddings", tie_word_embeddings);
    io("hidden_act", hidden_act, config::one_of({"silu"}));
    io("attention_dropout", attention_dropout);
    io("initializer_range", initializer_range, config::ge(0));
    io("use_sliding_window", use_sliding_window);
    io("max_window_layers", max_window_layers);
    io("bos_token_id", bos_token_id);
  }

  static Qwen2Config from_json(const nlohmann::json& j, const std::string& source, bool strict);
  // HF-compatible config.json (model_type "qwen2", architectures ["Qwen2ForCausalLM"]).
  nlohmann::json to_json() const;

  // Weights that enter a matmul per token: every projection of every layer plus lm_head
  // (counted even when tied: the logits matmul is done either way). Biases, norms and the
  // embedding lookup are not matmuls.
  int64_t matmul_params() const;
  // Every parameter of Qwen2ForCausalLM (closed form; equals the module tree's count).
  int64_t num_parameters() const;
  // Training FLOPs per token, forward + backward, at sequence length seq_len. See qwen2.cpp.
  double flops_per_token(int64_t seq_len) const;
};

class Qwen2Attention : public mm::nn::Module, public HeadSplittable, public AttentionCoreHost, public mm::nn::ForwardThrough {
 public:
  Qwen2Attention(const Qwen2Config& c, at::ScalarType dtype);
  // x [B, S, hidden] -> [B, S, hidden]; uses ctx.cos/sin, ctx.attn_mask, ctx.causal, and
  // appends to ctx.kv_cache (layer ctx.layer_index) when set.
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) const;
  at::Tensor forward_own(const at::Tensor& x, const mm::nn::ForwardContext& ctx) const;  // forward, not through a plan
  std::string type_name() const override { return "Qwen2Attention"; }
  std::pair<int64_t, int64_t> heads() const override { return {num_heads, num_kv_heads}; }
  void keep_heads(int64_t q_heads, int64_t kv_heads) override {
    num_heads = q_heads;
    num_kv_heads = kv_heads;
  }

  int64_t num_heads, num_kv_heads, head_dim;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
};

// Pre-norm residual block: h = x + attn(norm(x)); out = h + mlp(norm(h)).
class Qwen2DecoderLayer : public mm::nn::Block {
 public:
  Qwen2DecoderLayer(const Qwen2Config& c, at::ScalarType dtype);
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) override;
  std::string type_name() const override { return "Qwen2DecoderLayer"; }

  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Qwen2Attention> self_attn;
  std::shared_ptr<SwiGLUMLP> mlp;
};

// The `model` subtree: embed_tokens, layers.N, norm.
class Qwen2Model : public mm::nn::Module {
 public:
  Qwen2Model(const Qwen2Config& c, at::ScalarType dtype);
  // Causal context with rotary tables for position_ids [B, S] (1-D RoPE), in `dtype`.
  mm::nn::ForwardContext make_context(const at::Tensor& position_ids, at::ScalarType dtype) const;
  // inputs_embeds [B, S, hidden] -> final-normed hidden states; every layer runs via Block::call.
  at::Tensor forward(const at::Tensor& inputs_embeds, const mm::nn::ForwardContext& ctx);
  // Layers [begin, end) only, without the final norm (a pipeline stage's share).
  at::Tensor forward_layers(at::Tensor h, const mm::nn::ForwardContext& ctx, int64_t begin, int64_t end);
  std::string type_name() const override { return "Qwen2Model"; }

  Qwen2Config config;
  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<Qwen2DecoderLayer>> layers;  // also registered as children "layers.N"
  std::shared_ptr<RMSNorm> norm;
};

class Qwen2ForCausalLM : public CausalLM {
 public:
  explicit Qwen2ForCausalLM(const Qwen2Config& c, at::ScalarType dtype = at::kFloat);

  using CausalLM::forward;  // forward(const data::Batch&) too
  PlanTable plans() const override;
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& position_ids = {},
                     const at::Tensor& attn_mask = {}) override;
  // The token fields of `in`; with in.kv_cache, positions continue after the cached tokens.
  at::Tensor forward_multimodal(const MultimodalInputs& in) override;
  // The same from input embeddings [B, S, hidden] (a vision-language model's merged tokens);
  // in.input_ids give only the shape, in.position_ids / attn_mask / kv_cache as above.
  at::Tensor forward_embeds(const at::Tensor& inputs_embeds, const MultimodalInputs& in);
  // hidden [B, S, hidden] -> logits [B, S, vocab] (through embed_tokens.weight when tied).
  at::Tensor logits(const at::Tensor& hidden) const;
  // forward_embeds without the head: the final normed hidden states.
  at::Tensor hidden_from_embeds(const at::Tensor& inputs_embeds, const MultimodalInputs& in);
  at::Tensor forward_hidden(const MultimodalInputs& in) override;
  at::Tensor head_weight() const override;
  // Pipeline pieces: one submodule "text" (embedding before the layers; the final norm and the
  // head, or the tied embedding, after them). carry: "hidden" between layers, "logits" at the end.
  std::vector<PipelineSubmodule> pipeline_submodules() const override;
  void pipeline_forward(size_t submodule, int64_t begin, int64_t end, Outputs& carry, const data::Batch& batch) override;
  // Linear/Embedding weights ~ N(0, initializer_range), biases 0, norm weights 1. Values are drawn
  // in fp32 on the CPU in named_parameters() order, so they do not depend on device or dtype.
  void init_weights(uint64_t seed) override;
  nlohmann::json hf_config() const override { return config.to_json(); }
  // qwen2_memory.cpp: the tensors this code saves, per token, layer by layer.
  std::optional<ActivationEstimate> estimate_activations(const data::Batch& host, const MemoryQuery& q) const override;
  // The language model's share of it for rows [B, S] (after the embeddings, which a
  // vision-language model merges first: counted by the caller when `embeddings` is false); its
  // blocks' paths start with `prefix` (LLaVA's "language_model."). padded_rows: rows with
  // padding (an attention mask), which Ulysses then masks over the whole sequence.
  void estimate_decoder(ActivationEstimate& e, int64_t B, int64_t S, bool segment_mask, bool embeddings,
                        const MemoryQuery& q, const std::string& prefix = "", bool padded_rows = false) const;
  double flops_per_token(int64_t seq_len) const override { return config.flops_per_token(seq_len); }
  std::vector<std::shared_ptr<mm::nn::Block>> blocks() override;
  int64_t vocab_size() const override { return config.vocab_size; }
  std::string type_name() const override { return "Qwen2ForCausalLM"; }

  Qwen2Config config;
  std::shared_ptr<Qwen2Model> model;
  std::shared_ptr<Linear> lm_head;  // null when tie_word_embeddings

 protected:
  // The decoder's input embeddings of a batch (Qwen2-VL: with the vision features of `carry`
  // placed) and its rotary tables, for the pipeline pieces.
  virtual at::Tensor pipeline_embeddings(const MultimodalInputs& in, const Outputs& carry);
  virtual std::pair<at::Tensor, at::Tensor> pipeline_rope(const MultimodalInputs& in, at::ScalarType dtype,
                                                          at::Device device) const;
  // The text submodule's piece.
  void text_pipeline_forward(int64_t begin, int64_t end, Outputs& carry, const data::Batch& batch);
};

}  // namespace mm::models
