// LLaVA: CLIP ViT features, MLP projector, LLaMA/Qwen2 decoder.
#include "mindspeed_mm/models/llava/llava.h"

#include "mindspeed_mm/core/param_init.h"

#include <ATen/CPUGeneratorImpl.h>

#include <set>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/attention.h"

namespace mm::models {

using nlohmann::json;


ClipVisionConfig ClipVisionConfig::from_json(const json& j, const std::string& source) {
  // LlavaConfig's default vision tower is CLIP ViT-L/14 at 336 pixels.
  ClipVisionConfig c;
  c.hidden_size = 1024;
  c.intermediate_size = 4096;
  c.num_hidden_layers = 24;
  c.num_attention_heads = 16;
  c.image_size = 336;
  c.patch_size = 14;
  c.projection_dim = 768;
  if (j.is_null()) return c;
  read_hf_fields(c, j, source, /*strict=*/false, "vision_config.", "llava");
  if (j.contains("model_type") && j.at("model_type").is_string() && j.at("model_type") != "clip_vision_model")
    throw ConfigError(cat("config: vision_config.model_type '", j.at("model_type").get<std::string>(),
                          "' is not supported (clip_vision_model) in ", source));
  activation_from_name(c.hidden_act, source);
  if (c.hidden_size % c.num_attention_heads != 0)
    throw ConfigError(cat("config: vision_config.hidden_size (", c.hidden_size, ") must be a multiple of num_attention_heads (",
                          c.num_attention_heads, ") in ", source));
  if (c.image_size % c.patch_size != 0)
    throw ConfigError(cat("config: vision_config.image_size (", c.image_size, ") must be a multiple of patch_size (",
                          c.patch_size, ") in ", source));
  return c;
}

json ClipVisionConfig::to_json() const {
  json j = write_hf_fields(*this);
  j["model_type"] = "clip_vision_model";
  return j;
}

int64_t LlavaConfig::image_tokens() const {
  return vision.num_patches() + (vision_feature_select_strategy == "full" ? 1 : 0);
}

int64_t LlavaConfig::vision_layers_used() const {
  return vision_feature_layer < 0 ? vision.num_hidden_layers + 1 + vision_feature_layer : vision_feature_layer;
}

LlavaConfig LlavaConfig::from_json(const json& j, const std::string& source, bool strict) {
  LlavaConfig c;
  if (j.is_object() && j.contains("vision_feature_layer") && !j.at("vision_feature_layer").is_null() &&
      !j.at("vision_feature_layer").is_number_integer())
    throw ConfigError(cat("config: vision_feature_layer must be one integer (lists of layers are not supported) in ", source));
  read_hf_fields(c, j, source, strict, "", "llava",
                 {"architectures", "model_type", "transformers_version", "torch_dtype", "text_config", "vision_config",
                  "image_token_id", "ignore_index", "pad_token_id", "image_seq_length", "tie_word_embeddings",
                  "vocab_size", "_name_or_path"});
  HFConfigReader(j, source, "", "llava")("image_token_id", c.image_token_index, config::gt(0));  // transformers >= 5's name
  activation_from_name(c.projector_hidden_act, source);
  c.vision = ClipVisionConfig::from_json(j.contains("vision_config") ? j.at("vision_config") : json(nullptr), source);
  const int64_t used = c.vision_layers_used();
  if (used < 0 || used > c.vision.num_hidden_layers)
    throw ConfigError(cat("config: vision_feature_layer ", c.vision_feature_layer, " is outside the tower's ",
                          c.vision.num_hidden_layers, " layers in ", source));

  // The decoder: text_config with LlamaConfig's (or Qwen2Config's) defaults for what it omits.
  json text = j.contains("text_config") && j.at("text_config").is_object() ? j.at("text_config") : json::object();
  c.text_model_type = hf_string(text, "model_type", "llama");
  if (c.text_model_type != "llama" && c.text_model_type != "qwen2")
    throw ConfigError(cat("config: text_config.model_type must be llama or qwen2 (got '", c.text_model_type, "') in ", source));
  const bool llama = c.text_model_type == "llama";
  const json defaults = llama ? json{{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", 11008},
                                     {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                                     {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-6},
                                     {"attention_bias", false}}
                              : json{{"vocab_size", 151936}, {"hidden_size", 4096}, {"intermediate_size", 22016},
                                     {"num_hidden_layers", 32}, {"num_attention_heads", 32}};
  if (!text.contains("vocab_size") && j.contains("vocab_size")) text["vocab_size"] = j.at("vocab_size");  // older files
  for (auto& [k, v] : defaults.items())
    if (!text.contains(k) || text.at(k).is_null()) text[k] = v;
  if (!strict)
    for (const char* k : {"pretraining_tp", "mlp_bias", "head_dim", "_name_or_path"}) text.erase(k);
  c.text = Qwen2Config::from_json(text, source + " (text_config)", strict);
  return c;
}

json LlavaConfig::to_json() const {
  json t = text.to_json();
  t["model_type"] = text_model_type;
  t["architectures"] = json::array({text_model_type == "llama" ? "LlamaForCausalLM" : "Qwen2ForCausalLM"});
  if (text_model_type == "llama") t["attention_bias"] = text.attention_bias;
  json j = write_hf_fields(*this);
  j["architectures"] = json::array({"LlavaForConditionalGeneration"});
  j["model_type"] = "llava";
  j["text_config"] = t;
  j["vision_config"] = vision.to_json();
  return j;
}

int64_t LlavaConfig::vision_parameters() const {
  const int64_t E = vision.hidden_size, I = vision.intermediate_size;
  const int64_t P = vision.patch_size, C = vision.num_channels, N = vision.num_patches() + 1;
  const int64_t layer = 4 * (E * E + E) + (E * I + I) + (I * E + E) + 4 * E;
  return E + E * C * P * P + N * E + 2 * E + vision.num_hidden_layers * layer + 2 * E;
}

int64_t LlavaConfig::projector_parameters() const {
  const int64_t E = vision.hidden_size, H = text.hidden_size, bias = multimodal_projector_bias ? 1 : 0;
  return E * H + bias * H + H * H + bias * H;
}

int64_t LlavaConfig::num_parameters() const {
  return vision_parameters() + projector_parameters() + text.num_parameters();
}

double LlavaConfig::vision_training_flops(int64_t images) const {
  const double E = static_cast<double>(vision.hidden_size), I = static_cast<double>(vision.intermediate_size);
  const double H = static_cast<double>(text.hidden_size), np = static_cast<double>(vision.num_patches());
  const double T = np + 1, L = static_cast<double>(vision_layers_used());
  const double patch = static_cast<double>(vision.num_channels * vision.patch_size * vision.patch_size) * E;
  const double per_image = 6 * (np * patch + L * T * (4 * E * E + 2 * E * I) +
                                static_cast<double>(image_tokens()) * (E * H + H * H)) +
                           12 * E * T * T * L;
  return per_image * static_cast<double>(images);
}

double LlavaConfig::projector_training_flops(int64_t images) const {
  const double E = static_cast<double>(vision.hidden_size), H = static_cast<double>(text.hidden_size);
  return 6 * static_cast<double>(image_tokens()) * (E * H + H * H) * static_cast<double>(images);
}

ClipAttention::ClipAttention(const ClipVisionConfig& c, at::ScalarType dtype)
    : num_heads(c.num_attention_heads), head_dim(c.hidden_size / c.num_attention_heads) {
  const int64_t E = c.hidden_size;
  q_proj = register_module("q_proj", std::make_shared<Linear>(E, E, true, dtype));
  k_proj = register_module("k_proj", std::make_shared<Linear>(E, E, true, dtype));
  v_proj = register_module("v_proj", std::make_shared<Linear>(E, E, true, dtype));
  out_proj = register_module("out_proj", std::make_shared<Linear>(E, E, true, dtype));
}

at::Tensor ClipAttention::forward(const at::Tensor& x) const {
  const int64_t n = x.size(0), T = x.size(1);
  auto heads = [&](const at::Tensor& t) { return t.view({n, T, num_heads, head_dim}).transpose(1, 2); };
  at::Tensor o = scaled_dot_product_attention(heads(q_proj->forward(x)), heads(k_proj->forward(x)),
                                              heads(v_proj->forward(x)), {}, /*causal=*/false);
  return out_proj->forward(o.transpose(1, 2).reshape({n, T, num_heads * head_dim}));
}

ClipEncoderLayer::ClipEncoderLayer(const ClipVisionConfig& c, at::ScalarType dtype) {
  self_attn = register_module("self_attn", std::make_shared<ClipAttention>(c, dtype));
  layer_norm1 = register_module("layer_norm1", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps, dtype));
  mlp = register_module("mlp", std::make_shared<FcMLP>(c.hidden_size, c.intermediate_size,
                                                       activation_from_name(c.hidden_act, "vision_config"), dtype));
  layer_norm2 = register_module("layer_norm2", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps, dtype));
}

at::Tensor ClipEncoderLayer::forward(const at::Tensor& x, const mm::nn::ForwardContext&) {
  at::Tensor h = x + self_attn->forward(layer_norm1->forward(x));
  return h + mlp->forward(layer_norm2->forward(h));
}

ClipVisionTransformer::ClipVisionTransformer(const ClipVisionConfig& c, at::ScalarType dtype) : config(c) {
  auto opts = at::TensorOptions().dtype(dtype);
  auto emb = register_module("embeddings", std::make_shared<mm::nn::Module>());
  class_embedding = emb->register_parameter("class_embedding", at::zeros({c.hidden_size}, opts));
  auto patch = emb->register_module("patch_embedding", std::make_shared<mm::nn::Module>());
  patch_embedding_weight =
      patch->register_parameter("weight", at::zeros({c.hidden_size, c.num_channels, c.patch_size, c.patch_size}, opts));
  auto pos = emb->register_module("position_embedding", std::make_shared<mm::nn::Module>());
  position_embedding_weight = pos->register_parameter("weight", at::zeros({c.num_patches() + 1, c.hidden_size}, opts));
  pre_layrnorm = register_module("pre_layrnorm", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps, dtype));
  auto enc = register_module("encoder", std::make_shared<mm::nn::Module>());
  auto list = enc->register_module("layers", std::make_shared<mm::nn::Module>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(list->register_module(std::to_string(i), std::make_shared<ClipEncoderLayer>(c, dtype)));
  post_layernorm = register_module("post_layernorm", std::make_shared<LayerNorm>(c.hidden_size, c.layer_norm_eps, dtype));
}

at::Tensor ClipVisionTransformer::forward(const at::Tensor& pixel_values, int64_t num_layers) {
  const auto& c = config;
  MM_CHECK(pixel_values.dim() == 4 && pixel_values.size(1) == c.num_channels && pixel_values.size(2) == c.image_size &&
               pixel_values.size(3) == c.image_size,
           "llava vision: pixel_values must be [images, ", c.num_channels, ", ", c.image_size, ", ", c.image_size,
           "] (got ", pixel_values.sizes(), "): set data.processor.type: fixed and image_size: ", c.image_size);
  const int64_t n = pixel_values.size(0), G = c.image_size / c.patch_size, P = c.patch_size;
  const auto dtype = patch_embedding_weight.scalar_type();
  // Conv2d with kernel = stride = patch: a matmul over each patch's (channel, row, column) values.
  at::Tensor patches = pixel_values.to(dtype)
                           .view({n, c.num_channels, G, P, G, P})
                           .permute({0, 2, 4, 1, 3, 5})
                           .reshape({n, G * G, c.num_channels * P * P});
  at::Tensor h = at::matmul(patches, patch_embedding_weight.reshape({c.hidden_size, -1}).t());
  h = at::cat({class_embedding.view({1, 1, -1}).expand({n, 1, c.hidden_size}), h}, 1) + position_embedding_weight.unsqueeze(0);
  h = pre_layrnorm->forward(h);
  mm::nn::ForwardContext ctx;
  ctx.causal = false;
  for (int64_t i = 0; i < num_layers; ++i) {
    ctx.layer_index = i;
    h = layers[i]->call(h, ctx);
  }
  return h;
}

LlavaForConditionalGeneration::LlavaForConditionalGeneration(const LlavaConfig& c, at::ScalarType dtype)
    : config(c), projector_act(activation_from_name(c.projector_hidden_act, "projector_hidden_act")) {
  auto tower = register_module("vision_tower", std::make_shared<mm::nn::Module>());
  vision_model = tower->register_module("vision_model", std::make_shared<ClipVisionTransformer>(c.vision, dtype));
  auto proj = register_module("multi_modal_projector", std::make_shared<mm::nn::Module>());
  const bool bias = c.multimodal_projector_bias;
  linear_1 = proj->register_module("linear_1", std::make_shared<Linear>(c.vision.hidden_size, c.text.hidden_size, bias, dtype));
  linear_2 = proj->register_module("linear_2", std::make_shared<Linear>(c.text.hidden_size, c.text.hidden_size, bias, dtype));
  language_model = register_module("language_model", std::make_shared<Qwen2ForCausalLM>(c.text, dtype));
}

std::string LlavaForConditionalGeneration::parameter_name(const std::string& name) const {
  static const std::pair<std::string, std::string> kMap[] = {
      {"model.vision_tower.", "vision_tower."},
      {"model.multi_modal_projector.", "multi_modal_projector."},
      {"model.language_model.", "language_model.model."},
      {"lm_head.", "language_model.lm_head."}};
  for (const auto& [from, to] : kMap)
    if (name.compare(0, from.size(), from) == 0) return to + name.substr(from.size());
  return name;
}

std::string LlavaForConditionalGeneration::hf_module_path(const std::string& name) const {
  static const std::pair<std::string, std::string> kMap[] = {
      {"vision_tower.", "model.vision_tower."},
      {"multi_modal_projector.", "model.multi_modal_projector."},
      {"language_model.model.", "model.language_model."},
      {"language_model.lm_head.", "lm_head."}};
  for (const auto& [from, to] : kMap)
    if (name.compare(0, from.size(), from) == 0) return to + name.substr(from.size());
  return name;
}

void LlavaForConditionalGeneration::init_weights(uint64_t seed) {
  language_model->init_weights(seed);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x11A7Aull);
  const double std_dev = config.text.initializer_range;
  auto normal = [&](at::Tensor& t) { mm::nn::init_param_normal(t, std_dev, gen); };
  normal(vision_model->class_embedding);
  normal(vision_model->patch_embedding_weight);
  normal(vision_model->position_embedding_weight);
  for (auto& layer : vision_model->layers)
    for (auto* lin : {layer->self_attn->q_proj.get(), layer->self_attn->k_proj.get(), layer->self_attn->v_proj.get(),
                      layer->self_attn->out_proj.get(), layer->mlp->fc1.get(), layer->mlp->fc2.get()}) {
      normal(lin->weight);
      mm::nn::init_param_fill(lin->bias, 0.0);
    }
  for (auto* lin : {linear_1.get(), linear_2.get()}) {
    normal(lin->weight);
    if (lin->bias.defined()) mm::nn::init_param_fill(lin->bias, 0.0);
  }
}

at::Tensor LlavaForConditionalGeneration::image_features(const at::Tensor& pixel_values) {
  at::Tensor h = vision_model->forward(pixel_values, config.vision_layers_used());
  if (config.vision_feature_select_strategy == "default") h = h.narrow(1, 1, h.size(1) - 1);  // drop the class token
  return linear_2->forward(activate(linear_1->forward(h), projector_act));
}

at::Tensor LlavaForConditionalGeneration::forward(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                                  const at::Tensor& attn_mask) {
  return language_model->forward(input_ids, position_ids, attn_mask);
}

at::Tensor LlavaForConditionalGeneration::forward_multimodal(const MultimodalInputs& in) {
  return language_model->logits(forward_hidden(in));
}

at::Tensor LlavaForConditionalGeneration::forward_hidden(const MultimodalInputs& in) {
  MM_CHECK(in.input_ids.dim() == 2, "llava: input_ids must be [batch, seq] (got ", in.input_ids.sizes(), ")");
  MM_CHECK(!in.pixel_values_videos.defined(), "llava: the model takes images only, not videos");
  at::Tensor h = language_model->model->embed_tokens->forward(in.input_ids);
  if (in.pixel_values.defined()) {
    at::Tensor features = image_features(in.pixel_values);
    h = place_vision_features(h, in.input_ids, config.image_token_index, features.reshape({-1, features.size(-1)}),
                              "llava", "image",
                              cat(" for ", in.pixel_values.size(0), " image(s), ", config.image_tokens(),
                                  " each: set data.processor.image_tokens to ", config.image_tokens()));
  }
  return language_model->hidden_from_embeds(h, in);
}

double LlavaForConditionalGeneration::training_flops(const MultimodalInputs& in) const {
  return CausalLM::training_flops(in) + config.vision_training_flops(in.pixel_values.defined() ? in.pixel_values.size(0) : 0);
}

std::vector<std::pair<std::string, double>> LlavaForConditionalGeneration::training_flops_by_part(
    const data::Batch& host) const {
  const MultimodalInputs in = multimodal_inputs(host, /*attention=*/false);
  const int64_t images = in.pixel_values.defined() ? in.pixel_values.size(0) : 0;
  const double projector = config.projector_training_flops(images);
  return {{"vision_tower", config.vision_training_flops(images) - projector}, {"projector", projector},
          {"language_model", CausalLM::training_flops(in)}};
}

namespace {
const mm::Registrar kSizeLlava(model_size_registry(), "llava", [](const json& hf, const std::string& source, bool strict) {
  LlavaConfig c = LlavaConfig::from_json(hf, source, strict);
  ModelSize s{{{"vision tower", c.vision_parameters()},
               {"projector", c.projector_parameters()},
               {"language model", c.text.num_parameters()}}};
  s.flops_per_token = [c](int64_t seq) { return c.text.flops_per_token(seq); };
  s.image_flops = [c](int64_t, int64_t) { return c.vision_training_flops(1); };  // resized to image_size
  return s;
});
const mm::Registrar kRegisterLlava(model_registry(), "llava", [](const json& hf, const std::string& source, bool strict) {
  return std::static_pointer_cast<CausalLM>(
      std::make_shared<LlavaForConditionalGeneration>(LlavaConfig::from_json(hf, source, strict)));
});
}  // namespace

}  // namespace mm::models
