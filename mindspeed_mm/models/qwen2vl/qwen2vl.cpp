// Qwen2-VL: config, vision features into the token embeddings, M-RoPE decoder.
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"

#include "mindspeed_mm/core/param_init.h"

#include <ATen/CPUGeneratorImpl.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/kv_cache.h"
#include "mindspeed_mm/models/common/rope.h"

namespace mm::models {

using nlohmann::json;

Qwen2VLConfig Qwen2VLConfig::from_json(const json& j, const std::string& source, bool strict, bool qwen2_5) {
  const char* id = qwen2_5 ? "qwen2_5_vl" : "qwen2_vl";
  if (!j.is_object()) throw ConfigError(cat("config: a ", id, " model config must be an object in ", source));
  json text = j;
  // transformers >= 4.52 nests the language model's fields in text_config.
  // A copy: a text_config that itself holds "text_config" would otherwise be replaced while
  // it is being read (found by fuzz_model_config: a use after free).
  if (text.contains("text_config") && text.at("text_config").is_object()) {
    const json inner = text.at("text_config");
    for (const auto& [k, v] : inner.items())
      if (k != "model_type" && k != "architectures") text[k] = v;
  }
  text.erase("text_config");
  if (!strict) {
    text.erase("model_type");
    text.erase("architectures");
  }
  Qwen2VLConfig c;
  c.qwen2_5 = qwen2_5;
  {
    HFConfigReader ids(text, source, "", id);
    ids("image_token_id", c.rope_index.image_token_id);
    ids("video_token_id", c.rope_index.video_token_id);
    ids("vision_start_token_id", c.rope_index.vision_start_token_id);
    ids("vision_end_token_id", c.vision_end_token_id);
  }
  for (const char* k : {"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"}) text.erase(k);
  json vision = text.contains("vision_config") ? text.at("vision_config") : json(nullptr);
  json rope = text.contains("rope_scaling") ? text.at("rope_scaling") : json(nullptr);
  // transformers >= 5: the M-RoPE sections sit in rope_parameters beside rope_theta.
  if (rope.is_null() && text.contains("rope_parameters") && text.at("rope_parameters").is_object() &&
      text.at("rope_parameters").contains("mrope_section")) {
    rope = text.at("rope_parameters");
    json plain = rope;
    plain.erase("mrope_section");
    plain.erase("type");
    if (hf_string(plain, "rope_type", "default") == "mrope") plain["rope_type"] = "default";
    text["rope_parameters"] = plain;
  }
  text.erase("vision_config");
  text.erase("rope_scaling");
  c.text = Qwen2Config::from_json(text, source, strict);
  c.vision = Qwen2VLVisionConfig::from_json(vision, source, qwen2_5);
  // The merger maps into the language model's width.
  const char* out_key = qwen2_5 ? "out_hidden_size" : "hidden_size";
  if (!vision.is_object() || !vision.contains(out_key)) c.vision.hidden_size = c.text.hidden_size;
  if (c.vision.hidden_size != c.text.hidden_size)
    throw ConfigError(cat("config: vision_config.", out_key, " (", c.vision.hidden_size, ") must equal hidden_size (",
                          c.text.hidden_size, ") in ", source));
  c.rope_index.spatial_merge_size = c.vision.spatial_merge_size;
  c.rope_index.tokens_per_second = qwen2_5 ? c.vision.tokens_per_second : 0;
  if (rope.is_object() && rope.contains("mrope_section")) {
    HFConfigReader(rope, source, "rope_scaling.", id)("mrope_section", c.mrope_section, config::gt(0));
  } else if (!rope.is_null()) {
    throw ConfigError(cat("config: rope_scaling must be {\"type\": \"mrope\", \"mrope_section\": [t, h, w]} in ", source));
  }
  int64_t sum = 0;
  for (int64_t s : c.mrope_section) sum += s;
  if (c.mrope_section.size() != 3 || sum * 2 != c.text.head_dim())
    throw ConfigError(cat("config: rope_scaling.mrope_section must be 3 numbers summing to head_dim / 2 = ",
                          c.text.head_dim() / 2, " (the default [16, 24, 24] fits head_dim 128) in ", source));
  return c;
}

json Qwen2VLConfig::to_json() const {
  json j = text.to_json();
  j["architectures"] = json::array({qwen2_5 ? "Qwen2_5_VLForConditionalGeneration" : "Qwen2VLForConditionalGeneration"});
  j["model_type"] = qwen2_5 ? "qwen2_5_vl" : "qwen2_vl";
  j["vision_config"] = vision.to_json();
  j["image_token_id"] = rope_index.image_token_id;
  j["video_token_id"] = rope_index.video_token_id;
  j["vision_start_token_id"] = rope_index.vision_start_token_id;
  j["vision_end_token_id"] = vision_end_token_id;
  j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", mrope_section}};
  return j;
}

Qwen2VLForConditionalGeneration::Qwen2VLForConditionalGeneration(const Qwen2VLConfig& c, at::ScalarType dtype)
    : Qwen2ForCausalLM(c.text, dtype), vl_config(c) {
  visual = register_module("visual", std::make_shared<Qwen2VisionTransformer>(c.vision, dtype));
}

PlanTable Qwen2VLForConditionalGeneration::plans() const {
  PlanTable t = Qwen2ForCausalLM::plans();
  t.fsdp_units = {"visual.blocks.{*}", "model.layers.{*}"};
  // The vision tower as Megatron splits a ViT (fused qkv by thirds, the MLP's first layer
  // column-parallel and its last row-parallel), and the projector the same way.
  std::vector<std::pair<std::string, std::string>> vision = {{"visual.blocks.{*}.attn", "heads"},
                                                             {"visual.blocks.{*}.attn.qkv", "qkv_colwise"},
                                                             {"visual.blocks.{*}.attn.proj", "rowwise"}};
  if (vl_config.qwen2_5) {
    vision.insert(vision.end(), {{"visual.blocks.{*}.mlp.gate_proj", "colwise"},
                                 {"visual.blocks.{*}.mlp.up_proj", "colwise"},
                                 {"visual.blocks.{*}.mlp.down_proj", "rowwise"}});
  } else {
    vision.insert(vision.end(), {{"visual.blocks.{*}.mlp.fc1", "colwise"}, {"visual.blocks.{*}.mlp.fc2", "rowwise"}});
  }
  vision.insert(vision.end(), {{"visual.merger.mlp.0", "colwise"}, {"visual.merger.mlp.2", "rowwise"}});
  t.tensor_parallel.insert(t.tensor_parallel.begin(), vision.begin(), vision.end());
  // Context parallel: each rank is handed its share of the tokens, as a text model is. What needs
  // the whole row is made from it on the host first: the M-RoPE positions and the feature row of
  // every pad token. The pixels pass whole to the tower's own cut below.
  t.context_parallel_prepare = [rc = vl_config.rope_index, merge = vl_config.vision.spatial_merge_size](const data::Batch& host) {
    const MultimodalInputs in = multimodal_inputs(host, /*attention=*/false);
    data::Batch out = host;
    auto index = [&](const at::Tensor& pixels, const at::Tensor& grid, int64_t token, std::string_view field, const char* what) {
      if (!pixels.defined()) return;
      MM_CHECK(grid.defined(), "qwen2_vl: ", what, " pixels come without their grid_thw");
      at::Tensor idx = vision_feature_index(in.input_ids.to(at::kCPU), token);
      const int64_t pads = idx.max().item<int64_t>() + 1;
      const int64_t features = grid.to(at::kCPU, at::kLong).prod(1).sum().item<int64_t>() / (merge * merge);
      MM_CHECK(pads == features, "qwen2_vl: ", pads, " ", what, " pad tokens (id ", token, ") but the batch's grids give ",
               features, " features");
      out.set(field, idx);
    };
    index(in.pixel_values, in.image_grid_thw, rc.image_token_id, data::kImageFeatureIndex, "image");
    index(in.pixel_values_videos, in.video_grid_thw, rc.video_token_id, data::kVideoFeatureIndex, "video");
    out.set(data::kMropePositionIds, qwen2vl_mrope_positions(rc, in));
    return out;
  };
  t.context_parallel_whole = {std::string(data::kPixelValues), std::string(data::kImageGridThw),
                              std::string(data::kPixelValuesVideos), std::string(data::kVideoGridThw),
                              std::string(data::kVideoSecondPerGrid)};
  // And the vision tower's patches among them again, each frame or window attended whole; each
  // rank is handed only its pixel rows, in the blocks' (Qwen2.5-VL: window) order.
  PlanTable::CpStretch tower;
  tower.attention = {"visual.blocks.{*}.attn"};
  tower.blocks = {"visual.blocks.{*}"};
  tower.inputs = {{std::string(data::kPixelValues), std::string(data::kImageGridThw)},
                   {std::string(data::kPixelValuesVideos), std::string(data::kVideoGridThw)}};
  tower.order = [c = vl_config.vision](const at::Tensor& grid) { return qwen2vl_patch_block_order(c, grid); };
  t.context_parallel_encoders = {tower};
  return t;
}

std::vector<std::string> Qwen2VLForConditionalGeneration::optional_fields() const {
  std::vector<std::string> f = Qwen2ForCausalLM::optional_fields();
  for (auto n : {data::kMropePositionIds, data::kImageFeatureIndex, data::kVideoFeatureIndex}) f.emplace_back(n);
  return f;
}

std::vector<int64_t> Qwen2VLForConditionalGeneration::image_placeholder(int64_t features) const {
  std::vector<int64_t> t(static_cast<size_t>(features + 2), vl_config.rope_index.image_token_id);
  t.front() = vl_config.rope_index.vision_start_token_id;
  t.back() = vl_config.vision_end_token_id;
  return t;
}

void Qwen2VLForConditionalGeneration::init_weights(uint64_t seed) {
  Qwen2ForCausalLM::init_weights(seed);  // every Linear and Embedding, the vision tower's too
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x5EEDull);
  mm::nn::init_param_normal(visual->patch_embed_weight, config.initializer_range, gen);
}

std::string Qwen2VLForConditionalGeneration::parameter_name(const std::string& name) const {
  static const std::string kVisual = "model.visual.", kLanguage = "model.language_model.";
  if (name.compare(0, kVisual.size(), kVisual) == 0) return "visual." + name.substr(kVisual.size());
  if (name.compare(0, kLanguage.size(), kLanguage) == 0) return "model." + name.substr(kLanguage.size());
  return name;
}

std::string Qwen2VLForConditionalGeneration::hf_module_path(const std::string& name) const {
  if (name.compare(0, 7, "visual.") == 0) return "model." + name;
  if (name.compare(0, 6, "model.") == 0) return "model.language_model." + name.substr(6);
  return name;
}

at::Tensor Qwen2VLForConditionalGeneration::mrope_positions(const MultimodalInputs& in) const {
  if (in.mrope_position_ids.defined()) return in.mrope_position_ids;
  return qwen2vl_mrope_positions(vl_config.rope_index, in);
}

at::Tensor qwen2vl_mrope_positions(const RopeIndexConfig& rc, const MultimodalInputs& in) {
  if (!in.segment_ids.defined())
    return get_rope_index(in.input_ids, in.image_grid_thw, in.video_grid_thw, in.attention_mask, rc,
                          in.video_second_per_grid)
        .position_ids;
  // Packed rows: each sample from its own position 0, taking the next grids in order.
  const int64_t B = in.input_ids.size(0), S = in.input_ids.size(1);
  at::Tensor out = at::zeros({3, B, S}, at::kLong);
  at::Tensor ids = in.input_ids.to(at::kCPU, at::kLong).contiguous(), seg = in.segment_ids.to(at::kCPU, at::kLong).contiguous();
  int64_t next_image = 0, next_video = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* s = seg[b].data_ptr<int64_t>();
    const int64_t* t = ids[b].data_ptr<int64_t>();
    for (int64_t a = 0; a < S;) {
      int64_t e = a;
      while (e < S && s[e] == s[a]) ++e;
      if (s[a] >= 0) {
        int64_t images = 0, videos = 0;
        for (int64_t i = a; i + 1 < e; ++i)
          if (t[i] == rc.vision_start_token_id) {
            images += t[i + 1] == rc.image_token_id;
            videos += t[i + 1] == rc.video_token_id;
          }
        at::Tensor ig = images ? in.image_grid_thw.narrow(0, next_image, images) : at::Tensor();
        at::Tensor vg = videos ? in.video_grid_thw.narrow(0, next_video, videos) : at::Tensor();
        std::vector<double> spg;
        for (int64_t v = 0; v < videos; ++v)
          if (next_video + v < static_cast<int64_t>(in.video_second_per_grid.size()))
            spg.push_back(in.video_second_per_grid[next_video + v]);
        RopeIndex r = get_rope_index(ids.narrow(0, b, 1).narrow(1, a, e - a), ig, vg, {}, rc, spg);
        out.narrow(1, b, 1).narrow(2, a, e - a).copy_(r.position_ids);
        next_image += images;
        next_video += videos;
      }
      a = e;
    }
  }
  return out;
}

namespace {
// Into the embeddings: by each pad token's feature row when a cp rank holds a share of the row,
// else in order.
at::Tensor place_features(const at::Tensor& h, const at::Tensor& ids, int64_t token, const at::Tensor& index,
                          const at::Tensor& features, const char* what) {
  return index.defined() ? place_vision_features_at(h, index, features, "qwen2_vl", what)
                         : place_vision_features(h, ids, token, features, "qwen2_vl", what);
}
}  // namespace

at::Tensor Qwen2VLForConditionalGeneration::forward_multimodal(const MultimodalInputs& in) {
  return logits(forward_hidden(in));
}

at::Tensor Qwen2VLForConditionalGeneration::forward_hidden(const MultimodalInputs& in) {
  MM_CHECK(in.input_ids.dim() == 2, "qwen2_vl: input_ids must be [batch, seq] (got ", in.input_ids.sizes(), ")");
  const int64_t past = in.kv_cache ? in.kv_cache->length() : 0;
  at::Tensor h = model->embed_tokens->forward(in.input_ids);
  auto place = [&](const at::Tensor& pixels, const at::Tensor& grid, int64_t token, const at::Tensor& index,
                   const char* what) {
    if (!pixels.defined()) return;
    MM_CHECK(grid.defined(), "qwen2_vl: ", what, " pixels come without their grid_thw");
    h = place_features(h, in.input_ids, token, index, visual->forward(pixels, grid, in.pixels_cut), what);
  };
  place(in.pixel_values, in.image_grid_thw, vl_config.rope_index.image_token_id, in.image_feature_index, "image");
  place(in.pixel_values_videos, in.video_grid_thw, vl_config.rope_index.video_token_id, in.video_feature_index, "video");

  at::Tensor pos;
  if (past == 0) {
    pos = mrope_positions(in).to(in.input_ids.device());
    // get_rope_index's deltas: later tokens sit at their index plus (max position + 1 - S).
    if (in.kv_cache) in.kv_cache->rope_deltas = std::get<0>(pos.amax(2).max(0)) + 1 - in.input_ids.size(1);
  } else {
    MM_CHECK(in.kv_cache->rope_deltas.defined(), "qwen2_vl: a kv cache that this model did not prefill");
    const int64_t B = in.input_ids.size(0), S = in.input_ids.size(1);
    const at::Tensor& deltas = in.kv_cache->rope_deltas;
    at::Tensor text = at::arange(past, past + S, at::TensorOptions().dtype(at::kLong).device(deltas.device())).unsqueeze(0) +
                      deltas.view({-1, 1});
    pos = text.unsqueeze(0).expand({3, B, S}).to(in.input_ids.device());
  }
  const auto table_dtype = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor inv = rope_inv_freq(config.head_dim(), config.rope_theta, table_dtype, h.device());
  auto [cos, sin] = mrope_cos_sin(pos, inv, vl_config.mrope_section);
  return model->forward(h, decoder_context(cos, sin, h.scalar_type(), in));
}

std::vector<PipelineSubmodule> Qwen2VLForConditionalGeneration::pipeline_submodules() const {
  PipelineSubmodule vision;
  vision.name = "vision";
  vision.num_layers = static_cast<int64_t>(visual->blocks.size());
  vision.layer_prefix = "visual.blocks.";
  vision.before = {"visual.patch_embed."};
  vision.after = {"visual.merger."};
  return {vision, Qwen2ForCausalLM::pipeline_submodules().front()};
}

void Qwen2VLForConditionalGeneration::pipeline_forward(size_t submodule, int64_t begin, int64_t end, Outputs& carry,
                                                       const data::Batch& batch) {
  if (submodule == 1) return text_pipeline_forward(begin, end, carry, batch);
  const MultimodalInputs in = multimodal_inputs(batch, /*attention=*/false);
  auto piece = [&](const at::Tensor& pixels, const at::Tensor& grid, const std::string& kind) {
    if (!pixels.defined()) return;
    Qwen2VisionTransformer::Run run = visual->prepare(pixels, grid, begin == 0, in.pixels_cut);
    at::Tensor h = begin == 0 ? run.h : carry.require_tensor(kind + "_hidden");
    h = visual->run_blocks(run, h, begin, end);
    carry.set(kind + "_hidden", at::Tensor());
    if (end == static_cast<int64_t>(visual->blocks.size())) carry.set(kind + "_features", visual->finish(run, h));
    else carry.set(kind + "_hidden", h);
  };
  piece(in.pixel_values, in.image_grid_thw, "image");
  piece(in.pixel_values_videos, in.video_grid_thw, "video");
}

at::Tensor Qwen2VLForConditionalGeneration::pipeline_embeddings(const MultimodalInputs& in, const Outputs& carry) {
  at::Tensor h = model->embed_tokens->forward(in.input_ids);
  if (carry.has("image_features"))
    h = place_features(h, in.input_ids, vl_config.rope_index.image_token_id, in.image_feature_index,
                       carry["image_features"], "image");
  if (carry.has("video_features"))
    h = place_features(h, in.input_ids, vl_config.rope_index.video_token_id, in.video_feature_index,
                       carry["video_features"], "video");
  return h;
}

std::pair<at::Tensor, at::Tensor> Qwen2VLForConditionalGeneration::pipeline_rope(const MultimodalInputs& in,
                                                                                 at::ScalarType dtype, at::Device device) const {
  at::Tensor pos = mrope_positions(in).to(device);
  const auto table_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor inv = rope_inv_freq(config.head_dim(), config.rope_theta, table_dtype, device);
  return mrope_cos_sin(pos, inv, vl_config.mrope_section);
}

double Qwen2VLForConditionalGeneration::training_flops(const MultimodalInputs& in) const {
  return CausalLM::training_flops(in) + vl_config.vision.training_flops(in.image_grid_thw) +
         vl_config.vision.training_flops(in.video_grid_thw);
}

std::vector<std::pair<std::string, double>> Qwen2VLForConditionalGeneration::training_flops_by_part(
    const data::Batch& host) const {
  const MultimodalInputs in = multimodal_inputs(host, /*attention=*/false);
  const auto& v = vl_config.vision;
  const double vision = v.training_flops(in.image_grid_thw) + v.training_flops(in.video_grid_thw);
  const double merger = v.merger_training_flops(in.image_grid_thw) + v.merger_training_flops(in.video_grid_thw);
  return {{"vision_tower", vision - merger}, {"projector", merger}, {"language_model", CausalLM::training_flops(in)}};
}

namespace {
ModelSize vl_size(const json& hf, const std::string& source, bool strict, bool qwen2_5) {
  Qwen2VLConfig c = Qwen2VLConfig::from_json(hf, source, strict, qwen2_5);
  ModelSize s{{{"vision tower (with merger)", c.vision.num_parameters()}, {"language model", c.text.num_parameters()}}};
  s.flops_per_token = [c](int64_t seq) { return c.text.flops_per_token(seq); };
  s.image_flops = [c](int64_t h, int64_t w) {
    at::Tensor g = at::tensor(std::vector<int64_t>{1, h / c.vision.patch_size, w / c.vision.patch_size}, at::kLong).view({1, 3});
    return c.vision.training_flops(g);
  };
  return s;
}
const mm::Registrar kSizeQwen2VL(model_size_registry(), "qwen2_vl", [](const json& hf, const std::string& source, bool strict) {
  return vl_size(hf, source, strict, false);
});
const mm::Registrar kSizeQwen2_5VL(model_size_registry(), "qwen2_5_vl",
                                   [](const json& hf, const std::string& source, bool strict) {
                                     return vl_size(hf, source, strict, true);
                                   });
const mm::Registrar kRegisterQwen2VL(model_registry(), "qwen2_vl", [](const json& hf, const std::string& source, bool strict) {
  return std::static_pointer_cast<CausalLM>(
      std::make_shared<Qwen2VLForConditionalGeneration>(Qwen2VLConfig::from_json(hf, source, strict)));
});
const mm::Registrar kRegisterQwen2_5VL(model_registry(), "qwen2_5_vl", [](const json& hf, const std::string& source,
                                                                          bool strict) {
  return std::static_pointer_cast<CausalLM>(
      std::make_shared<Qwen2VLForConditionalGeneration>(Qwen2VLConfig::from_json(hf, source, strict, /*qwen2_5=*/true)));
});
}  // namespace

}  // namespace mm::models
