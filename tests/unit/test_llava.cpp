// LLaVA (mindspeed_mm/models/llava/llava.h): llava-hf parameter names and a closed-form count
// (llava-1.5-7b's config gives its published 7.06B); logits and image features against
// transformers' own LlavaForConditionalGeneration (tests/conformance/hf_reference.py) loading
// mm's export, in float64 and float32;
// layers after vision_feature_layer never matter; an HF directory in both namings round-trips
// to bit-identical logits.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/llava/llava.h"
#include "hf_model_dir.h"
#include "run_command.h"

using namespace mm::models;
using nlohmann::json;

namespace {

json tiny_config() {
  return json::parse(R"({
    "model_type": "llava", "image_token_index": 261, "projector_hidden_act": "gelu",
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
    "text_config": {"model_type": "llama", "vocab_size": 263, "hidden_size": 32, "intermediate_size": 64,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5},
    "vision_config": {"hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
                      "image_size": 28, "patch_size": 14, "projection_dim": 16}
  })");
}

std::shared_ptr<LlavaForConditionalGeneration> tiny(at::ScalarType dtype = at::kFloat) {
  auto m = std::make_shared<LlavaForConditionalGeneration>(LlavaConfig::from_json(tiny_config(), "test", false), dtype);
  // Random weights away from init: norms around 1, every bias non-zero.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(13);
  at::NoGradGuard no_grad;
  for (auto& [name, p] : m->named_parameters()) {
    at::Tensor noise = at::empty(p.sizes(), at::TensorOptions().dtype(at::kDouble)).normal_(0.0, 0.3, gen);
    const bool norm = name.find("norm") != std::string::npos || name.find("layrnorm") != std::string::npos;
    p.copy_(norm && name.find("weight") != std::string::npos ? 1.0 + noise : noise);
  }
  return m;
}

MultimodalInputs prompt(int64_t images, at::ScalarType dtype) {
  std::vector<int64_t> ids = {'d', 'e', 's', 'c'};
  for (int64_t i = 0; i < images; ++i) {
    ids.insert(ids.end(), 4, 261);  // (28 / 14)^2 patches, class token dropped
    ids.push_back('+');
  }
  ids.push_back('?');
  MultimodalInputs in;
  in.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  in.pixel_values = at::empty({images, 3, 28, 28}, at::TensorOptions().dtype(at::kDouble)).normal_(0, 1, gen).to(dtype);
  return in;
}

}  // namespace

TEST(Llava, ParameterNamesAndCount) {
  auto m = tiny();
  std::set<std::string> names;
  for (auto& [n, p] : m->named_parameters()) names.insert(n);
  for (const char* n : {"vision_tower.vision_model.embeddings.class_embedding",
                        "vision_tower.vision_model.embeddings.patch_embedding.weight",
                        "vision_tower.vision_model.embeddings.position_embedding.weight",
                        "vision_tower.vision_model.pre_layrnorm.bias",
                        "vision_tower.vision_model.encoder.layers.2.self_attn.out_proj.bias",
                        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
                        "vision_tower.vision_model.encoder.layers.1.layer_norm2.weight",
                        "vision_tower.vision_model.post_layernorm.weight", "multi_modal_projector.linear_1.bias",
                        "multi_modal_projector.linear_2.weight", "language_model.model.embed_tokens.weight",
                        "language_model.model.layers.1.self_attn.q_proj.weight", "language_model.lm_head.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("language_model.model.layers.0.self_attn.q_proj.bias"));  // LLaMA: no attention bias
  EXPECT_EQ(m->num_parameters(), m->config.num_parameters());
  // llava-hf/llava-1.5-7b-hf's config.json (text_config: vocab 32064, 4096 positions, eps 1e-5,
  // the rest LLaMA-7B defaults; vision_config: CLIP ViT-L/14-336): 7.06B parameters.
  json full = json::parse(R"({"model_type": "llava", "image_token_index": 32000, "projector_hidden_act": "gelu",
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "pad_token_id": 32001,
    "text_config": {"model_type": "llama", "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "vocab_size": 32064},
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096, "model_type": "clip_vision_model",
                      "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768}})");
  LlavaConfig c = LlavaConfig::from_json(full, "llava-1.5-7b-hf", false);
  EXPECT_EQ(c.num_parameters(), 7063427072);
  EXPECT_EQ(c.image_tokens(), 576);
  EXPECT_EQ(c.vision_layers_used(), 23);
  json bad = tiny_config();
  bad["vision_feature_layer"] = -5;
  EXPECT_THROW(LlavaConfig::from_json(bad, "test", false), mm::ConfigError);
  bad = tiny_config();
  bad["vision_feature_select_strategy"] = "cls";
  EXPECT_THROW(LlavaConfig::from_json(bad, "test", false), mm::ConfigError);
  EXPECT_TRUE(model_registry().has("llava"));
}

// Against transformers' LlavaForConditionalGeneration (CLIP + projector + LLaMA) loading mm's
// export: logits and the projected image features.
TEST(Llava, MatchesTransformers) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    auto m = tiny(dtype);
    MultimodalInputs in = prompt(2, dtype);
    at::NoGradGuard no_grad;
    at::Tensor ours = m->forward_multimodal(in);
    const std::string dir = mm::test::fresh_dir(dtype == at::kDouble ? "llava_ref64" : "llava_ref32");
    mm::checkpoint::export_hf_directory(dir, m->hf_config(), *m);
    mm::st::save_safetensors(dir + "/inputs.safetensors", {{"input_ids", in.input_ids}, {"pixel_values", in.pixel_values}});
    auto r = mm::test::run_command(std::string(MM_PYTHON) + " " + mm::test::source_dir() +
                                   "/tests/conformance/hf_reference.py logits " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    mm::st::SafetensorsReader out(dir + "/logits.safetensors");
    at::Tensor ref = out.get_copy("logits").to(at::kDouble);
    const double err = (ours.to(at::kDouble) - ref).abs().max().item<double>();
    const double scale = ref.abs().max().item<double>();
    at::Tensor ref_feat = out.get_copy("features").to(at::kDouble);
    const double feat_err =
        (m->image_features(in.pixel_values).to(at::kDouble).reshape({-1, ref_feat.size(-1)}) - ref_feat).abs().max().item<double>();
    std::printf("llava vs transformers (%s): logits max abs error %.3g (logits up to %.3g), features %.3g\n",
                dtype == at::kDouble ? "float64" : "float32", err, scale, feat_err);
    // float64: transformers keeps float32 steps whatever the dtype (the rotary cos/sin, eager
    // attention's softmax), ~3e-7 relative measured; float32: 1e-4 relative.
    EXPECT_LT(err, (dtype == at::kDouble ? 1e-5 : 1e-4) * std::max(1.0, scale));
    EXPECT_LT(feat_err, (dtype == at::kDouble ? 1e-5 : 1e-4) * std::max(1.0, ref_feat.abs().max().item<double>()));
  }
}

TEST(Llava, LayersAfterTheFeatureLayerNeverMatter) {
  auto m = tiny();
  MultimodalInputs in = prompt(1, at::kFloat);
  at::NoGradGuard no_grad;
  at::Tensor a = m->forward_multimodal(in);
  for (auto& [n, p] : m->vision_model->layers[2]->named_parameters()) p.add_(1.0);  // the last of 3 layers
  m->vision_model->post_layernorm->weight.add_(1.0);
  EXPECT_TRUE(at::equal(m->forward_multimodal(in), a));
  m->vision_model->layers[1]->layer_norm1->weight.add_(0.5);
  at::Tensor b = m->forward_multimodal(in);
  EXPECT_TRUE(at::equal(b.narrow(1, 0, 4), a.narrow(1, 0, 4)));  // causal: the text before the image
  EXPECT_FALSE(at::equal(b, a));
  // Too few image tokens for the features is a clear error naming the count each image needs.
  in.input_ids = in.input_ids.narrow(1, 0, 6);
  try {
    m->forward_multimodal(in);
    FAIL() << "mismatched image tokens accepted";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("image_tokens to 4"), std::string::npos) << e.what();
  }
}

TEST(Llava, HFDirectoryRoundTripInBothNamings) {
  auto m = tiny();
  MultimodalInputs in = prompt(2, at::kFloat);
  at::NoGradGuard no_grad;
  at::Tensor ref = m->forward_multimodal(in);
  const std::string dir = mm::test::fresh_dir("llava_hf");
  mm::checkpoint::export_hf_directory(dir + "/old", m->hf_config(), *m);
  std::vector<std::pair<std::string, at::Tensor>> renamed;
  for (auto& [name, p] : m->named_parameters()) {
    std::string n = name;
    if (n.rfind("vision_tower.", 0) == 0 || n.rfind("multi_modal_projector.", 0) == 0) n = "model." + n;
    else if (n.rfind("language_model.model.", 0) == 0) n = "model.language_model." + n.substr(21);
    else if (n == "language_model.lm_head.weight") n = "lm_head.weight";
    renamed.emplace_back(n, p);
  }
  mm::checkpoint::export_hf_directory(dir + "/new", m->hf_config(), *m);
  mm::st::save_hf_weights(dir + "/new", renamed);
  for (const char* sub : {"/old", "/new"}) {
    auto back = mm::test::load_hf_model(dir + sub);
    EXPECT_TRUE(at::equal(back->forward_multimodal(in), ref)) << sub;
  }
}
