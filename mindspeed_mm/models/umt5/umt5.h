// The umT5 encoder (transformers' UMT5EncoderModel), Wan2.1's text encoder, parameter names as in
// its checkpoints (a diffusers pipeline's text_encoder/):
//   shared.weight                                       token embedding [vocab, d_model]
//   encoder.block.N.layer.0.layer_norm.weight           RMS norm (no mean, no bias)
//   encoder.block.N.layer.0.SelfAttention.{q,k,v,o}.weight            no biases
//   encoder.block.N.layer.0.SelfAttention.relative_attention_bias.weight  [buckets, heads]: every layer its own
//   encoder.block.N.layer.1.layer_norm.weight
//   encoder.block.N.layer.1.DenseReluDense.{wi_0,wi_1,wo}.weight     gated GELU: wo(gelu_tanh(wi_0 x) * wi_1 x)
//   encoder.final_layer_norm.weight
// Attention is T5's: scores q.k without 1/sqrt(d) scaling, plus the layer's bias of the bucketed
// relative position (bidirectional: half the buckets for keys after the query; within each half,
// exact distances below a quarter of the buckets, logarithmic bins up to max_distance), plus the
// padding mask. Norms accumulate in fp32.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/models/common/hf_config.h"
#include "mindspeed_mm/models/common/linear.h"
#include "mindspeed_mm/models/common/norm.h"

namespace mm::models {

// config.json fields of a UMT5 model (transformers' names and defaults).
struct UMT5Config {
  int64_t vocab_size = 250112, d_model = 512, d_kv = 64, d_ff = 1024, num_layers = 8, num_heads = 6;
  int64_t relative_attention_num_buckets = 32, relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  std::string feed_forward_proj = "gated-gelu";

  // Wan2.1's text encoder (google/umt5-xxl's encoder).
  static UMT5Config umt5_xxl();

  template <class IO>
  void io(IO& io) {
    io("vocab_size", vocab_size, config::gt(0));
    io("d_model", d_model, config::gt(0));
    io("d_kv", d_kv, config::gt(0));
    io("d_ff", d_ff, config::gt(0));
    io("num_layers", num_layers, config::gt(0));
    io("num_heads", num_heads, config::gt(0));
    io("relative_attention_num_buckets", relative_attention_num_buckets, config::gt(1));
    io("relative_attention_max_distance", relative_attention_max_distance, config::gt(1));
    io("layer_norm_epsilon", layer_norm_epsilon, config::gt(0));
    io("feed_forward_proj", feed_forward_proj, config::one_of({"gated-gelu"}));
  }
  // ConfigError naming the key and source; strict refuses unknown keys (our YAML), else the keys
  // transformers writes for the whole encoder-decoder are ignored.
  static UMT5Config from_json(const nlohmann::json& j, const std::string& source, bool strict);
  nlohmann::json to_json() const;  // model_type umt5, architectures [UMT5EncoderModel]
  int64_t num_parameters() const;
};

// The bucket of each relative position (key - query) of a bidirectional T5 attention, int64.
at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, int64_t num_buckets, int64_t max_distance);

class UMT5Attention : public mm::nn::Module {
 public:
  UMT5Attention(const UMT5Config& c, at::ScalarType dtype);
  // x [B, S, d_model]; mask additive [B, 1, 1, S] (or undefined).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask) const;
  at::Tensor position_bias(int64_t length, at::Device device) const;  // [1, heads, S, S]
  std::string type_name() const override { return "UMT5Attention"; }

  int64_t num_heads, d_kv, num_buckets, max_distance;
  std::shared_ptr<Linear> q, k, v, o;
  std::shared_ptr<Embedding> relative_attention_bias;
};

class UMT5Block : public mm::nn::Block {
 public:
  UMT5Block(const UMT5Config& c, at::ScalarType dtype);
  // x [B, S, d_model]; ctx.attn_mask the additive padding mask [B, 1, 1, S] (or undefined).
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) override;
  std::string type_name() const override { return "UMT5Block"; }

  std::shared_ptr<RMSNorm> attn_norm, ff_norm;  // layer.0.layer_norm, layer.1.layer_norm
  std::shared_ptr<UMT5Attention> attn;          // layer.0.SelfAttention
  std::shared_ptr<Linear> wi_0, wi_1, wo;       // layer.1.DenseReluDense.*
};

class UMT5EncoderModel : public mm::nn::Module {
 public:
  explicit UMT5EncoderModel(const UMT5Config& c, at::ScalarType dtype = at::kFloat);
  // input_ids [B, S] int64, attention_mask [B, S] (1 = token, 0 = padding; undefined = all
  // tokens) -> last hidden state [B, S, d_model].
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {});
  std::string type_name() const override { return "UMT5EncoderModel"; }
  // Checkpoints may also carry the tied copy encoder.embed_tokens.weight.
  static std::vector<std::string> optional_checkpoint_tensors() { return {"encoder.embed_tokens.weight"}; }

  UMT5Config config;
  std::shared_ptr<Embedding> shared;
  std::vector<std::shared_ptr<UMT5Block>> blocks;
  std::shared_ptr<RMSNorm> final_layer_norm;
};

// Forward FLOPs of one sequence of seq_len tokens (2 per multiply-add of the projections, the
// feed-forward and attention's q k^T and probs v; norms, biases and softmax not counted).
double umt5_forward_flops(const UMT5Config& c, int64_t seq_len);

// An encoder directory (config.json with model_type umt5 + safetensors) loaded in fp32.
// dir: a transformers directory (config.json + safetensors), or one whose weights are Wan's
// original models_t5_umt5-xxl-enc-bf16.pth (original names), or that .pth file itself
// (umT5-XXL's configuration, UMT5Config::umt5_xxl).
std::shared_ptr<UMT5EncoderModel> load_umt5_encoder(const std::string& dir);

// Names of Wan's original umT5 encoder checkpoint (wan/modules/t5.py: T5Encoder) and
// transformers' UMT5EncoderModel, both ways:
//   token_embedding.weight                    shared.weight
//   blocks.N.norm1 / norm2                    encoder.block.N.layer.{0,1}.layer_norm
//   blocks.N.attn.{q,k,v,o}                   encoder.block.N.layer.0.SelfAttention.{q,k,v,o}
//   blocks.N.pos_embedding.embedding          encoder.block.N.layer.0.SelfAttention.relative_attention_bias
//   blocks.N.ffn.gate.0 / fc1 / fc2           encoder.block.N.layer.1.DenseReluDense.wi_0 / wi_1 / wo
//   norm.weight                               encoder.final_layer_norm.weight
// (Wan computes fc2(fc1(x) * gelu(gate(x))): its gate is transformers' activated wi_0.) A name
// already in the target layout (or unknown) comes back unchanged.
std::string umt5_hf_name(const std::string& original);
std::string umt5_original_name(const std::string& hf);

// transformers' T5 initialisation (initializer_factor 1): embedding N(0, 1); q N(0, (d_model d_kv)^-1/2),
// k and v N(0, d_model^-1/2), o N(0, (heads d_kv)^-1/2), relative bias and wi_* N(0, d_model^-1/2),
// wo N(0, d_ff^-1/2); norms 1. Deterministic in `seed`.
void init_umt5_weights(UMT5EncoderModel& m, uint64_t seed);

// DIR/config.json + DIR/model.safetensors (each written atomically), a directory
// load_umt5_encoder and transformers' UMT5EncoderModel.from_pretrained read.
void save_umt5_encoder(const UMT5EncoderModel& m, const std::string& dir);

}  // namespace mm::models
