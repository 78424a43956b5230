// Conformance of Qwen2ForCausalLM with Hugging Face's modeling_qwen2: our logits against those of
// tests/conformance/qwen2_reference.py, an independent eager-PyTorch reference run by Debian's
// python3-torch on the HF directory we export. float64 must agree to 1e-10 (the same math in a
// different order); float32 to 1e-4 (rounding of ~1e-7 relative through two layers).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/models/qwen2/qwen2.h"
#include "run_command.h"

namespace {

using mm::models::Qwen2Config;
using mm::models::Qwen2ForCausalLM;
using nlohmann::json;

const char* const kPython = "/usr/bin/python3";

std::string reference_script() { return mm::test::source_dir() + "/tests/conformance/qwen2_reference.py"; }

// Exports `model` to dir as an HF directory next to inputs.safetensors, runs the reference on it
// and returns its logits.
at::Tensor reference_logits(const std::string& dir, Qwen2ForCausalLM& model, const at::Tensor& input_ids,
                            const at::Tensor& position_ids) {
  mm::checkpoint::export_hf_directory(dir, model.hf_config(), model);
  std::vector<std::pair<std::string, at::Tensor>> inputs = {{"input_ids", input_ids}};
  if (position_ids.defined()) inputs.emplace_back("position_ids", position_ids);
  mm::st::save_safetensors(dir + "/inputs.safetensors", inputs);
  auto r = mm::test::run_command(std::string(kPython) + " " + reference_script() + " " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  return mm::st::SafetensorsReader(dir + "/logits.safetensors").get_copy("logits");
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Gives norm weights and q/k/v biases values away from their init (ones, zeros), so a swapped or
// dropped norm weight or bias shows in the logits.
void perturb_norms_and_biases(Qwen2ForCausalLM& model, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& [name, p] : model.named_parameters()) {
    const bool is_norm = name.find("norm.weight") != std::string::npos;
    const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (!is_norm && !is_bias) continue;
    at::Tensor noise = at::empty(p.sizes(), at::TensorOptions().dtype(at::kDouble)).normal_(0.0, 0.3, gen);
    p.copy_(is_norm ? 1.0 + noise : noise);
  }
}

struct Case {
  const char* name;
  json config;
  bool explicit_positions;
};

void check_conformance(const Case& c) {
  auto probe = mm::test::run_command(std::string(kPython) + " -c 'import torch'");
  ASSERT_EQ(probe.exit_code, 0) << kPython << " cannot import torch; install Debian's python3-torch package "
                                << "(scripts install it) to run the HF conformance reference.\n" << probe.output;

  Qwen2Config cfg = Qwen2Config::from_json(c.config, c.name, /*strict=*/true);
  auto owned = std::make_shared<Qwen2ForCausalLM>(cfg, at::kDouble);  // Module::to needs shared ownership
  Qwen2ForCausalLM& model = *owned;
  model.init_weights(11);
  perturb_norms_and_biases(model, 12);

  const int64_t B = 2, S = 13;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(13);
  at::Tensor ids = at::randint(cfg.vocab_size, {B, S}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor pos;
  if (c.explicit_positions) {
    // Row 0 continues a sequence from position 5; row 1 packs two documents (7 + 6 tokens).
    pos = at::cat({at::arange(5, 5 + S, at::kLong).unsqueeze(0),
                   at::cat({at::arange(7, at::kLong), at::arange(S - 7, at::kLong)}).unsqueeze(0)});
  }

  const std::string dir = mm::test::fresh_dir(std::string("qwen2_conformance_") + c.name);
  at::NoGradGuard no_grad;

  at::Tensor ref64 = reference_logits(dir + "/f64", model, ids, pos);
  ASSERT_TRUE(ref64.defined());
  ASSERT_EQ(ref64.scalar_type(), at::kDouble);
  at::Tensor ours64 = model.forward(ids, pos);
  ASSERT_EQ(ours64.sizes(), ref64.sizes());
  const double d64 = max_abs_diff(ours64, ref64);
  std::printf("[%s] float64: max |ours - HF reference| = %.3e (max |logit| %.3f)\n", c.name, d64,
              ref64.abs().max().item<double>());
  EXPECT_LT(d64, 1e-10);

  model.to(at::kFloat);
  at::Tensor ref32 = reference_logits(dir + "/f32", model, ids, pos);
  ASSERT_TRUE(ref32.defined());
  ASSERT_EQ(ref32.scalar_type(), at::kFloat);
  at::Tensor ours32 = model.forward(ids, pos);
  ASSERT_EQ(ours32.scalar_type(), at::kFloat);
  const double d32 = max_abs_diff(ours32, ref32), d32_64 = max_abs_diff(ours32, ref64);
  std::printf("[%s] float32: max |ours - HF reference f32| = %.3e, max |ours - HF reference f64| = %.3e\n", c.name,
              d32, d32_64);
  EXPECT_LT(d32, 1e-4);
  EXPECT_LT(d32_64, 1e-4);
}

// initializer_range 0.2 (not 0.02) makes attention scores O(1), so the softmax is far from
// uniform and rotary or mask errors are visible in the logits.
json base_config() {
  return json{{"vocab_size", 97},          {"hidden_size", 64},          {"intermediate_size", 112},
              {"num_hidden_layers", 2},    {"num_attention_heads", 4},   {"num_key_value_heads", 2},
              {"initializer_range", 0.2}};
}

TEST(Qwen2Conformance, UntiedTheta1e4MatchesHFReference) {
  json j = base_config();
  j["tie_word_embeddings"] = false;
  j["rope_theta"] = 10000.0;
  j["rms_norm_eps"] = 1e-6;
  check_conformance({"untied", j, /*explicit_positions=*/false});
}

TEST(Qwen2Conformance, TiedTheta1e6PositionIdsMatchesHFReference) {
  json j = base_config();
  j["tie_word_embeddings"] = true;
  j["rope_theta"] = 1e6;
  j["rms_norm_eps"] = 1e-5;
  check_conformance({"tied", j, /*explicit_positions=*/true});
}

}  // namespace
