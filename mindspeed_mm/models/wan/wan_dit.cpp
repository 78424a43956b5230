#include "mindspeed_mm/models/wan/wan_dit.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <cmath>
#include <functional>
#include <tuple>

#include "mindspeed_mm/config/config_io.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/models/model_registry.h"

namespace mm::models {

// ---------------------------------------------------------------------------------------------
// Config

namespace {

using nlohmann::json;

// Keys diffusers writes that change nothing here; image conditioning is refused by from_json.
const std::vector<std::string> kIgnoredKeys = {"_class_name", "_diffusers_version", "_name_or_path", "model_type",
                                               "architectures"};
const std::vector<std::string> kImageKeys = {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"};

}  // namespace

std::array<int64_t, 3> WanDiTConfig::rope_dims() const {
  const int64_t d = attention_head_dim;
  return {d - 4 * (d / 6), 2 * (d / 6), 2 * (d / 6)};
}

WanDiTConfig WanDiTConfig::from_json(const json& j, const std::string& source, bool strict) {
  WanDiTConfig c;
  std::vector<std::string> other = kIgnoredKeys;
  other.insert(other.end(), kImageKeys.begin(), kImageKeys.end());
  read_hf_fields(c, j, source, strict, "", "wan_dit", other);
  HFConfigReader f(j, source, "", "wan_dit");
  for (const auto& k : kImageKeys)
    if (f.has(k.c_str()) && !f.at(k.c_str()).is_null())
      f.fail(k, "is set: image conditioning (image-to-video) is not implemented for wan_dit");
  if (c.patch_size.size() != 3) f.fail("patch_size", cat("must hold 3 numbers (t, h, w), got ", c.patch_size.size()));
  if (c.attention_head_dim % 2 != 0 || c.attention_head_dim < 6)
    f.fail("attention_head_dim", cat("must be even and at least 6 for the 3-D rotary embedding (got ",
                                     c.attention_head_dim, ")"));
  return c;
}

json WanDiTConfig::to_json() const {
  json j = write_hf_fields(*this);
  j["_class_name"] = "WanTransformer3DModel";
  j["_diffusers_version"] = "0.42.1";
  for (const auto& k : kImageKeys) j[k] = nullptr;
  return j;
}

int64_t WanDiTConfig::num_parameters() const {
  const int64_t d = dim();
  const int64_t attn = 4 * (d * d + d) + 2 * d;  // q, k, v, o with biases; RMSNorm on q and k
  const int64_t block = 2 * attn + (cross_attn_norm ? 2 * d : 0) + (d * ffn_dim + ffn_dim) + (ffn_dim * d + d) + 6 * d;
  const int64_t patch = in_channels * patch_volume() * d + d;
  const int64_t time = (freq_dim * d + d) + (d * d + d) + (d * 6 * d + 6 * d);
  const int64_t text = (text_dim * d + d) + (d * d + d);
  const int64_t head = 2 * d + (d * out_channels * patch_volume() + out_channels * patch_volume());
  return patch + time + text + num_layers * block + head;
}

double WanDiTConfig::training_flops(int64_t tokens, int64_t text_len) const {
  const double d = static_cast<double>(dim()), s = static_cast<double>(tokens), l = static_cast<double>(text_len);
  // Per latent token: patch embedding, each block's q/k/v/o, cross q/o, FFN, the head. Per text
  // token: the text embedder and each block's cross-attention k/v.
  const double per_token = static_cast<double>(in_channels * patch_volume()) * d +
                           static_cast<double>(num_layers) * (6 * d * d + 2 * d * static_cast<double>(ffn_dim)) +
                           d * static_cast<double>(out_channels * patch_volume());
  const double per_text = static_cast<double>(text_dim) * d + d * d + static_cast<double>(num_layers) * 2 * d * d;
  const double attention = static_cast<double>(num_layers) * 12 * d * s * (s + l);
  return 6 * (per_token * s + per_text * l) + attention;
}

// ---------------------------------------------------------------------------------------------
// Layers

namespace {

// LayerNorm without weights, in fp32 (diffusers' FP32LayerNorm with elementwise_affine=False).
at::Tensor plain_layer_norm(const at::Tensor& x, double eps) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, {}, {}, eps);
}

// x [B, H, S, D] with pairs (2i, 2i+1) rotated by the angles whose cos, sin are [S, D / 2].
at::Tensor rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor xf = x.to(at::kFloat).unflatten(-1, {-1, 2});
  const at::Tensor x1 = xf.select(-1, 0), x2 = xf.select(-1, 1);
  return at::stack({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1).flatten(-2).to(x.scalar_type());
}

}  // namespace

WanAttention::WanAttention(const WanDiTConfig& c, at::ScalarType dtype)
    : num_heads(c.num_attention_heads), head_dim(c.attention_head_dim) {
  const int64_t d = c.dim();
  to_q = register_module("to_q", std::make_shared<Linear>(d, d, true, dtype));
  to_k = register_module("to_k", std::make_shared<Linear>(d, d, true, dtype));
  to_v = register_module("to_v", std::make_shared<Linear>(d, d, true, dtype));
  auto out = register_module("to_out", std::make_shared<mm::nn::Module>());
  to_out = out->register_module("0", std::make_shared<Linear>(d, d, true, dtype));
  norm_q = register_module("norm_q", std::make_shared<RMSNorm>(d, c.eps, dtype));
  norm_k = register_module("norm_k", std::make_shared<RMSNorm>(d, c.eps, dtype));
}

at::Tensor WanAttention::forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& cos,
                                 const at::Tensor& sin) const {
  const at::Tensor& kv_in = context.defined() ? context : x;
  const int64_t b = x.size(0);
  auto heads = [&](const at::Tensor& t) { return t.view({b, t.size(1), num_heads, head_dim}).transpose(1, 2); };
  at::Tensor q = heads(norm_q->forward(to_q->forward(x)));
  at::Tensor k = heads(norm_k->forward(to_k->forward(kv_in)));
  at::Tensor v = heads(to_v->forward(kv_in));
  if (!context.defined()) {
    q = rotate_pairs(q, cos, sin);
    k = rotate_pairs(k, cos, sin);
  }
  at::Tensor o = attention_core && !context.defined() ? attention_core->attend(q, k, v, false, c10::nullopt)
                                                      : models::scaled_dot_product_attention(q, k, v);
  return to_out->forward(o.transpose(1, 2).reshape({b, x.size(1), num_heads * head_dim}));
}

WanTransformerBlock::WanTransformerBlock(const WanDiTConfig& c, at::ScalarType dtype) : eps(c.eps) {
  const int64_t d = c.dim();
  attn1 = register_module("attn1", std::make_shared<WanAttention>(c, dtype));
  attn2 = register_module("attn2", std::make_shared<WanAttention>(c, dtype));
  if (c.cross_attn_norm) norm2 = register_module("norm2", std::make_shared<LayerNorm>(d, c.eps, at::kFloat));
  auto ffn = register_module("ffn", std::make_shared<mm::nn::Module>());
  auto net = ffn->register_module("net", std::make_shared<mm::nn::Module>());
  auto gelu = net->register_module("0", std::make_shared<mm::nn::Module>());
  ffn_in = gelu->register_module("proj", std::make_shared<Linear>(d, c.ffn_dim, true, dtype));
  ffn_out = net->register_module("2", std::make_shared<Linear>(c.ffn_dim, d, true, dtype));
  scale_shift_table = register_parameter("scale_shift_table", at::zeros({1, 6, d}, at::TensorOptions().dtype(at::kFloat)));
}

at::Tensor WanTransformerBlock::forward(const at::Tensor& x, const mm::nn::ForwardContext& ctx) {
  const auto dtype = x.scalar_type();
  // shift, scale, gate of self-attention, then of the MLP: [B, 1, dim] each, fp32.
  const std::vector<at::Tensor> m = (scale_shift_table + ctx.modulation.to(at::kFloat)).chunk(6, 1);
  at::Tensor h = (plain_layer_norm(x, eps) * (1 + m[1]) + m[0]).to(dtype);
  at::Tensor out = (x.to(at::kFloat) + attn1->forward(h, {}, ctx.cos, ctx.sin) * m[2]).to(dtype);
  h = norm2 ? norm2->forward(out.to(at::kFloat)).to(dtype) : out;
  out = out + attn2->forward(h, ctx.context, {}, {});
  h = (plain_layer_norm(out, eps) * (1 + m[4]) + m[3]).to(dtype);
  const at::Tensor ff = ffn_out->forward(at::gelu(ffn_in->forward(h), "tanh"));
  return (out.to(at::kFloat) + ff.to(at::kFloat) * m[5]).to(dtype);
}

// ---------------------------------------------------------------------------------------------
// Model

WanTransformer3DModel::WanTransformer3DModel(const WanDiTConfig& c, at::ScalarType dtype) : config(c) {
  const int64_t d = c.dim();
  const auto opts = at::TensorOptions().dtype(dtype);
  auto patch = register_module("patch_embedding", std::make_shared<mm::nn::Module>());
  patch_weight = patch->register_parameter(
      "weight", at::zeros({d, c.in_channels, c.patch_size[0], c.patch_size[1], c.patch_size[2]}, opts));
  patch_bias = patch->register_parameter("bias", at::zeros({d}, opts));
  auto cond = register_module("condition_embedder", std::make_shared<mm::nn::Module>());
  auto time = cond->register_module("time_embedder", std::make_shared<mm::nn::Module>());
  // diffusers keeps the time embedder in fp32 (_keep_in_fp32_modules).
  time_linear_1 = time->register_module("linear_1", std::make_shared<Linear>(c.freq_dim, d, true, at::kFloat));
  time_linear_2 = time->register_module("linear_2", std::make_shared<Linear>(d, d, true, at::kFloat));
  time_proj = cond->register_module("time_proj", std::make_shared<Linear>(d, 6 * d, true, dtype));
  auto text = cond->register_module("text_embedder", std::make_shared<mm::nn::Module>());
  text_linear_1 = text->register_module("linear_1", std::make_shared<Linear>(c.text_dim, d, true, dtype));
  text_linear_2 = text->register_module("linear_2", std::make_shared<Linear>(d, d, true, dtype));
  auto list = register_module("blocks", std::make_shared<mm::nn::Module>());
  for (int64_t i = 0; i < c.num_layers; ++i)
    blocks_.push_back(list->register_module(std::to_string(i), std::make_shared<WanTransformerBlock>(c, dtype)));
  proj_out = register_module("proj_out", std::make_shared<Linear>(d, c.out_channels * c.patch_volume(), true, dtype));
  scale_shift_table = register_parameter("scale_shift_table", at::zeros({1, 2, d}, at::TensorOptions().dtype(at::kFloat)));

}

std::pair<at::Tensor, at::Tensor> WanTransformer3DModel::rotary_tables(int64_t f, int64_t h, int64_t w,
                                                                       at::Device device) const {
  MM_CHECK(std::max({f, h, w}) <= config.rope_max_seq_len, "wan_dit: a latent grid of ", f, " x ", h, " x ", w,
           " tokens is longer than rope_max_seq_len ", config.rope_max_seq_len, " on one axis");
  // Angles position x frequency per axis part, in float64 (as diffusers and Wan).
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto axis = [&](int64_t part, int64_t n) {
    const at::Tensor inv = 1.0 / at::pow(10000.0, at::arange(0, part, 2, f64) / static_cast<double>(part));
    return at::outer(at::arange(n, f64), inv);
  };
  const auto dims = config.rope_dims();
  const int64_t ft = dims[0] / 2, hh = dims[1] / 2, ww = dims[2] / 2;
  const at::Tensor af = axis(dims[0], f).view({f, 1, 1, ft}).expand({f, h, w, ft});
  const at::Tensor ah = axis(dims[1], h).view({1, h, 1, hh}).expand({f, h, w, hh});
  const at::Tensor aw = axis(dims[2], w).view({1, 1, w, ww}).expand({f, h, w, ww});
  const at::Tensor angles = at::cat({af, ah, aw}, -1).reshape({f * h * w, ft + hh + ww});
  return {angles.cos().to(at::kFloat).to(device), angles.sin().to(at::kFloat).to(device)};
}

std::pair<at::Tensor, at::Tensor> WanTransformer3DModel::time_embedding(const at::Tensor& timesteps) const {
  // Sinusoids [cos | sin] of t * 10000^(-i / half), as diffusers' Timesteps(flip_sin_to_cos).
  const int64_t half = config.freq_dim / 2;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(timesteps.device());
  const at::Tensor freqs = at::exp(-std::log(10000.0) * at::arange(half, f32) / static_cast<double>(half));
  const at::Tensor args = timesteps.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  at::Tensor sinusoid = at::cat({at::cos(args), at::sin(args)}, -1);
  if (config.freq_dim % 2 == 1) sinusoid = at::constant_pad_nd(sinusoid, {0, 1});
  // temb in the model's dtype (diffusers: type_as the text features).
  const at::Tensor temb = time_linear_2->forward(at::silu(time_linear_1->forward(sinusoid.to(time_linear_1->weight.scalar_type()))))
                              .to(time_proj->weight.scalar_type());
  const at::Tensor modulation =
      time_proj->forward(at::silu(temb)).unflatten(1, {6, config.dim()});
  return {temb, modulation};
}

at::Tensor WanTransformer3DModel::forward(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& text) {
  Outputs carry;
  run_blocks(latents, timesteps, text, 0, config.num_layers, carry);
  return carry.require_tensor(kPrediction);
}

void WanTransformer3DModel::run_blocks(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& text,
                                       int64_t begin, int64_t end, Outputs& carry) {
  MM_CHECK(latents.dim() == 5 && latents.size(1) == config.in_channels, "wan_dit: latents must be [B, ",
           config.in_channels, ", F, H, W], got ", latents.sizes());
  const int64_t b = latents.size(0);
  const auto& p = config.patch_size;
  for (int i = 0; i < 3; ++i)
    MM_CHECK(latents.size(2 + i) % p[static_cast<size_t>(i)] == 0, "wan_dit: latents ", latents.sizes(),
             " do not divide into patches of ", p[0], " x ", p[1], " x ", p[2]);
  MM_CHECK(timesteps.dim() == 1 && timesteps.size(0) == b, "wan_dit: timesteps must be [", b, "], got ", timesteps.sizes());
  MM_CHECK(text.dim() == 3 && text.size(0) == b && text.size(2) == config.text_dim, "wan_dit: text features must be [",
           b, ", L, ", config.text_dim, "], got ", text.sizes());
  const int64_t f = latents.size(2) / p[0], h = latents.size(3) / p[1], w = latents.size(4) / p[2];
  const auto dtype = patch_weight.scalar_type();

  mm::nn::ForwardContext ctx;
  std::tie(ctx.cos, ctx.sin) = rotary_tables(f, h, w, latents.device());
  ctx.causal = false;
  at::Tensor x, temb;
  if (begin == 0) {
    x = at::conv3d(latents.to(dtype), patch_weight, patch_bias, {p[0], p[1], p[2]});
    x = x.flatten(2).transpose(1, 2).contiguous();  // [B, f * h * w, dim]
    std::tie(temb, ctx.modulation) = time_embedding(timesteps);
    ctx.context = text_linear_2->forward(at::gelu(text_linear_1->forward(text.to(dtype)), "tanh"));
  } else {
    x = carry.require_tensor("hidden");
    temb = carry.require_tensor("temb");
    ctx.modulation = carry.require_tensor("modulation");
    ctx.context = carry.require_tensor("context");
  }
  for (int64_t i = begin; i < end; ++i) x = blocks_[static_cast<size_t>(i)]->call(x, ctx);
  carry = Outputs();
  if (end < config.num_layers) {
    carry.set("hidden", x);
    carry.set("temb", temb);
    carry.set("modulation", ctx.modulation);
    carry.set("context", ctx.context);
    return;
  }
  const std::vector<at::Tensor> ss = (scale_shift_table + temb.to(at::kFloat).unsqueeze(1)).chunk(2, 1);
  x = (plain_layer_norm(x, config.eps) * (1 + ss[1]) + ss[0]).to(dtype);
  x = proj_out->forward(x);  // [B, f * h * w, pt * ph * pw * C]
  x = x.reshape({b, f, h, w, p[0], p[1], p[2], config.out_channels}).permute({0, 7, 1, 4, 2, 5, 3, 6});
  carry.set(kPrediction, x.reshape({b, config.out_channels, f * p[0], h * p[1], w * p[2]}));
}

Outputs WanTransformer3DModel::forward(const data::Batch& batch) {
  Outputs out;
  out.set(kPrediction, forward(batch.require_tensor(kNoisyLatents), batch.require_tensor(kTimesteps),
                               batch.require_tensor(kPromptEmbeds)));
  return out;
}

std::vector<std::string> WanTransformer3DModel::required_fields() const {
  return {std::string(kNoisyLatents), std::string(kTimesteps), std::string(kPromptEmbeds)};
}

// Wan's own initialisation (its WanModel.init_weights): Xavier-uniform linears and patch
// embedding with zero biases, N(0, 0.02) text and time embedders, a zero output head; the
// modulation tables ~ N(0, 1/dim) as constructed there; norms at 1.
void WanTransformer3DModel::init_weights(uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto xavier = [&](at::Tensor& w) {
    const auto shape = mm::nn::full_shape(w);
    int64_t fan_in = 1;
    for (size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
    mm::nn::init_param_uniform(w, std::sqrt(6.0 / static_cast<double>(fan_in + shape[0])), gen);
  };
  std::function<void(mm::nn::Module&)> visit = [&](mm::nn::Module& m) {
    if (auto* lin = dynamic_cast<Linear*>(&m)) {
      xavier(lin->weight);
      mm::nn::init_param_fill(lin->bias, 0.0);
    } else if (auto* rms = dynamic_cast<RMSNorm*>(&m)) {
      mm::nn::init_param_fill(rms->weight, 1.0);
    } else if (auto* ln = dynamic_cast<LayerNorm*>(&m)) {
      mm::nn::init_param_fill(ln->weight, 1.0);
      mm::nn::init_param_fill(ln->bias, 0.0);
    } else if (auto* block = dynamic_cast<WanTransformerBlock*>(&m)) {
      mm::nn::init_param_normal(block->scale_shift_table, 1.0 / std::sqrt(static_cast<double>(config.dim())), gen);
    }
    for (auto& [_, child] : m.children()) visit(*child);
  };
  xavier(patch_weight);
  mm::nn::init_param_fill(patch_bias, 0.0);
  visit(*this);
  for (Linear* lin : {text_linear_1.get(), text_linear_2.get(), time_linear_1.get(), time_linear_2.get()})
    mm::nn::init_param_normal(lin->weight, 0.02, gen);
  mm::nn::init_param_normal(scale_shift_table, 1.0 / std::sqrt(static_cast<double>(config.dim())), gen);
  mm::nn::init_param_fill(proj_out->weight, 0.0);
}

// Megatron's layout for each attention and MLP: q/k/v and the MLP's first layer column-parallel
// (heads split), the output projections row-parallel; q/k's RMSNorm across heads sees every
// rank's features (colwise_norm). Embedders, modulation and the head stay whole.
PlanTable WanTransformer3DModel::plans() const {
  PlanTable t;
  t.fsdp_units = {"blocks.{*}"};
  for (const char* attn : {"attn1", "attn2"}) {
    const std::string a = cat("blocks.{*}.", attn);
    t.tensor_parallel.insert(t.tensor_parallel.end(), {{a, "heads"},
                                                       {a + ".to_q", "colwise"},
                                                       {a + ".to_k", "colwise"},
                                                       {a + ".to_v", "colwise"},
                                                       {a + ".to_out.0", "rowwise"},
                                                       {a + ".norm_q", "colwise_norm"},
                                                       {a + ".norm_k", "colwise_norm"}});
  }
  t.tensor_parallel.insert(t.tensor_parallel.end(),
                           {{"blocks.{*}.ffn.net.0.proj", "colwise"}, {"blocks.{*}.ffn.net.2", "rowwise"}});
  // Context parallelism: the patches cut among the ranks between the first and last block; the
  // self-attention reaches the others' (the cross-attention's text is whole on every rank).
  t.context_parallel = {"blocks.{*}.attn1"};
  t.context_parallel_blocks = {"blocks.{*}"};
  t.context_parallel_length = [p = config.patch_size](const data::Batch& b) {
    const at::Tensor& x = b.has(data::kNoisyLatents) ? b[data::kNoisyLatents] : b.require(data::kLatents);
    return std::make_pair(x.size(0), (x.size(2) / p[0]) * (x.size(3) / p[1]) * (x.size(4) / p[2]));
  };
  return t;
}

std::vector<PipelineSubmodule> WanTransformer3DModel::pipeline_submodules() const {
  PipelineSubmodule s;
  s.name = "blocks";
  s.num_layers = config.num_layers;
  s.layer_prefix = "blocks.";
  s.before = {"patch_embedding.", "condition_embedder."};
  s.after = {"scale_shift_table", "proj_out."};
  return {s};
}

void WanTransformer3DModel::pipeline_forward(size_t, int64_t begin, int64_t end, Outputs& carry, const data::Batch& batch) {
  run_blocks(batch.require_tensor(kNoisyLatents), batch.require_tensor(kTimesteps), batch.require_tensor(kPromptEmbeds),
             begin, end, carry);
}

// The host copy of a training batch holds the clean latents (the objective makes the noisy ones
// on the device); either has the shape that sizes the work.
static const at::Tensor& latents_of(const data::Batch& host) {
  return host.has(kNoisyLatents) ? host[kNoisyLatents] : host[data::kLatents];
}

double WanTransformer3DModel::input_tokens(const data::Batch& host) const {
  const at::Tensor& x = latents_of(host);
  if (!x.defined()) return 0;
  return static_cast<double>(x.size(0) * x.size(2) * x.size(3) * x.size(4) / config.patch_volume());
}

double WanTransformer3DModel::training_flops(const data::Batch& host) const {
  const at::Tensor& x = latents_of(host);
  const at::Tensor& text = host[kPromptEmbeds];
  if (!x.defined()) return 0;
  const int64_t tokens = x.size(2) * x.size(3) * x.size(4) / config.patch_volume();
  return static_cast<double>(x.size(0)) * config.training_flops(tokens, text.defined() ? text.size(1) : 0);
}

std::string WanTransformer3DModel::cost_summary(int64_t) const {
  // A 480p 81-frame clip: 21 x 60 x 104 latents, tokens after the patches, 512 text tokens.
  const int64_t tokens = 21 * (60 / config.patch_size[1]) * (104 / config.patch_size[2]) / config.patch_size[0];
  return cat(log::fixed(config.training_flops(tokens, 512) / 1e12, 1), " TFLOP to train on one 480p 81-frame clip");
}

// ---------------------------------------------------------------------------------------------
// Names: diffusers <-> the original Wan checkpoints

namespace {

// (diffusers, original) prefixes; a name without a trailing dot is a whole name.
const std::vector<std::pair<std::string, std::string>> kTopNames = {
    {"condition_embedder.time_embedder.linear_1.", "time_embedding.0."},
    {"condition_embedder.time_embedder.linear_2.", "time_embedding.2."},
    {"condition_embedder.text_embedder.linear_1.", "text_embedding.0."},
    {"condition_embedder.text_embedder.linear_2.", "text_embedding.2."},
    {"condition_embedder.time_proj.", "time_projection.1."},
    {"scale_shift_table", "head.modulation"},
    {"proj_out.", "head.head."},
};
const std::vector<std::pair<std::string, std::string>> kBlockNames = {
    {"attn1.to_q.", "self_attn.q."},   {"attn1.to_k.", "self_attn.k."},   {"attn1.to_v.", "self_attn.v."},
    {"attn1.to_out.0.", "self_attn.o."}, {"attn1.norm_q.", "self_attn.norm_q."}, {"attn1.norm_k.", "self_attn.norm_k."},
    {"attn2.to_q.", "cross_attn.q."},  {"attn2.to_k.", "cross_attn.k."},  {"attn2.to_v.", "cross_attn.v."},
    {"attn2.to_out.0.", "cross_attn.o."}, {"attn2.norm_q.", "cross_attn.norm_q."}, {"attn2.norm_k.", "cross_attn.norm_k."},
    {"norm2.", "norm3."},              {"ffn.net.0.proj.", "ffn.0."},     {"ffn.net.2.", "ffn.2."},
    {"scale_shift_table", "modulation"},
};

// Maps `name` by the first table entry whose `from` side matches; unchanged when none does.
std::string rename(const std::string& name, bool to_original) {
  auto apply = [&](const std::string& rest, const std::vector<std::pair<std::string, std::string>>& table,
                   std::string* out) {
    for (const auto& [diffusers, original] : table) {
      const std::string& from = to_original ? diffusers : original;
      const std::string& to = to_original ? original : diffusers;
      const bool prefix = from.back() == '.';
      if (prefix ? rest.rfind(from, 0) == 0 : rest == from) {
        *out = to + rest.substr(from.size());
        return true;
      }
    }
    return false;
  };
  std::string out;
  if (name.rfind("blocks.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    if (dot != std::string::npos && apply(name.substr(dot + 1), kBlockNames, &out)) return name.substr(0, dot + 1) + out;
    return name;
  }
  return apply(name, kTopNames, &out) ? out : name;
}

}  // namespace

std::string wan_dit_original_name(const std::string& diffusers_name) { return rename(diffusers_name, true); }

std::string wan_dit_diffusers_name(const std::string& original_name) {
  // ComfyUI-style single files prefix every name.
  const std::string prefix = "model.diffusion_model.";
  const std::string name = original_name.rfind(prefix, 0) == 0 ? original_name.substr(prefix.size()) : original_name;
  return rename(name, false);
}

std::string WanTransformer3DModel::parameter_name(const std::string& checkpoint_name) const {
  return wan_dit_diffusers_name(checkpoint_name);
}

namespace {
const mm::Registrar kSizeWanDiT(model_size_registry(), "wan_dit", [](const nlohmann::json& hf, const std::string& source, bool strict) {
  const WanDiTConfig c = WanDiTConfig::from_json(hf, source, strict);
  ModelSize s{{{"transformer", c.num_parameters()}}};
  // Wan's VAE: 4x8x8 compression, 4n + 1 frames -> n + 1 latent frames; 512 text tokens.
  for (const auto& [name, h, w] : {std::tuple<const char*, int64_t, int64_t>{"480p", 480, 832}, {"720p", 720, 1280}}) {
    const int64_t tokens = 21 * (h / 8 / c.patch_size[1]) * (w / 8 / c.patch_size[2]) / c.patch_size[0];
    s.sample_flops.emplace_back(cat(name, " 81-frame clip (", tokens, " latent tokens, 512 text tokens)"),
                                c.training_flops(tokens, 512));
  }
  return s;
});
const mm::Registrar kRegisterWanDiT(model_registry(), "wan_dit", [](const nlohmann::json& hf, const std::string& source, bool strict) {
  return std::static_pointer_cast<Model>(std::make_shared<WanTransformer3DModel>(WanDiTConfig::from_json(hf, source, strict)));
});
}  // namespace

}  // namespace mm::models
