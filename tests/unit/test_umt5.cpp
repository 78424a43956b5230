// The umT5 encoder (mindspeed_mm/models/umt5/umt5.h), Wan2.1's text encoder, against PyPI's
// transformers (tests/conformance/hf_reference.py encoder): a tiny random UMT5EncoderModel made
// and saved by transformers loads into mm by its names, and the last hidden states of padded
// batches long enough to reach the logarithmic and capped position buckets are equal in fp32
// (1e-4 relative, printed); the bucket function on hand-checked cases; bad inputs.
#include <gtest/gtest.h>

#include <filesystem>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/umt5/umt5.h"
#include "run_command.h"

using namespace mm::models;

TEST(UMT5, RelativePositionBuckets) {
  // 32 buckets: keys before the query in 0..15, after it in 16..31; distances below 8 exact,
  // then logarithmic up to max_distance 128, beyond it the last bucket of the half (the values
  // transformers' UMT5Attention._relative_position_bucket gives for these positions).
  const at::Tensor rel = at::tensor({0, 1, -1, 7, -7, 8, 12, 16, 127, 128, 1000, -1000}, at::kLong);
  const at::Tensor b = t5_relative_position_bucket(rel, 32, 128);
  EXPECT_TRUE(b.equal(at::tensor({0, 17, 1, 23, 7, 24, 25, 26, 31, 31, 31, 15}, at::kLong))) << b;
}

TEST(UMT5, HiddenStatesEqualTransformers) {
  const std::string dir = mm::test::fresh_dir("umt5_conformance");
  const nlohmann::json cfg = {{"model_type", "umt5"}, {"architectures", {"UMT5EncoderModel"}}, {"vocab_size", 100},
                              {"d_model", 32}, {"d_kv", 8}, {"d_ff", 48}, {"num_layers", 2}, {"num_heads", 4},
                              {"relative_attention_max_distance", 20}, {"feed_forward_proj", "gated-gelu"}};
  mm::test::run_hf("create " + dir + " '" + cfg.dump() + "' --seed 4");
  auto m = load_umt5_encoder(dir);
  EXPECT_EQ(m->num_parameters(), m->config.num_parameters());
  at::manual_seed(2);
  const at::Tensor ids = at::randint(2, 100, {2, 40}, at::kLong);
  at::Tensor mask = at::ones({2, 40}, at::kLong);
  mask[1].narrow(0, 27, 13).zero_();
  mm::st::save_safetensors(dir + "/inputs.safetensors", {{"input_ids", ids}, {"attention_mask", mask}});
  mm::test::run_hf("encoder " + dir);
  const at::Tensor want = mm::st::HFWeights(dir + "/hidden.safetensors").get("last_hidden_state");
  at::NoGradGuard no_grad;
  const at::Tensor got = m->forward(ids, mask);
  ASSERT_EQ(got.sizes(), want.sizes());
  const double err = mm::test::rel_err(got, want);
  EXPECT_LT(err, 1e-4);
  std::printf("umt5: max relative difference of the last hidden states from transformers %.2e\n", err);
  // Its FLOPs as PyTorch's FlopCounterMode counts transformers' forward (what online encoding
  // adds to a step's FLOPs).
  const nlohmann::json flops = nlohmann::json::parse(mm::test::read_file(dir + "/flops.json"));
  EXPECT_DOUBLE_EQ(2 * umt5_forward_flops(m->config, 40), flops["flops"].get<double>());
  // Without a mask every token is real: row 0 is the same either way.
  EXPECT_TRUE(at::allclose(m->forward(ids.narrow(0, 0, 1)), got.narrow(0, 0, 1), 1e-5, 1e-5));

  // Wan's original checkpoint names (models_t5_umt5-xxl-enc-bf16.pth): every tensor renamed, a
  // torch.save state dict of them beside the config loads to the same hidden states.
  std::vector<std::pair<std::string, at::Tensor>> original;
  for (auto& [name, p] : m->named_parameters()) {
    original.emplace_back(umt5_original_name(name), p);
    EXPECT_NE(original.back().first, name);
    EXPECT_EQ(umt5_hf_name(original.back().first), name);
  }
  EXPECT_EQ(original.size(), 2u + 2u * 10u);  // token embedding, final norm; 10 per block
  std::filesystem::create_directories(dir + "/orig");
  mm::st::save_torch_state_dict(dir + "/orig/models_t5_umt5-xxl-enc-bf16.pth", original);
  std::filesystem::copy_file(dir + "/config.json", dir + "/orig/config.json");
  EXPECT_TRUE(load_umt5_encoder(dir + "/orig")->forward(ids, mask).equal(got));

  EXPECT_THROW(m->forward(at::full({1, 3}, 100, at::kLong)), mm::Error);  // outside the vocabulary
  EXPECT_THROW(m->forward(ids, at::ones({2, 39}, at::kLong)), mm::Error);
  std::filesystem::create_directories(dir + "/bad");
  mm::test::write_file(dir + "/bad/config.json", R"({"model_type": "t5"})");
  EXPECT_THROW(load_umt5_encoder(dir + "/bad"), mm::ConfigError);
}
