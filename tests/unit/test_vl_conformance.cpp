// Conformance of the whole vision-language models with transformers itself
// (tests/conformance/hf_reference.py on tiny random models, nothing downloaded), both ways:
// transformers saves a Qwen2-VL / Qwen2.5-VL model and mm loads it; mm exports one and
// transformers loads it. The prompt holds an image (and, for Qwen2-VL, a video): logits cover the
// vision tower, the merger, the scatter into the pad tokens and M-RoPE. float32 within 1e-4 of the
// largest logit; float64 within 1e-5 (transformers keeps float32 steps whatever the dtype: rotary
// cos/sin, eager attention's softmax).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/models/model_registry.h"

namespace {

using mm::test::rel_err;
using mm::test::run_hf;
using nlohmann::json;

constexpr int64_t kVisionStart = 150, kImage = 151, kVideo = 152, kVisionEnd = 153;

// transformers >= 5's config.json layout: the language model's fields in text_config.
json tiny_config(bool qwen2_5, const char* dtype) {
  json text = {{"vocab_size", 160},        {"hidden_size", 64},       {"intermediate_size", 112},
               {"num_hidden_layers", 2},   {"num_attention_heads", 4}, {"num_key_value_heads", 2},
               {"initializer_range", 0.2}, {"rope_theta", 1e6},        {"rms_norm_eps", 1e-6},
               {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {2, 3, 3}}}}};
  json vision = {{"depth", 2}, {"num_heads", 4}, {"patch_size", 4}, {"spatial_merge_size", 2},
                 {"temporal_patch_size", 2}, {"in_chans", 3}, {"in_channels", 3}};
  if (qwen2_5) {
    vision.update({{"hidden_size", 32}, {"intermediate_size", 40}, {"out_hidden_size", 64}, {"window_size", 16},
                   {"fullatt_block_indexes", {1}}, {"tokens_per_second", 2}, {"hidden_act", "silu"}});
  } else {
    vision.update({{"embed_dim", 32}, {"hidden_size", 64}, {"mlp_ratio", 2}, {"hidden_act", "quick_gelu"}});
  }
  return {{"model_type", qwen2_5 ? "qwen2_5_vl" : "qwen2_vl"},
          {"architectures", {qwen2_5 ? "Qwen2_5_VLForConditionalGeneration" : "Qwen2VLForConditionalGeneration"}},
          {"text_config", text},
          {"vision_config", vision},
          {"image_token_id", kImage},
          {"video_token_id", kVideo},
          {"vision_start_token_id", kVisionStart},
          {"vision_end_token_id", kVisionEnd},
          {"tie_word_embeddings", false},
          {"dtype", dtype}};
}

// One prompt: text, an image of 4 x 6 patches (6 merged tokens), text, and for Qwen2-VL a video of
// 4 frames of 4 x 4 patches (2 x 4 merged tokens), text.
mm::models::MultimodalInputs prompt(bool with_video, at::ScalarType dtype) {
  const int64_t dim = 3 * 2 * 4 * 4;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(21);
  std::vector<int64_t> ids = {5, 17, 42, kVisionStart};
  for (int i = 0; i < 6; ++i) ids.push_back(kImage);
  ids.insert(ids.end(), {kVisionEnd, 9, 88, 13});
  mm::models::MultimodalInputs in;
  in.image_grid_thw = at::tensor({1, 4, 6}, at::kLong).view({1, 3});
  in.pixel_values = at::empty({24, dim}, at::TensorOptions().dtype(at::kDouble)).normal_(0, 1, gen).to(dtype);
  if (with_video) {
    ids.push_back(kVisionStart);
    for (int i = 0; i < 8; ++i) ids.push_back(kVideo);
    ids.insert(ids.end(), {kVisionEnd, 71, 3});
    in.video_grid_thw = at::tensor({2, 4, 4}, at::kLong).view({1, 3});
    in.pixel_values_videos = at::empty({32, dim}, at::TensorOptions().dtype(at::kDouble)).normal_(0, 1, gen).to(dtype);
  }
  in.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
  return in;
}

void save_inputs(const std::string& dir, const mm::models::MultimodalInputs& in) {
  std::vector<std::pair<std::string, at::Tensor>> t = {
      {"input_ids", in.input_ids}, {"pixel_values", in.pixel_values}, {"image_grid_thw", in.image_grid_thw}};
  if (in.pixel_values_videos.defined()) {
    t.emplace_back("pixel_values_videos", in.pixel_values_videos);
    t.emplace_back("video_grid_thw", in.video_grid_thw);
  }
  mm::st::save_safetensors(dir + "/inputs.safetensors", t);
}

struct Tol {
  at::ScalarType dtype;
  const char* name;
  double logits;
};
const Tol kTolerances[] = {{at::kDouble, "float64", 1e-5}, {at::kFloat, "float32", 1e-4}};

void compare(mm::models::CausalLM& m, const std::string& dir, const mm::models::MultimodalInputs& in,
             const std::string& what, double tol) {
  at::NoGradGuard no_grad;
  at::Tensor ours = m.forward_multimodal(in);
  at::Tensor ref = mm::st::SafetensorsReader(dir + "/logits.safetensors").get_copy("logits");
  ASSERT_EQ(ours.sizes(), ref.sizes()) << what;
  const double e = rel_err(ours, ref);
  std::printf("[%s] max |ours - transformers| / max |logit| = %.3e\n", what.c_str(), e);
  EXPECT_LT(e, tol) << what;
}

void hf_to_mm(bool qwen2_5) {
  const char* id = qwen2_5 ? "qwen2_5_vl" : "qwen2_vl";
  for (const Tol& t : kTolerances) {
    const std::string dir = mm::test::fresh_dir(std::string(id) + "_hf2mm_" + t.name);
    run_hf("create " + dir + " '" + tiny_config(qwen2_5, t.name).dump() + "' --seed 3");
    if (testing::Test::HasFailure()) return;
    auto in = prompt(!qwen2_5, t.dtype);
    save_inputs(dir, in);
    run_hf("logits " + dir);
    auto m = mm::test::load_hf_model_as(dir, t.dtype);
    compare(*m, dir, in, std::string(id) + " hf->mm " + t.name, t.logits);
  }
}

void mm_to_hf(bool qwen2_5) {
  const char* id = qwen2_5 ? "qwen2_5_vl" : "qwen2_vl";
  for (const Tol& t : kTolerances) {
    json cfg = tiny_config(qwen2_5, t.name);
    cfg.erase("dtype");
    cfg["torch_dtype"] = t.name;
    auto m = mm::models::as_causal_lm(mm::models::model_registry().get(id, "model.id")(cfg, id, /*strict=*/false), id);
    m->to(t.dtype);
    m->init_weights(17);
    mm::test::perturb_norms_and_biases(*m, 18);
    const std::string dir = mm::test::fresh_dir(std::string(id) + "_mm2hf_" + t.name);
    mm::checkpoint::export_hf_directory(dir, m->hf_config(), *m);
    auto in = prompt(!qwen2_5, t.dtype);
    save_inputs(dir, in);
    run_hf("logits " + dir);
    if (testing::Test::HasFailure()) return;
    compare(*m, dir, in, std::string(id) + " mm->hf " + t.name, t.logits);
  }
}

TEST(VLConformance, Qwen2VLImageAndVideoHFToMM) { hf_to_mm(false); }
TEST(VLConformance, Qwen2VLImageAndVideoMMToHF) { mm_to_hf(false); }
TEST(VLConformance, Qwen2_5VLImageHFToMM) { hf_to_mm(true); }
TEST(VLConformance, Qwen2_5VLImageMMToHF) { mm_to_hf(true); }

}  // namespace
