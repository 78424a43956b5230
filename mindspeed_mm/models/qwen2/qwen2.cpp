#include "mindspeed_mm/models/qwen2/qwen2.h"

#include "mindspeed_mm/core/param_init.h"

#include "mindspeed_mm/models/common/kv_cache.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <functional>
#include <set>
#include <tuple>

#include "mindspeed_mm/config/config_io.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/rope.h"

namespace mm::models {

// ---------------------------------------------------------------------------------------------
// Config

namespace {

using nlohmann::json;

// Keys HF writes into a Qwen2 config.json that do not change the computation here, and the
// fields from_json reads itself.
const std::vector<std::string> kIgnoredKeys = {"architectures", "model_type", "transformers_version", "use_cache",
                                               "_name_or_path", "layer_types", "pad_token_id"};
const std::vector<std::string> kOwnKeys = {"torch_dtype", "dtype", "eos_token_id", "rope_parameters", "rope_scaling",
                                           "sliding_window", "attention_bias"};

}  // namespace

Qwen2Config Qwen2Config::from_json(const json& j, const std::string& source, bool strict) {
  Qwen2Config c;
  std::vector<std::string> other = kIgnoredKeys;
  other.insert(other.end(), kOwnKeys.begin(), kOwnKeys.end());
  read_hf_fields(c, j, source, strict, "", "qwen2", other);
  HFConfigReader f(j, source, "", "qwen2");
  if (!f.has("num_key_value_heads")) c.num_key_value_heads = c.num_attention_heads;
  // transformers >= 5 writes {"rope_parameters": {"rope_theta": ..., "rope_type": "default"}}
  // instead of a top-level rope_theta (Qwen2-VL's also carries its mrope_section there, which
  // Qwen2VLConfig reads). Only plain rotary is implemented: another rope_type is an error.
  if (f.has("rope_parameters")) {
    HFConfigReader r(f.at("rope_parameters"), source, "rope_parameters.", "qwen2");
    r("rope_theta", c.rope_theta, config::gt(0));
    std::string type = "default";
    r("rope_type", type);
    if (type != "default")
      f.fail("rope_parameters", cat("has rope_type \"", type, "\": only the default rotary embedding is implemented"));
  }
  f("torch_dtype", c.torch_dtype, config::one_of({"float32", "bfloat16", "float16", "float64"}));
  f("dtype", c.torch_dtype, config::one_of({"float32", "bfloat16", "float16", "float64"}));  // transformers >= 5's name
  f("sliding_window", c.sliding_window);
  f("attention_bias", c.attention_bias);
  if (f.has("eos_token_id")) {  // HF allows an int or a list
    const json& v = f.at("eos_token_id");
    if (!v.is_array() && !v.is_number_integer())
      f.fail("eos_token_id", cat("must be an integer or a list of integers (got ", v.dump(), ")"));
    if (v.is_array()) f("eos_token_id", c.eos_token_id);
    else c.eos_token_id = {v.get<int64_t>()};
  }
  if (c.hidden_size % c.num_attention_heads != 0)
    f.fail("hidden_size", cat("must be a multiple of num_attention_heads (got ", c.hidden_size, " and ",
                              c.num_attention_heads, ")"));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail("num_attention_heads", cat("must be a multiple of num_key_value_heads (got ", c.num_attention_heads,
                                      " and ", c.num_key_value_heads, ")"));
  if (c.head_dim() % 2 != 0)
    f.fail("hidden_size", cat("/ num_attention_heads must be even for rotary embeddings (head_dim ", c.head_dim(), ")"));
  if (c.attention_dropout != 0.0)
    f.fail("attention_dropout", cat("must be 0: attention dropout is not implemented (got ", c.attention_dropout, ")"));
  if (c.use_sliding_window) f.fail("use_sliding_window", "must be false: sliding-window attention is not implemented");
  if (f.has("rope_scaling")) f.fail("rope_scaling", cat("must be null for qwen2 (got ", f.at("rope_scaling").dump(), ")"));
  return c;
}

nlohmann::json Qwen2Config::to_json() const {
  json j = write_hf_fields(*this);
  j["architectures"] = json::array({"Qwen2ForCausalLM"});
  j["model_type"] = "qwen2";
  j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  if (!attention_bias) j["attention_bias"] = false;
  if (eos_token_id.size() == 1) j["eos_token_id"] = eos_token_id[0];
  else if (!eos_token_id.empty()) j["eos_token_id"] = eos_token_id;
  j["use_cache"] = true;
  return j;
}

int64_t Qwen2Config::matmul_params() const {
  const int64_t H = hidden_size, KV = num_key_value_heads * head_dim(), I = intermediate_size;
  const int64_t per_layer = H * H       // q_proj
                            + 2 * H * KV  // k_proj, v_proj
                            + H * H       // o_proj
                            + 3 * H * I;  // gate_proj, up_proj, down_proj
  return num_hidden_layers * per_layer + H * vocab_size;  // + lm_head
}

int64_t Qwen2Config::num_parameters() const {
  const int64_t H = hidden_size, KV = num_key_value_heads * head_dim(), I = intermediate_size;
  const int64_t bias = attention_bias ? H + 2 * KV : 0;
  const int64_t per_layer = 2 * H * H + 2 * H * KV + bias + 3 * H * I + 2 * H;  // projections, biases, 2 norms
  return vocab_size * H + num_hidden_layers * per_layer + H + (tie_word_embeddings ? 0 : H * vocab_size);
}

// Training FLOPs per token (the llm.c / PaLM-appendix accounting):
//   weights:   each matmul weight does one multiply-add (2 FLOPs) per token in the forward pass;
//              the backward pass computes the gradient w.r.t. the input and w.r.t. the weight,
//              two matmuls of the same size (4 FLOPs). Total 6 * N, N = matmul_params().
//   attention: per layer and token, q.k^T against S keys is S * hidden MACs (heads * head_dim =
//              hidden) and probs.v another S * hidden MACs: 4 * S * hidden FLOPs forward,
//              x3 with backward = 12 * S * hidden per layer.
//   total  =  6 * N  +  12 * L * S * hidden.
// The attention term counts the FULL S x S score matrix, not the causal half, as Megatron and
// PaLM do, so MFU figures compare directly with theirs. Norms, softmax, SiLU and the embedding
// lookup are not counted.
double Qwen2Config::flops_per_token(int64_t seq_len) const {
  const double weights = 6.0 * static_cast<double>(matmul_params());
  const double attention = 12.0 * static_cast<double>(num_hidden_layers) * static_cast<double>(seq_len) *
                           static_cast<double>(hidden_size);
  return weights + attention;
}

// ---------------------------------------------------------------------------------------------
// Modules

Qwen2Attention::Qwen2Attention(const Qwen2Config& c, at::ScalarType dtype)
    : num_heads(c.num_attention_heads), num_kv_heads(c.num_key_value_heads), head_dim(c.head_dim()) {
  const int64_t H = c.hidden_size;
  const bool bias = c.attention_bias;
  q_proj = register_module("q_proj", std::make_shared<Linear>(H, num_heads * head_dim, bias, dtype));
  k_proj = register_module("k_proj", std::make_shared<Linear>(H, num_kv_heads * head_dim, bias, dtype));
  v_proj = register_module("v_proj", std::make_shared<Linear>(H, num_kv_heads * head_dim, bias, dtype));
  o_proj = register_module("o_proj", std::make_shared<Linear>(num_heads * head_dim, H, false, dtype));
}

at::Tensor Qwen2Attention::forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) const {
  if (!through || ctx.kv_cache) return forward_own(x, ctx);
  return through(x, [this, ctx](const at::Tensor& in) { return forward_own(in, ctx); });  // ctx copied: may run again
}

at::Tensor Qwen2Attention::forward_own(const at::Tensor& x, const mm::nn::ForwardContext& ctx) const {
  const int64_t B = x.size(0);
  // [B, S, heads * D] -> [B, heads, S, D] (S from the projections: a plan may gather a sequence
  // that arrives split)
  at::Tensor q = q_proj->forward(x).view({B, -1, num_heads, head_dim}).transpose(1, 2);
  at::Tensor k = k_proj->forward(x).view({B, -1, num_kv_heads, head_dim}).transpose(1, 2);
  at::Tensor v = v_proj->forward(x).view({B, -1, num_kv_heads, head_dim}).transpose(1, 2);
  const int64_t S = q.size(2);
  std::tie(q, k) = apply_rope(q, k, ctx.cos, ctx.sin);
  if (ctx.kv_cache) std::tie(k, v) = ctx.kv_cache->append(ctx.layer_index, k, v);
  at::Tensor o = attention_core && !ctx.kv_cache ? attention_core->attend(q, k, v, ctx.causal, c10::nullopt)
                 : ctx.cu_seqlens.defined() && !ctx.kv_cache
                     ? varlen_attention(q, k, v, ctx.cu_seqlens, ctx.max_seqlen, ctx.causal)
                     : scaled_dot_product_attention(q, k, v, ctx.attn_mask, ctx.causal);
  return o_proj->forward(o.transpose(1, 2).reshape({B, S, num_heads * head_dim}));
}

Qwen2DecoderLayer::Qwen2DecoderLayer(const Qwen2Config& c, at::ScalarType dtype) {
  input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, dtype));
  self_attn = register_module("self_attn", std::make_shared<Qwen2Attention>(c, dtype));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, dtype));
  mlp = register_module("mlp", std::make_shared<SwiGLUMLP>(c.hidden_size, c.intermediate_size, false, dtype));
}

at::Tensor Qwen2DecoderLayer::forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) {
  at::Tensor h = x + self_attn->forward(input_layernorm->forward(x), ctx);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

Qwen2Model::Qwen2Model(const Qwen2Config& c, at::ScalarType dtype) : config(c) {
  embed_tokens = register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, dtype));
  auto list = register_module("layers", std::make_shared<mm::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(list->register_module(std::to_string(i), std::make_shared<Qwen2DecoderLayer>(c, dtype)));
  norm = register_module("norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, dtype));
}

mm::nn::ForwardContext Qwen2Model::make_context(const at::Tensor& position_ids, at::ScalarType dtype) const {
  // Angles in fp32 as HF does (fp64 when the model runs in fp64), then cast to the hidden dtype.
  const auto table_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor inv_freq = rope_inv_freq(config.head_dim(), config.rope_theta, table_dtype, position_ids.device());
  auto [cos, sin] = rope_cos_sin(position_ids, inv_freq);
  mm::nn::ForwardContext ctx;
  ctx.cos = cos.to(dtype);
  ctx.sin = sin.to(dtype);
  ctx.causal = true;
  return ctx;
}

at::Tensor Qwen2Model::forward(const at::Tensor& inputs_embeds, const mm::nn::ForwardContext& ctx) {
  return norm->forward(forward_layers(inputs_embeds, ctx, 0, static_cast<int64_t>(layers.size())));
}

at::Tensor Qwen2Model::forward_layers(at::Tensor h, const mm::nn::ForwardContext& ctx, int64_t begin, int64_t end) {
  mm::nn::ForwardContext layer_ctx = ctx;
  for (int64_t i = begin; i < end; ++i) {
    layer_ctx.layer_index = i;
    h = layers[static_cast<size_t>(i)]->call(h, layer_ctx);
  }
  return h;
}

Qwen2ForCausalLM::Qwen2ForCausalLM(const Qwen2Config& c, at::ScalarType dtype) : config(c) {
  model = register_module("model", std::make_shared<Qwen2Model>(c, dtype));
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", std::make_shared<Linear>(c.hidden_size, c.vocab_size, false, dtype));
}

at::Tensor Qwen2ForCausalLM::logits(const at::Tensor& hidden) const {
  return lm_head ? lm_head->forward(hidden) : model->embed_tokens->attend(hidden);
}

at::Tensor Qwen2ForCausalLM::forward(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                     const at::Tensor& attn_mask) {
  MultimodalInputs in;
  in.input_ids = input_ids;
  in.position_ids = position_ids;
  in.attn_mask = attn_mask;
  return Qwen2ForCausalLM::forward_multimodal(in);
}

at::Tensor Qwen2ForCausalLM::forward_multimodal(const MultimodalInputs& in) {
  MM_CHECK(in.input_ids.dim() == 2, "qwen2: input_ids must be [batch, seq] (got ", in.input_ids.sizes(), ")");
  return forward_embeds(model->embed_tokens->forward(in.input_ids), in);
}

at::Tensor Qwen2ForCausalLM::forward_embeds(const at::Tensor& h, const MultimodalInputs& in) {
  return logits(hidden_from_embeds(h, in));
}

at::Tensor Qwen2ForCausalLM::forward_hidden(const MultimodalInputs& in) {
  MM_CHECK(in.input_ids.dim() == 2, "qwen2: input_ids must be [batch, seq] (got ", in.input_ids.sizes(), ")");
  return hidden_from_embeds(model->embed_tokens->forward(in.input_ids), in);
}

at::Tensor Qwen2ForCausalLM::head_weight() const { return lm_head ? lm_head->weight : model->embed_tokens->weight; }

at::Tensor Qwen2ForCausalLM::hidden_from_embeds(const at::Tensor& h, const MultimodalInputs& in) {
  const int64_t B = h.size(0), S = h.size(1);
  const int64_t past = in.kv_cache ? in.kv_cache->length() : 0;
  at::Tensor pos = in.position_ids.defined()
                       ? in.position_ids
                       : at::arange(past, past + S, at::TensorOptions().dtype(at::kLong).device(h.device()))
                             .unsqueeze(0)
                             .expand({B, S});
  const mm::nn::ForwardContext rope = model->make_context(pos, h.scalar_type());
  return model->forward(h, decoder_context(rope.cos, rope.sin, h.scalar_type(), in));
}

std::vector<PipelineSubmodule> Qwen2ForCausalLM::pipeline_submodules() const {
  PipelineSubmodule text;
  text.name = "text";
  text.num_layers = config.num_hidden_layers;
  text.layer_prefix = "model.layers.";
  text.before = {"model.embed_tokens."};
  text.after = {"model.norm.", lm_head ? "lm_head." : "model.embed_tokens."};  // tied: the embedding again
  return {text};
}

at::Tensor Qwen2ForCausalLM::pipeline_embeddings(const MultimodalInputs& in, const Outputs&) {
  return model->embed_tokens->forward(in.input_ids);
}

std::pair<at::Tensor, at::Tensor> Qwen2ForCausalLM::pipeline_rope(const MultimodalInputs& in, at::ScalarType dtype,
                                                                  at::Device device) const {
  const int64_t B = in.input_ids.size(0), S = in.input_ids.size(1);
  at::Tensor pos = in.position_ids.defined()
                       ? in.position_ids
                       : at::arange(S, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0).expand({B, S});
  const mm::nn::ForwardContext rope = model->make_context(pos, dtype);
  return {rope.cos, rope.sin};
}

void Qwen2ForCausalLM::text_pipeline_forward(int64_t begin, int64_t end, Outputs& carry, const data::Batch& batch) {
  const MultimodalInputs in = multimodal_inputs(batch);
  at::Tensor h = begin == 0 ? pipeline_embeddings(in, carry) : carry.require_tensor("hidden");
  auto [cos, sin] = pipeline_rope(in, h.scalar_type(), h.device());
  h = model->forward_layers(h, decoder_context(cos, sin, h.scalar_type(), in), begin, end);
  carry = Outputs();
  if (end == config.num_hidden_layers)
    set_head_output(carry, model->norm->forward(h), batch, [this](const at::Tensor& x) { return logits(x); });
  else carry.set("hidden", h);
}

void Qwen2ForCausalLM::pipeline_forward(size_t, int64_t begin, int64_t end, Outputs& carry, const data::Batch& batch) {
  text_pipeline_forward(begin, end, carry, batch);
}

void Qwen2ForCausalLM::init_weights(uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std_dev = config.initializer_range;
  // Walks children() rather than named_modules() so a model that is not owned by a shared_ptr
  // can be initialised too. Through init_param*: a sharded build keeps only its slices.
  std::function<void(mm::nn::Module&)> visit = [&](mm::nn::Module& m) {
    if (auto* lin = dynamic_cast<Linear*>(&m)) {
      mm::nn::init_param_normal(lin->weight, std_dev, gen);
      if (lin->bias.defined()) mm::nn::init_param_fill(lin->bias, 0.0);
    } else if (auto* emb = dynamic_cast<Embedding*>(&m)) {
      mm::nn::init_param_normal(emb->weight, std_dev, gen);
    } else if (auto* norm = dynamic_cast<RMSNorm*>(&m)) {
      mm::nn::init_param_fill(norm->weight, 1.0);
    }
    for (auto& [_, child] : m.children()) visit(*child);
  };
  visit(*this);
}

// Megatron's layout: q/k/v and gate/up column-parallel, o and down row-parallel, the
// vocabulary split in the embedding and the LM head (logits stay split for the loss).
PlanTable Qwen2ForCausalLM::plans() const {
  PlanTable t;
  t.fsdp_units = {"model.layers.{*}"};
  t.tensor_parallel = {{"model.layers.{*}.self_attn", "heads"},
                       {"model.layers.{*}.self_attn.q_proj", "colwise"},
                       {"model.layers.{*}.self_attn.k_proj", "kv_colwise"},
                       {"model.layers.{*}.self_attn.v_proj", "kv_colwise"},
                       {"model.layers.{*}.self_attn.o_proj", "rowwise"},
                       {"model.layers.{*}.mlp.gate_proj", "colwise"},
                       {"model.layers.{*}.mlp.up_proj", "colwise"},
                       {"model.layers.{*}.mlp.down_proj", "rowwise"}};
  if (lm_head) {
    t.tensor_parallel.emplace_back("model.embed_tokens", "vocab");
    t.tensor_parallel.emplace_back("lm_head", "vocab_head");
  } else {
    t.tensor_parallel.emplace_back("model.embed_tokens", "vocab_tied");
  }
  t.sequence_parallel = {"model.layers.{*}"};
  t.context_parallel = {"model.layers.{*}.self_attn"};
  return t;
}

std::vector<std::shared_ptr<mm::nn::Block>> Qwen2ForCausalLM::blocks() {
  return {model->layers.begin(), model->layers.end()};
}

namespace {
const mm::Registrar kSizeQwen2(model_size_registry(), "qwen2", [](const nlohmann::json& hf, const std::string& source, bool strict) {
  Qwen2Config c = Qwen2Config::from_json(hf, source, strict);
  ModelSize s{{{"language model", c.num_parameters()}}};
  s.flops_per_token = [c](int64_t seq) { return c.flops_per_token(seq); };
  return s;
});
const mm::Registrar kRegisterQwen2(model_registry(), "qwen2", [](const nlohmann::json& hf_config, const std::string& source, bool strict) {
  return std::static_pointer_cast<CausalLM>(
      std::make_shared<Qwen2ForCausalLM>(Qwen2Config::from_json(hf_config, source, strict)));
});
}  // namespace

}  // namespace mm::models
