// Generation (mindspeed_mm/inference/generate.h): decoding against the KV cache gives the same
// tokens (and logits to float rounding) as re-running the whole sequence, for the Qwen2 text
// model and for Qwen2-VL with an image and a video in the prompt; the logits processors match
// hand-computed cases (repetition penalty, top-k, top-p as transformers defines them); sampling
// is reproducible by seed and draws from the processed distribution; stop tokens end generation.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/inference/generate.h"
#include "mindspeed_mm/models/common/kv_cache.h"
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"

using namespace mm::models;
using mm::inference::SamplingOptions;
using nlohmann::json;

namespace {

json text_config() {
  return json::parse(R"({"vocab_size": 263, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0})");
}

std::shared_ptr<Qwen2ForCausalLM> text_model(at::ScalarType dtype = at::kFloat) {
  auto m = std::make_shared<Qwen2ForCausalLM>(Qwen2Config::from_json(text_config(), "test", false), dtype);
  m->init_weights(3);
  // Larger weights than the init so the logits are far from uniform and greedy is decisive.
  at::NoGradGuard no_grad;
  for (auto& [n, p] : m->named_parameters())
    if (n.find("norm") == std::string::npos) p.mul_(8.0);
  return m;
}

std::shared_ptr<Qwen2VLForConditionalGeneration> vl_model() {
  json j = text_config();
  j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}};
  j["image_token_id"] = 261;
  j["video_token_id"] = 262;
  j["vision_start_token_id"] = 259;
  j["vision_end_token_id"] = 260;
  j["vision_config"] = json::parse(R"({"depth": 1, "embed_dim": 16, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14})");
  auto m = std::make_shared<Qwen2VLForConditionalGeneration>(Qwen2VLConfig::from_json(j, "test", false));
  m->init_weights(4);
  at::NoGradGuard no_grad;
  for (auto& [n, p] : m->named_parameters())
    if (n.find("norm") == std::string::npos && n.find("ln_q") == std::string::npos) p.mul_(8.0);
  return m;
}

MultimodalInputs ids_prompt(std::vector<int64_t> ids) {
  MultimodalInputs in;
  in.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
  return in;
}

}  // namespace

TEST(Generate, CachedDecodingEqualsFullRecomputeForText) {
  auto m = text_model();
  SamplingOptions o;
  o.max_new_tokens = 24;
  MultimodalInputs p = ids_prompt({'H', 'e', 'l', 'l', 'o', ' '});
  auto cached = mm::inference::generate(*m, p, o);
  o.use_cache = false;
  auto full = mm::inference::generate(*m, p, o);
  ASSERT_EQ(cached.tokens.size(), 24u);
  EXPECT_EQ(cached.tokens, full.tokens);
  EXPECT_EQ(cached.finish_reason, "length");

  // Step by step: the logits of each cached step equal the last row of a full forward.
  at::NoGradGuard no_grad;
  mm::nn::KVCache cache;
  MultimodalInputs in = p;
  in.kv_cache = &cache;
  std::vector<int64_t> seq = {'H', 'e', 'l', 'l', 'o', ' '};
  at::Tensor step = m->forward_multimodal(in);
  double worst = 0;
  for (int i = 0; i < 8; ++i) {
    at::Tensor ref = m->forward(at::tensor(seq, at::kLong).unsqueeze(0));
    worst = std::max(worst, (step[0][-1] - ref[0][-1]).abs().max().item<double>());
    const int64_t next = ref[0][-1].argmax().item<int64_t>();
    seq.push_back(next);
    MultimodalInputs s;
    s.input_ids = at::tensor(std::vector<int64_t>{next}, at::kLong).view({1, 1});
    s.kv_cache = &cache;
    step = m->forward_multimodal(s);
  }
  EXPECT_EQ(cache.length(), static_cast<int64_t>(seq.size()));
  std::printf("cached vs full logits, float32: max abs difference %.3g\n", worst);
  EXPECT_LT(worst, 1e-4);
}

TEST(Generate, CachedSamplingEqualsFullRecomputeInFloat64) {
  auto m = text_model(at::kDouble);
  SamplingOptions o;
  o.max_new_tokens = 32;
  o.temperature = 0.9;
  o.top_k = 40;
  o.top_p = 0.95;
  o.repetition_penalty = 1.3;
  o.seed = 17;
  MultimodalInputs p = ids_prompt({'a', 'b', 'c'});
  auto cached = mm::inference::generate(*m, p, o);
  auto again = mm::inference::generate(*m, p, o);
  o.use_cache = false;
  auto full = mm::inference::generate(*m, p, o);
  EXPECT_EQ(cached.tokens, full.tokens);
  EXPECT_EQ(cached.tokens, again.tokens);  // the seed fixes the draw
  o.seed = 18;
  o.use_cache = true;
  EXPECT_NE(mm::inference::generate(*m, p, o).tokens, cached.tokens);
}

TEST(Generate, CachedDecodingEqualsFullRecomputeWithImageAndVideo) {
  auto m = vl_model();
  std::vector<int64_t> ids = {'d', 'e', 's', 'c', 'r', 'i', 'b', 'e', 259};
  ids.insert(ids.end(), 4, 261);  // image (1, 4, 4) -> 4 merged tokens
  ids.insert(ids.end(), {260, 'a', 'n', 'd', 259});
  ids.insert(ids.end(), 8, 262);  // video (2, 4, 4) -> 8
  ids.insert(ids.end(), {260, ':'});
  MultimodalInputs p = ids_prompt(ids);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
  p.image_grid_thw = at::tensor(std::vector<int64_t>{1, 4, 4}, at::kLong).view({1, 3});
  p.pixel_values = at::empty({16, 3 * 2 * 14 * 14}).normal_(0, 1, gen);
  p.video_grid_thw = at::tensor(std::vector<int64_t>{2, 4, 4}, at::kLong).view({1, 3});
  p.pixel_values_videos = at::empty({32, 3 * 2 * 14 * 14}).normal_(0, 1, gen);
  SamplingOptions o;
  o.max_new_tokens = 16;
  auto cached = mm::inference::generate(*m, p, o);
  o.use_cache = false;
  auto full = mm::inference::generate(*m, p, o);
  EXPECT_EQ(cached.tokens, full.tokens);
  EXPECT_EQ(cached.tokens.size(), 16u);
  // The image matters: other pixels, other text.
  MultimodalInputs q = p;
  q.pixel_values = p.pixel_values.flip({0});
  o.use_cache = true;
  EXPECT_NE(mm::inference::generate(*m, q, o).tokens, cached.tokens);
}

TEST(Generate, StopTokensAndStopCallback) {
  auto m = text_model();
  SamplingOptions o;
  o.max_new_tokens = 12;
  MultimodalInputs p = ids_prompt({'x', 'y'});
  auto free_run = mm::inference::generate(*m, p, o);
  ASSERT_GE(free_run.tokens.size(), 4u);
  // Stop at the first occurrence of the third token: it is not returned.
  const int64_t stop = free_run.tokens[2];
  size_t first = std::find(free_run.tokens.begin(), free_run.tokens.end(), stop) - free_run.tokens.begin();
  o.stop_token_ids = {stop};
  auto stopped = mm::inference::generate(*m, p, o);
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.tokens, std::vector<int64_t>(free_run.tokens.begin(), free_run.tokens.begin() + first));
  o.stop_token_ids.clear();
  auto two = mm::inference::generate(*m, p, o, [](const std::vector<int64_t>& t) { return t.size() == 2; });
  EXPECT_EQ(two.tokens.size(), 2u);
  EXPECT_EQ(two.finish_reason, "stop");
  o.max_new_tokens = 0;
  EXPECT_TRUE(mm::inference::generate(*m, p, o).tokens.empty());
}

TEST(Generate, LogitsProcessorsMatchHandComputedCases) {
  SamplingOptions o;
  // Repetition penalty 2: seen positive logits halve, seen negative ones double, others stay.
  o.repetition_penalty = 2.0;
  at::Tensor l = at::tensor(std::vector<float>{2.0f, -1.0f, 3.0f, 0.5f});
  at::Tensor r = mm::inference::processed_logits(l, {0, 1, 1}, o);
  EXPECT_TRUE(at::allclose(r, at::tensor(std::vector<float>{1.0f, -2.0f, 3.0f, 0.5f})));
  // top-p 0.8 over probabilities {0.5, 0.3, 0.15, 0.05}: ascending cumulative 0.05, 0.2, 0.5, 1
  // removes the tokens at or below 0.2 -> {0.5, 0.3} remain, renormalised.
  o = SamplingOptions();
  o.temperature = 1.0;
  o.top_p = 0.8;
  at::Tensor probs = at::tensor(std::vector<float>{0.15f, 0.5f, 0.05f, 0.3f});
  at::Tensor out = mm::inference::processed_logits(probs.log(), {}, o).exp();
  EXPECT_NEAR(out[1].item<float>(), 0.5f / 0.8f, 1e-5);
  EXPECT_NEAR(out[3].item<float>(), 0.3f / 0.8f, 1e-5);
  EXPECT_EQ(out[0].item<float>(), 0.0f);
  EXPECT_EQ(out[2].item<float>(), 0.0f);
  // top-p tiny keeps the single most likely token.
  o.top_p = 1e-6;
  EXPECT_EQ(mm::inference::processed_logits(probs.log(), {}, o).exp().gt(0).sum().item<int64_t>(), 1);
  // top-k 2 keeps the two largest; temperature 0.5 doubles the logits before the softmax.
  o = SamplingOptions();
  o.temperature = 0.5;
  o.top_k = 2;
  out = mm::inference::processed_logits(at::tensor(std::vector<float>{1.0f, 3.0f, 2.0f, 0.0f}), {}, o).exp();
  const double e = std::exp(2.0);  // exp(2 * 3) / exp(2 * 2)
  EXPECT_NEAR(out[1].item<float>(), e / (1 + e), 1e-5);
  EXPECT_NEAR(out[2].item<float>(), 1 / (1 + e), 1e-5);
  EXPECT_EQ(out[0].item<float>(), 0.0f);
  // Sampling draws from that distribution (4000 draws, 4 standard deviations).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  int hits = 0;
  for (int i = 0; i < 4000; ++i)
    hits += mm::inference::choose_next_token(at::tensor(std::vector<float>{1.0f, 3.0f, 2.0f, 0.0f}), {}, o, gen) == 1;
  const double p1 = e / (1 + e), sd = std::sqrt(p1 * (1 - p1) / 4000);
  EXPECT_NEAR(hits / 4000.0, p1, 4 * sd);
  // Bad options are ConfigErrors.
  o.top_p = 0;
  EXPECT_THROW(o.validate(), mm::ConfigError);
  o = SamplingOptions();
  o.temperature = -1;
  EXPECT_THROW(o.validate(), mm::ConfigError);
}
