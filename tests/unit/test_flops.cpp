// `mm flops` and the closed-form sizes (model_size_registry): for every model id the config-only
// count equals the built module tree's (and per-token FLOPs a language model's own); the full-size example configs print the official
// checkpoints' parameter counts (Qwen2-VL 2B/7B, Qwen2.5-VL 3B/7B, LLaVA-1.5-7B) without
// allocating weights; a vision-language batch's training FLOPs add the tower's to the decoder's.
#include <gtest/gtest.h>

#include "mindspeed_mm/models/llava/llava.h"
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"
#include "run_command.h"

using namespace mm::models;
using nlohmann::json;

namespace {

json text_fields() {
  return json::parse(R"({"vocab_size": 263, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2})");
}

json tiny(const std::string& id) {
  json j = text_fields();
  if (id == "qwen2") return j;
  if (id == "wan_vae")
    return {{"base_dim", 4}, {"z_dim", 2}, {"dim_mult", {1, 2}}, {"num_res_blocks", 1}, {"temperal_downsample", {true}}};
  if (id == "wan_dit")
    return {{"num_attention_heads", 2}, {"attention_head_dim", 12}, {"in_channels", 4}, {"out_channels", 4},
            {"text_dim", 16}, {"freq_dim", 8}, {"ffn_dim", 48}, {"num_layers", 2}};
  if (id == "llava") {
    json t = j;
    t["model_type"] = "llama";
    return {{"text_config", t}, {"image_token_index", 261},
            {"vision_config", {{"hidden_size", 24}, {"intermediate_size", 48}, {"num_hidden_layers", 2},
                               {"num_attention_heads", 4}, {"image_size", 28}, {"patch_size", 14}}}};
  }
  j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}};
  j["vision_config"] = id == "qwen2_vl"
                           ? json{{"depth", 2}, {"embed_dim", 16}, {"num_heads", 2}, {"mlp_ratio", 2}}
                           : json{{"depth", 2}, {"hidden_size", 16}, {"intermediate_size", 24}, {"num_heads", 2},
                                  {"window_size", 56}, {"fullatt_block_indexes", {1}}};
  return j;
}

}  // namespace

TEST(Flops, ClosedFormSizesEqualTheModuleTreeForEveryModel) {
  for (const std::string& id : model_registry().ids()) {
    ASSERT_TRUE(model_size_registry().has(id)) << id;
    auto model = model_registry().get(id)(tiny(id), "test", false);
    const ModelSize size = model_size_registry().get(id)(tiny(id), "test", false);
    EXPECT_EQ(size.total(), model->num_parameters()) << id;
    if (auto lm = std::dynamic_pointer_cast<CausalLM>(model)) {
      EXPECT_DOUBLE_EQ(size.flops_per_token(64), lm->flops_per_token(64)) << id;
    } else if (id == "wan_dit") {
      EXPECT_FALSE(size.sample_flops.empty()) << id;  // a model without text tokens sizes its samples
    }
  }
}

TEST(Flops, VisionBatchesCountTheTowerToo) {
  auto vl = as_causal_lm(model_registry().get("qwen2_vl")(tiny("qwen2_vl"), "test", false), "qwen2_vl");
  MultimodalInputs in;
  in.input_ids = at::zeros({2, 10}, at::kLong);
  in.attention_mask = at::ones({2, 10}, at::kLong);
  in.attention_mask[1].narrow(0, 7, 3).zero_();  // 3 padding tokens
  const double text = 17 * vl->flops_per_token(10);
  EXPECT_DOUBLE_EQ(vl->training_flops(in), text);
  in.image_grid_thw = at::tensor(std::vector<int64_t>{1, 4, 4}, at::kLong).view({1, 3});
  const double with_image = vl->training_flops(in);
  // 16 patches: 6 x (patch embedding + 2 blocks of qkv, proj, fc1, fc2) per patch, the merger per
  // 4 patches, and attention 12 x embed x 16 keys per patch and block.
  const double E = 16, I = 32, W = 64, patch = 3 * 2 * 14 * 14;
  const double expected = 6 * (16 * (patch * E + 2 * (4 * E * E + 2 * E * I)) + 4 * (W * W + W * 32)) + 12 * E * 16 * 16 * 2;
  EXPECT_DOUBLE_EQ(with_image - text, expected);
}

TEST(Flops, FullSizeExamplesPrintTheOfficialParameterCounts) {
  const std::pair<const char*, const char*> cases[] = {
      {"examples/qwen2vl/qwen2vl_2b.yaml", "2,208,985,600  (2.21B)"},
      {"examples/qwen2vl/qwen2vl_7b.yaml", "8,291,375,616  (8.29B)"},
      {"examples/qwen2.5vl/qwen2.5vl_3b.yaml", "3,754,622,976  (3.75B)"},
      {"examples/qwen2.5vl/qwen2.5vl_7b.yaml", "8,292,166,656  (8.29B)"},
      {"examples/llava/llava1.5_7b.yaml", "7,063,427,072  (7.06B)"}};
  for (const auto& [file, total] : cases) {
    auto r = mm::test::run_command(mm::test::mm_binary() + " flops " + mm::test::source_dir() + "/" + file);
    ASSERT_EQ(r.exit_code, 0) << file << "\n" << r.output;
    EXPECT_NE(r.output.find(total), std::string::npos) << file << "\n" << r.output;
    EXPECT_NE(r.output.find("per text token"), std::string::npos) << r.output;
  }
  auto bad = mm::test::run_command(mm::test::mm_binary() + " flops " + mm::test::source_dir() +
                                   "/examples/qwen2vl/qwen2vl_2b.yaml model.config.vocab_size=null");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("vocab_size"), std::string::npos) << bad.output;
}
