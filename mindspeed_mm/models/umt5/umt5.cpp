#include "mindspeed_mm/models/umt5/umt5.h"

#include <cmath>
#include <limits>

#include <ATen/CPUGeneratorImpl.h>
#include <filesystem>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/attention.h"

namespace mm::models {

namespace {

using nlohmann::json;

// What transformers writes for the whole encoder-decoder that the encoder does not use.
const std::vector<std::string> kIgnoredKeys = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "classifier_dropout", "decoder_start_token_id",
    "dense_act_fn", "dropout_rate", "dtype", "torch_dtype", "eos_token_id", "initializer_factor", "is_decoder",
    "is_encoder_decoder", "is_gated_act", "num_decoder_layers", "pad_token_id", "scale_decoder_outputs",
    "tie_word_embeddings", "use_cache", "tokenizer_class", "output_past", "bos_token_id"};

}  // namespace

UMT5Config UMT5Config::from_json(const json& j, const std::string& source, bool strict) {
  UMT5Config c;
  read_hf_fields(c, j, source, strict, "", "umt5", kIgnoredKeys);
  HFConfigReader f(j, source, "", "umt5");
  if (f.has("dense_act_fn") && f.at("dense_act_fn") != "gelu_new")
    f.fail("dense_act_fn", cat("must be gelu_new for a gated-gelu umt5 (got ", f.at("dense_act_fn").dump(), ")"));
  return c;
}

json UMT5Config::to_json() const {
  json j = write_hf_fields(*this);
  j["model_type"] = "umt5";
  j["architectures"] = {"UMT5EncoderModel"};
  j["dense_act_fn"] = "gelu_new";
  j["is_gated_act"] = true;
  j["tie_word_embeddings"] = true;
  return j;
}

int64_t UMT5Config::num_parameters() const {
  const int64_t inner = num_heads * d_kv;
  const int64_t block = 2 * d_model + 4 * d_model * inner + relative_attention_num_buckets * num_heads + 3 * d_model * d_ff;
  return vocab_size * d_model + num_layers * block + d_model;
}

at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, int64_t num_buckets, int64_t max_distance) {
  // transformers' _relative_position_bucket for an encoder, op for op (fp32 logs, truncation).
  const int64_t half = num_buckets / 2;
  at::Tensor buckets = relative_position.gt(0).to(at::kLong) * half;
  const at::Tensor distance = relative_position.abs();
  const int64_t max_exact = half / 2;
  const at::Tensor is_small = distance.lt(max_exact);
  at::Tensor large = at::log(distance.to(at::kFloat) / static_cast<float>(max_exact)) /
                     static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  large = max_exact + (large * static_cast<float>(half - max_exact)).to(at::kLong);
  large = at::minimum(large, at::full_like(large, half - 1));
  return buckets + at::where(is_small, distance, large);
}

UMT5Attention::UMT5Attention(const UMT5Config& c, at::ScalarType dtype)
    : num_heads(c.num_heads), d_kv(c.d_kv), num_buckets(c.relative_attention_num_buckets),
      max_distance(c.relative_attention_max_distance) {
  const int64_t inner = c.num_heads * c.d_kv;
  q = register_module("q", std::make_shared<Linear>(c.d_model, inner, false, dtype));
  k = register_module("k", std::make_shared<Linear>(c.d_model, inner, false, dtype));
  v = register_module("v", std::make_shared<Linear>(c.d_model, inner, false, dtype));
  o = register_module("o", std::make_shared<Linear>(inner, c.d_model, false, dtype));
  relative_attention_bias =
      register_module("relative_attention_bias", std::make_shared<Embedding>(c.relative_attention_num_buckets, c.num_heads, dtype));
}

at::Tensor UMT5Attention::position_bias(int64_t length, at::Device device) const {
  const at::Tensor pos = at::arange(length, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor rel = pos.unsqueeze(0) - pos.unsqueeze(1);  // key - query, [S, S]
  const at::Tensor bias = relative_attention_bias->forward(t5_relative_position_bucket(rel, num_buckets, max_distance));
  return bias.permute({2, 0, 1}).unsqueeze(0);  // [1, heads, S, S]
}

at::Tensor UMT5Attention::forward(const at::Tensor& x, const at::Tensor& mask) const {
  const int64_t b = x.size(0), s = x.size(1);
  auto heads = [&](const at::Tensor& t) { return t.view({b, s, num_heads, d_kv}).transpose(1, 2); };
  const at::Tensor qh = heads(q->forward(x)), kh = heads(k->forward(x)), vh = heads(v->forward(x));
  at::Tensor bias = position_bias(s, x.device()).to(qh.scalar_type());
  if (mask.defined()) bias = bias + mask.to(qh.scalar_type());
  const at::Tensor out = models::scaled_dot_product_attention(qh, kh, vh, bias, /*causal=*/false, /*scale=*/1.0);
  return o->forward(out.transpose(1, 2).reshape({b, s, num_heads * d_kv}));
}

UMT5Block::UMT5Block(const UMT5Config& c, at::ScalarType dtype) {
  auto layers = register_module("layer", std::make_shared<mm::nn::Module>());
  auto l0 = layers->register_module("0", std::make_shared<mm::nn::Module>());
  attn = l0->register_module("SelfAttention", std::make_shared<UMT5Attention>(c, dtype));
  attn_norm = l0->register_module("layer_norm", std::make_shared<RMSNorm>(c.d_model, c.layer_norm_epsilon, dtype));
  auto l1 = layers->register_module("1", std::make_shared<mm::nn::Module>());
  auto ff = l1->register_module("DenseReluDense", std::make_shared<mm::nn::Module>());
  wi_0 = ff->register_module("wi_0", std::make_shared<Linear>(c.d_model, c.d_ff, false, dtype));
  wi_1 = ff->register_module("wi_1", std::make_shared<Linear>(c.d_model, c.d_ff, false, dtype));
  wo = ff->register_module("wo", std::make_shared<Linear>(c.d_ff, c.d_model, false, dtype));
  ff_norm = l1->register_module("layer_norm", std::make_shared<RMSNorm>(c.d_model, c.layer_norm_epsilon, dtype));
}

at::Tensor UMT5Block::forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) {
  at::Tensor h = x + attn->forward(attn_norm->forward(x), ctx.attn_mask);
  const at::Tensor n = ff_norm->forward(h);
  return h + wo->forward(at::gelu(wi_0->forward(n), "tanh") * wi_1->forward(n));
}

UMT5EncoderModel::UMT5EncoderModel(const UMT5Config& c, at::ScalarType dtype) : config(c) {
  shared = register_module("shared", std::make_shared<Embedding>(c.vocab_size, c.d_model, dtype));
  auto encoder = register_module("encoder", std::make_shared<mm::nn::Module>());
  auto list = encoder->register_module("block", std::make_shared<mm::nn::Module>());
  for (int64_t i = 0; i < c.num_layers; ++i)
    blocks.push_back(list->register_module(std::to_string(i), std::make_shared<UMT5Block>(c, dtype)));
  final_layer_norm = encoder->register_module("final_layer_norm", std::make_shared<RMSNorm>(c.d_model, c.layer_norm_epsilon, dtype));
}

at::Tensor UMT5EncoderModel::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  MM_CHECK(input_ids.dim() == 2, "umt5: input_ids must be [B, S], got ", input_ids.sizes());
  MM_CHECK(!attention_mask.defined() || attention_mask.sizes() == input_ids.sizes(), "umt5: attention_mask ",
           attention_mask.sizes(), " does not match input_ids ", input_ids.sizes());
  const int64_t hi = input_ids.numel() > 0 ? input_ids.max().item<int64_t>() : 0;
  MM_CHECK(input_ids.numel() == 0 || (input_ids.min().item<int64_t>() >= 0 && hi < config.vocab_size), "umt5: token id ",
           hi, " outside the vocabulary of ", config.vocab_size);
  mm::nn::ForwardContext ctx;
  ctx.causal = false;
  if (attention_mask.defined()) {
    // Padding keys get the dtype's lowest value, as transformers' bidirectional mask.
    const auto dtype = shared->weight.scalar_type();
    const double lowest = dtype == at::kDouble ? std::numeric_limits<double>::lowest() : std::numeric_limits<float>::lowest();
    ctx.attn_mask = (1 - attention_mask.to(dtype)).mul(lowest).view({input_ids.size(0), 1, 1, input_ids.size(1)});
  }
  at::Tensor h = shared->forward(input_ids);
  for (auto& block : blocks) h = block->call(h, ctx);
  return final_layer_norm->forward(h);
}

std::shared_ptr<UMT5EncoderModel> load_umt5_encoder(const std::string& dir) {
  std::shared_ptr<UMT5EncoderModel> m;
  if (std::filesystem::is_regular_file(dir)) {
    m = std::make_shared<UMT5EncoderModel>(UMT5Config::umt5_xxl());  // Wan's original checkpoint
  } else {
    const nlohmann::json hf = checkpoint::read_hf_config(dir);
    if (hf_string(hf, "model_type", "") != "umt5")
      throw ConfigError(cat("config: ", dir, "/config.json has model_type ", hf_string(hf, "model_type", "(none)"),
                            ", not umt5: not a umT5 text encoder"));
    m = std::make_shared<UMT5EncoderModel>(UMT5Config::from_json(hf, dir + "/config.json", false));
  }
  checkpoint::load_model_weights(*m, dir, UMT5EncoderModel::optional_checkpoint_tensors(), umt5_hf_name);
  return m;
}

UMT5Config UMT5Config::umt5_xxl() {
  UMT5Config c;
  c.vocab_size = 256384;
  c.d_model = 4096;
  c.d_kv = 64;
  c.d_ff = 10240;
  c.num_layers = 24;
  c.num_heads = 64;
  return c;
}

namespace {

// Per block: (original suffix, transformers suffix); then the whole-model names.
const std::vector<std::pair<std::string, std::string>> kUmt5BlockNames = {
    {"norm1.", "layer.0.layer_norm."},
    {"attn.q.", "layer.0.SelfAttention.q."},
    {"attn.k.", "layer.0.SelfAttention.k."},
    {"attn.v.", "layer.0.SelfAttention.v."},
    {"attn.o.", "layer.0.SelfAttention.o."},
    {"pos_embedding.embedding.", "layer.0.SelfAttention.relative_attention_bias."},
    {"norm2.", "layer.1.layer_norm."},
    {"ffn.gate.0.", "layer.1.DenseReluDense.wi_0."},
    {"ffn.fc1.", "layer.1.DenseReluDense.wi_1."},
    {"ffn.fc2.", "layer.1.DenseReluDense.wo."}};
const std::vector<std::pair<std::string, std::string>> kUmt5TopNames = {
    {"token_embedding.", "shared."}, {"norm.", "encoder.final_layer_norm."}};

std::string umt5_rename(const std::string& name, bool to_hf) {
  const std::string block = to_hf ? "blocks." : "encoder.block.";
  const std::string other = to_hf ? "encoder.block." : "blocks.";
  if (name.rfind(block, 0) == 0) {
    const size_t dot = name.find('.', block.size());
    if (dot != std::string::npos) {
      const std::string rest = name.substr(dot + 1);
      for (const auto& [orig, hf] : kUmt5BlockNames) {
        const std::string& from = to_hf ? orig : hf;
        if (rest.rfind(from, 0) == 0)
          return other + name.substr(block.size(), dot - block.size()) + "." + (to_hf ? hf : orig) + rest.substr(from.size());
      }
    }
    return name;
  }
  for (const auto& [orig, hf] : kUmt5TopNames) {
    const std::string& from = to_hf ? orig : hf;
    if (name.rfind(from, 0) == 0) return (to_hf ? hf : orig) + name.substr(from.size());
  }
  return name;
}

}  // namespace

std::string umt5_hf_name(const std::string& original) { return umt5_rename(original, true); }
std::string umt5_original_name(const std::string& hf) { return umt5_rename(hf, false); }

void init_umt5_weights(UMT5EncoderModel& m, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const UMT5Config& c = m.config;
  const double dm = static_cast<double>(c.d_model);
  mm::nn::init_param_normal(m.shared->weight, 1.0, gen);
  for (auto& b : m.blocks) {
    mm::nn::init_param_fill(b->attn_norm->weight, 1.0);
    mm::nn::init_param_fill(b->ff_norm->weight, 1.0);
    mm::nn::init_param_normal(b->attn->q->weight, 1.0 / std::sqrt(dm * static_cast<double>(c.d_kv)), gen);
    mm::nn::init_param_normal(b->attn->k->weight, 1.0 / std::sqrt(dm), gen);
    mm::nn::init_param_normal(b->attn->v->weight, 1.0 / std::sqrt(dm), gen);
    mm::nn::init_param_normal(b->attn->o->weight, 1.0 / std::sqrt(static_cast<double>(c.num_heads * c.d_kv)), gen);
    mm::nn::init_param_normal(b->attn->relative_attention_bias->weight, 1.0 / std::sqrt(dm), gen);
    mm::nn::init_param_normal(b->wi_0->weight, 1.0 / std::sqrt(dm), gen);
    mm::nn::init_param_normal(b->wi_1->weight, 1.0 / std::sqrt(dm), gen);
    mm::nn::init_param_normal(b->wo->weight, 1.0 / std::sqrt(static_cast<double>(c.d_ff)), gen);
  }
  mm::nn::init_param_fill(m.final_layer_norm->weight, 1.0);
}

void save_umt5_encoder(const UMT5EncoderModel& m, const std::string& dir) {
  std::filesystem::create_directories(dir);
  st::save_safetensors(dir + "/model.safetensors", m.named_parameters(), {{"format", "pt"}});
  st::write_file_atomic(dir + "/config.json", m.config.to_json().dump(2) + "\n");
}

double umt5_forward_flops(const UMT5Config& c, int64_t seq_len) {
  const double L = static_cast<double>(seq_len), inner = static_cast<double>(c.num_heads * c.d_kv);
  const double d = static_cast<double>(c.d_model), ff = static_cast<double>(c.d_ff);
  const double ffn = (c.feed_forward_proj.rfind("gated", 0) == 0 ? 3 : 2) * d * ff;
  const double layer = 2 * L * (4 * d * inner + ffn) + 4 * L * L * inner;
  return static_cast<double>(c.num_layers) * layer;
}

}  // namespace mm::models
