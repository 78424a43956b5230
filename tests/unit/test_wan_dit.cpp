// Wan2.1's diffusion transformer (mindspeed_mm/models/wan/wan_dit.h) against PyPI's diffusers
// (tests/conformance/diffusers_reference.py): a tiny random WanTransformer3DModel made and saved by
// diffusers loads into mm by its names, and mm's prediction equals diffusers' in fp32 (1e-4
// relative); parameter counts equal diffusers' for the tiny model and for the real 1.3B and 14B
// configs; the original Wan checkpoint names are the ones diffusers' own converter maps.
#include <gtest/gtest.h>

#include <set>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/models/wan/wan_dit.h"
#include "run_command.h"

using namespace mm::models;
using mm::test::fresh_dir;
using mm::test::run_command;

namespace {

nlohmann::json tiny_config(bool cross_attn_norm = true, std::vector<int64_t> patch = {1, 2, 2}) {
  return {{"patch_size", patch},  {"num_attention_heads", 2}, {"attention_head_dim", 12}, {"in_channels", 4},
          {"out_channels", 4},    {"text_dim", 16},           {"freq_dim", 8},            {"ffn_dim", 48},
          {"num_layers", 2},      {"cross_attn_norm", cross_attn_norm}, {"eps", 1e-6},   {"rope_max_seq_len", 32}};
}

std::string python_reference(const std::string& args) {
  const std::string cmd =
      std::string(MM_PYTHON) + " " + mm::test::source_dir() + "/tests/conformance/diffusers_reference.py " + args;
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  return r.output;
}

// diffusers makes and saves a random model of `cfg` in DIR; mm loads it.
std::shared_ptr<WanTransformer3DModel> diffusers_model(const std::string& dir, const nlohmann::json& cfg, int seed) {
  mm::test::write_file(dir + "/wanted.json", cfg.dump());
  python_reference("wan_dit create " + dir + "/model " + dir + "/wanted.json --seed " + std::to_string(seed));
  const nlohmann::json hf = mm::checkpoint::read_hf_config(dir + "/model");
  auto m = std::make_shared<WanTransformer3DModel>(WanDiTConfig::from_json(hf, dir + "/model/config.json", false));
  mm::checkpoint::load_model_weights(*m, dir + "/model");
  return m;
}

}  // namespace

TEST(WanDiT, NamesAndCountsAreDiffusers) {
  const std::string dir = fresh_dir("wan_dit_names");
  auto m = diffusers_model(dir, tiny_config(), 1);  // every tensor present with its shape, none extra
  EXPECT_EQ(m->num_parameters(), m->config.num_parameters());
  EXPECT_EQ(std::to_string(m->num_parameters()) + "\n", python_reference("wan_dit count " + dir + "/wanted.json"));
  // The two published text-to-video models: diffusers' count on the meta device, and `mm flops`.
  for (const auto& [name, count] : {std::pair<std::string, std::string>{"t2v_1.3b", "1,418,996,800"}, {"t2v_14b", "14,288,491,584"}}) {
    const std::string yaml = mm::test::source_dir() + "/examples/wan2.1/" + name + ".yaml";
    const mm::config::Config cfg = mm::config::load_config(yaml, {}, /*for_training=*/false);
    const WanDiTConfig c = WanDiTConfig::from_json(cfg.model.config, yaml, true);
    mm::test::write_file(dir + "/" + name + ".json", cfg.model.config.dump());
    EXPECT_EQ(std::to_string(c.num_parameters()) + "\n", python_reference("wan_dit count " + dir + "/" + name + ".json"));
    auto r = run_command(mm::test::mm_binary() + " flops " + yaml);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(count), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("per 480p 81-frame clip (32760 latent tokens, 512 text tokens)"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("per text token"), std::string::npos) << r.output;
  }
}

TEST(WanDiT, PredictionEqualsDiffusers) {
  struct Case {
    nlohmann::json cfg;
    std::vector<int64_t> shape;  // B, C, F, H, W
  };
  const Case cases[] = {
      {tiny_config(), {2, 4, 3, 4, 6}},
      {tiny_config(false, {2, 2, 2}), {1, 4, 4, 6, 4}},
  };
  for (const Case& c : cases) {
    const std::string dir = fresh_dir("wan_dit_forward_" + std::to_string(&c - cases));
    auto m = diffusers_model(dir, c.cfg, 2);
    at::manual_seed(5);
    const at::Tensor latents = at::randn(c.shape);
    const at::Tensor timesteps = at::tensor({999.0, 321.5}).narrow(0, 0, c.shape[0]).contiguous();
    const at::Tensor text = at::randn({c.shape[0], 5, 16});
    mm::st::save_safetensors(dir + "/model/inputs.safetensors",
                             {{"latents", latents}, {"timesteps", timesteps}, {"text", text}});
    python_reference("wan_dit forward " + dir + "/model");
    const at::Tensor want = mm::st::HFWeights(dir + "/model/outputs.safetensors").get("prediction");
    at::NoGradGuard no_grad;
    const at::Tensor got = m->forward(latents, timesteps, text);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double err = mm::test::rel_err(got, want);
    EXPECT_LT(err, 1e-4) << c.cfg.dump();
    std::printf("wan_dit %s: max relative difference from diffusers %.2e\n", c.cfg["patch_size"].dump().c_str(), err);
  }
}

TEST(WanDiT, OriginalNamesAreDiffusersConvertersAndLoad) {
  const std::string dir = fresh_dir("wan_dit_original");
  auto m = diffusers_model(dir, tiny_config(), 3);
  std::vector<std::pair<std::string, at::Tensor>> original;
  for (auto& [name, p] : m->named_parameters()) original.emplace_back(wan_dit_original_name(name), p);
  std::set<std::string> names;
  for (auto& [name, _] : original) names.insert(name);
  EXPECT_TRUE(names.count("blocks.1.self_attn.q.weight") && names.count("blocks.0.norm3.bias") &&
              names.count("head.modulation") && names.count("time_projection.1.weight") &&
              names.count("blocks.0.ffn.2.bias"));
  mm::st::save_safetensors(dir + "/original.safetensors", original);
  // diffusers' converter maps our original names back to exactly its own.
  python_reference("wan_dit from_original " + dir + "/original.safetensors " + dir + "/converted.safetensors");
  mm::st::HFWeights converted(dir + "/converted.safetensors");
  EXPECT_EQ(converted.keys().size(), original.size());
  for (auto& [name, p] : m->named_parameters()) {
    ASSERT_TRUE(converted.has(name)) << name;
    EXPECT_TRUE(converted.get(name).equal(p)) << name;
  }
  // And mm loads the original file (also with ComfyUI's prefix) into the same weights.
  for (const std::string prefix : {"", "model.diffusion_model."}) {
    std::vector<std::pair<std::string, at::Tensor>> prefixed;
    for (auto& [name, t] : original) prefixed.emplace_back(prefix + name, t);
    mm::st::save_safetensors(dir + "/prefixed.safetensors", prefixed);
    WanTransformer3DModel loaded(m->config);
    mm::checkpoint::load_model_weights(loaded, dir + "/prefixed.safetensors", {},
                                       [&](const std::string& k) { return loaded.parameter_name(k); });
    auto a = loaded.named_parameters(), b = m->named_parameters();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].second.equal(b[i].second)) << prefix << a[i].first;
  }
}

TEST(WanDiT, BadConfigsAndInputsAreClearErrors) {
  nlohmann::json cfg = tiny_config();
  cfg["image_dim"] = 1280;
  try {
    WanDiTConfig::from_json(cfg, "i2v/config.json", false);
    ADD_FAILURE() << "image_dim accepted";
  } catch (const mm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("image_dim is set: image conditioning (image-to-video) is not implemented"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("i2v/config.json"), std::string::npos) << e.what();
  }
  cfg = tiny_config();
  cfg["patch_size"] = {2, 2};
  EXPECT_THROW(WanDiTConfig::from_json(cfg, "x.json", false), mm::ConfigError);
  cfg = tiny_config();
  cfg["num_layerz"] = 3;
  try {
    WanDiTConfig::from_json(cfg, "tiny.yaml", true);
    ADD_FAILURE() << "unknown key accepted";
  } catch (const mm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'num_layers'"), std::string::npos) << e.what();
  }

  WanTransformer3DModel m(WanDiTConfig::from_json(tiny_config(), "tiny", false));
  m.init_weights(1);
  at::NoGradGuard no_grad;
  const at::Tensor t = at::tensor({500.0}), text = at::randn({1, 3, 16});
  auto expect_error = [&](const at::Tensor& x, const at::Tensor& ts, const at::Tensor& tx, const std::string& want) {
    try {
      m.forward(x, ts, tx);
      ADD_FAILURE() << "accepted " << x.sizes();
    } catch (const mm::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error(at::randn({1, 3, 2, 4, 4}), t, text, "wan_dit: latents must be [B, 4, F, H, W]");
  expect_error(at::randn({1, 4, 2, 5, 4}), t, text, "do not divide into patches of 1 x 2 x 2");
  expect_error(at::randn({1, 4, 2, 4, 4}), at::tensor({1.0, 2.0}), text, "wan_dit: timesteps must be [1]");
  expect_error(at::randn({1, 4, 2, 4, 4}), t, at::randn({1, 3, 15}), "wan_dit: text features must be [1, L, 16]");
  expect_error(at::randn({1, 4, 40, 4, 4}), t, text, "longer than rope_max_seq_len 32");
}

TEST(WanDiT, InitIsDeterministicAndHeadStartsAtZero) {
  WanTransformer3DModel a(WanDiTConfig::from_json(tiny_config(), "tiny", false)),
      b(WanDiTConfig::from_json(tiny_config(), "tiny", false));
  a.init_weights(7);
  b.init_weights(7);
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].second.equal(pb[i].second)) << pa[i].first;
  EXPECT_EQ(a.proj_out->weight.abs().max().item<double>(), 0.0);  // Wan zeroes its head
  EXPECT_GT(a.blocks_[0]->attn1->to_q->weight.abs().max().item<double>(), 0.0);
  at::NoGradGuard no_grad;
  const at::Tensor y = a.forward(at::randn({1, 4, 2, 4, 4}), at::tensor({10.0}), at::randn({1, 3, 16}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 4, 2, 4, 4}));
}
