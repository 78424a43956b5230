// Qwen2 decoder LM: HF parameter names and counts, config parsing (strict and HF), deterministic
// init, causality, gradients, FLOPs arithmetic, registry.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/models/qwen2/qwen2.h"

namespace {

using mm::models::Qwen2Config;
using mm::models::Qwen2ForCausalLM;
using nlohmann::json;

json tiny_json(bool tied = false) {
  return json{{"vocab_size", 32},        {"hidden_size", 16},       {"intermediate_size", 24},
              {"num_hidden_layers", 2},  {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-6},    {"rope_theta", 10000.0},   {"tie_word_embeddings", tied}};
}

std::string config_error(const json& j, bool strict) {
  try {
    Qwen2Config::from_json(j, "tiny.yaml", strict);
  } catch (const mm::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Qwen2, ParameterNamesAndCount) {
  auto c = Qwen2Config::from_json(tiny_json(), "tiny.yaml", true);
  Qwen2ForCausalLM m(c);
  std::vector<std::string> names;
  for (auto& [n, _] : m.named_parameters()) names.push_back(n);
  const std::vector<std::string> first = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.q_proj.bias",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.k_proj.bias",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.v_proj.bias",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
  };
  ASSERT_EQ(names.size(), 1 + 2 * 12 + 1 + 1u);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(names[i], first[i]);
  EXPECT_EQ(names[13], "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");

  const int64_t V = 32, H = 16, I = 24, L = 2, KV = 2 * (16 / 4);
  const int64_t per_layer = (H * H + H) + 2 * (H * KV + KV) + H * H + 2 * H + 3 * H * I;
  const int64_t expected = V * H + L * per_layer + H + V * H;
  EXPECT_EQ(m.num_parameters(), expected);  // 512 + 2 * 1984 + 16 + 512 = 5008
  EXPECT_EQ(m.model->embed_tokens->weight.sizes(), (at::IntArrayRef{V, H}));
  EXPECT_EQ(m.model->layers[1]->self_attn->k_proj->weight.sizes(), (at::IntArrayRef{KV, H}));
  EXPECT_EQ(m.blocks().size(), 2u);
}

TEST(Qwen2, TiedEmbeddingsHaveNoLmHead) {
  Qwen2ForCausalLM tied(Qwen2Config::from_json(tiny_json(true), "tiny.yaml", true));
  Qwen2ForCausalLM untied(Qwen2Config::from_json(tiny_json(false), "tiny.yaml", true));
  for (auto& [n, _] : tied.named_parameters()) EXPECT_NE(n, "lm_head.weight");
  EXPECT_EQ(tied.lm_head, nullptr);
  EXPECT_EQ(untied.num_parameters() - tied.num_parameters(), 32 * 16);
  tied.init_weights(3);
  at::Tensor ids = at::tensor(std::vector<int64_t>{1, 5, 9}, at::kLong).view({1, 3});
  at::Tensor logits = tied.forward(ids);
  at::Tensor hidden = tied.model->forward(tied.model->embed_tokens->forward(ids),
                                          tied.model->make_context(at::arange(3, at::kLong).view({1, 3}), at::kFloat));
  // Tied logits are hidden . embed_tokens^T.
  EXPECT_LT((logits - at::matmul(hidden, tied.model->embed_tokens->weight.t())).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(tied.hf_config()["tie_word_embeddings"], true);
}

TEST(Qwen2, ConfigStrictnessAndErrors) {
  json typo = tiny_json();
  typo["hidden_szie"] = 16;
  std::string e = config_error(typo, true);
  EXPECT_NE(e.find("unknown qwen2 key 'hidden_szie'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'hidden_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("tiny.yaml"), std::string::npos) << e;
  EXPECT_EQ(config_error(typo, false), "");  // HF config.json: ignored

  json hf = tiny_json();
  hf["architectures"] = json::array({"Qwen2ForCausalLM"});
  hf["transformers_version"] = "4.43.1";
  hf["model_type"] = "qwen2";
  hf["use_sliding_window"] = false;
  hf["sliding_window"] = 32768;
  hf["max_window_layers"] = 21;
  hf["eos_token_id"] = 151645;
  hf["torch_dtype"] = "bfloat16";
  EXPECT_EQ(config_error(hf, true), "");
  EXPECT_EQ(config_error(hf, false), "");

  json bad_heads = tiny_json();
  bad_heads["hidden_size"] = 18;
  e = config_error(bad_heads, false);
  EXPECT_NE(e.find("hidden_size must be a multiple of num_attention_heads (got 18 and 4)"), std::string::npos) << e;

  json bad_kv = tiny_json();
  bad_kv["num_key_value_heads"] = 3;
  e = config_error(bad_kv, false);
  EXPECT_NE(e.find("num_attention_heads must be a multiple of num_key_value_heads (got 4 and 3)"), std::string::npos) << e;

  json missing = tiny_json();
  missing.erase("vocab_size");
  EXPECT_NE(config_error(missing, false).find("vocab_size is required"), std::string::npos);

  json zero = tiny_json();
  zero["num_hidden_layers"] = 0;
  EXPECT_NE(config_error(zero, false).find("num_hidden_layers must be > 0 (got 0)"), std::string::npos);

  json wrong_type = tiny_json();
  wrong_type["hidden_size"] = "16";
  EXPECT_NE(config_error(wrong_type, false).find("hidden_size must be an integer"), std::string::npos);

  json gelu = tiny_json();
  gelu["hidden_act"] = "gelu";
  EXPECT_NE(config_error(gelu, false).find("hidden_act must be \"silu\""), std::string::npos);

  json dropout = tiny_json();
  dropout["attention_dropout"] = 0.1;
  EXPECT_NE(config_error(dropout, false).find("attention_dropout must be 0"), std::string::npos);

  json sliding = tiny_json();
  sliding["use_sliding_window"] = true;
  EXPECT_NE(config_error(sliding, false).find("use_sliding_window"), std::string::npos);
}

TEST(Qwen2, ConfigRoundTripsThroughHfJson) {
  json hf = tiny_json(true);
  hf["eos_token_id"] = json::array({151643, 151645});
  hf["bos_token_id"] = 151643;
  hf["torch_dtype"] = "bfloat16";
  auto c = Qwen2Config::from_json(hf, "config.json", false);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.eos_token_id.size(), 2u);
  json out = c.to_json();
  EXPECT_EQ(out["model_type"], "qwen2");
  EXPECT_EQ(out["architectures"][0], "Qwen2ForCausalLM");
  auto back = Qwen2Config::from_json(out, "written config.json", true);  // strict accepts what we write
  EXPECT_EQ(back.to_json(), out);
  // num_key_value_heads defaults to num_attention_heads, as in HF.
  json no_kv = tiny_json();
  no_kv.erase("num_key_value_heads");
  EXPECT_EQ(Qwen2Config::from_json(no_kv, "x", true).num_key_value_heads, 4);
}

TEST(Qwen2, InitIsDeterministicAndHasTheRightStatistics) {
  json big = tiny_json();
  big["vocab_size"] = 1000;
  big["hidden_size"] = 64;
  big["initializer_range"] = 0.05;
  auto c = Qwen2Config::from_json(big, "tiny.yaml", true);
  Qwen2ForCausalLM a(c), b(c), d(c, at::kDouble);
  a.init_weights(7);
  b.init_weights(7);
  d.init_weights(7);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pd = d.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i].second, pb[i].second)) << pa[i].first;
    EXPECT_TRUE(at::equal(pa[i].second.to(at::kDouble), pd[i].second)) << pa[i].first;  // dtype-independent
  }
  b.init_weights(8);
  EXPECT_FALSE(at::equal(a.model->embed_tokens->weight, b.model->embed_tokens->weight));

  const double sd = a.model->embed_tokens->weight.std().item<double>();  // 64000 samples
  EXPECT_NEAR(sd, 0.05, 0.05 * 0.02);
  EXPECT_NEAR(a.model->embed_tokens->weight.mean().item<double>(), 0.0, 0.002);
  EXPECT_EQ(a.model->layers[0]->self_attn->q_proj->bias.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(a.model->layers[1]->input_layernorm->weight.sum().item<double>(), 64.0);
  EXPECT_EQ(a.model->norm->weight.min().item<double>(), 1.0);
}

TEST(Qwen2, ForwardShapeCausalityAndGradients) {
  auto c = Qwen2Config::from_json(tiny_json(), "tiny.yaml", true);
  Qwen2ForCausalLM m(c, at::kDouble);
  m.init_weights(1);
  // Larger weights than 0.02 so that the causality check below is not trivially satisfied.
  {
    at::NoGradGuard ng;
    for (auto& p : m.parameters())
      if (p.dim() == 2) p.mul_(10.0);
  }
  at::Tensor ids = at::tensor(std::vector<int64_t>{1, 4, 9, 16, 25, 3, 2, 7, 11, 13}, at::kLong).view({2, 5});
  at::Tensor logits = m.forward(ids);
  ASSERT_EQ(logits.sizes(), (at::IntArrayRef{2, 5, 32}));
  EXPECT_EQ(logits.scalar_type(), at::kDouble);

  // Changing token t leaves logits before t unchanged and changes those from t on.
  const int64_t t = 3;
  at::Tensor ids2 = ids.clone();
  ids2.index_put_({0, t}, 30);
  at::Tensor logits2 = m.forward(ids2);
  double before = (logits - logits2).narrow(1, 0, t).abs().max().item<double>();
  double at_t = (logits - logits2)[0][t].abs().max().item<double>();
  double other_sample = (logits - logits2)[1].abs().max().item<double>();
  std::printf("causality: max |dlogits| before t %.3g, at t %.3g\n", before, at_t);
  EXPECT_LT(before, 1e-12);
  EXPECT_EQ(other_sample, 0.0);
  EXPECT_GT(at_t, 1e-3);

  // Explicit position ids equal to the default arange give identical logits.
  at::Tensor pos = at::arange(5, at::kLong).unsqueeze(0).expand({2, 5});
  EXPECT_TRUE(at::equal(m.forward(ids, pos), logits));

  at::Tensor labels = ids.roll(-1, 1);
  labels.index_put_({at::indexing::Slice(), 4}, -100);
  at::Tensor loss = mm::models::lm_cross_entropy(logits, labels);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  loss.backward();
  for (auto& [n, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n;
    EXPECT_TRUE(at::isfinite(p.grad()).all().item<bool>()) << n;
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0) << n;
  }
}

TEST(Qwen2, FlopsPerTokenArithmetic) {
  auto c = Qwen2Config::from_json(tiny_json(), "tiny.yaml", true);
  // N = L * (2 H^2 + 2 H KV + 3 H I) + H V = 2 * (512 + 256 + 1152) + 512 = 4352
  EXPECT_EQ(c.matmul_params(), 4352);
  // 6 N + 12 L S H at S = 8: 26112 + 3072
  EXPECT_DOUBLE_EQ(c.flops_per_token(8), 26112.0 + 3072.0);
}

TEST(Qwen2, RegistryBuildsFromHfConfig) {
  ASSERT_TRUE(mm::models::model_registry().has("qwen2"));
  auto lm = mm::models::as_causal_lm(mm::models::model_registry().get("qwen2")(tiny_json(), "test", false), "test");
  EXPECT_EQ(lm->vocab_size(), 32);
  EXPECT_EQ(lm->blocks().size(), 2u);
  EXPECT_EQ(lm->hf_config()["num_key_value_heads"], 2);
  lm->init_weights(0);
  at::Tensor logits = lm->forward(at::zeros({1, 4}, at::kLong));
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{1, 4, 32}));
}

}  // namespace
