// Freeze and recompute plans: counts, requires_grad flags, gradients with recompute equal to
// gradients without (float64 and float32), RNG replay for dropout, pattern errors.
#include <gtest/gtest.h>

#include "config_error.h"

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/models/common/linear.h"
#include "mindspeed_mm/models/qwen2/qwen2.h"
#include "mindspeed_mm/training/plans.h"
#include "mindspeed_mm/training/recompute.h"

namespace {

using mm::models::Qwen2Config;
using mm::models::Qwen2ForCausalLM;

std::shared_ptr<Qwen2ForCausalLM> tiny_model(at::ScalarType dtype, uint64_t seed = 5) {
  nlohmann::json j = {{"vocab_size", 32}, {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 3},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"initializer_range", 0.2}};
  auto m = std::make_shared<Qwen2ForCausalLM>(Qwen2Config::from_json(j, "plans test", true), dtype);
  m->init_weights(seed);
  return m;
}

at::Tensor batch_ids() {
  return at::tensor(std::vector<int64_t>{1, 4, 9, 16, 25, 3, 2, 7, 11, 13, 0, 31}, at::kLong).view({2, 6});
}

double train_step(Qwen2ForCausalLM& m) {
  m.zero_grad();
  at::Tensor ids = batch_ids();
  at::Tensor loss = mm::models::lm_cross_entropy(m.forward(ids), ids.roll(-1, 1));
  loss.backward();
  return loss.item<double>();
}

// Max abs difference over all parameter gradients (undefined grads must match too).
double max_grad_diff(const Qwen2ForCausalLM& a, const Qwen2ForCausalLM& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  double m = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const at::Tensor &ga = pa[i].second.grad(), &gb = pb[i].second.grad();
    EXPECT_EQ(ga.defined(), gb.defined()) << pa[i].first;
    if (ga.defined() && gb.defined()) m = std::max(m, (ga - gb).abs().max().item<double>());
  }
  return m;
}

using mm::test::config_error;

TEST(Plans, FreezeCountsAndFlags) {
  auto m = tiny_model(at::kFloat);
  // Module paths and a full parameter name: embed (1) + layer 0 q,k,v (w+b) and o (7) + norm (1).
  int64_t n = mm::training::apply_freeze_plan(
      *m, {"model.embed_tokens", "model.layers.{0}.self_attn.*_proj", "model.norm.weight"});
  EXPECT_EQ(n, 9);
  int64_t frozen = 0;
  for (auto& [name, p] : m->named_parameters()) {
    bool want_frozen = name == "model.embed_tokens.weight" || name == "model.norm.weight" ||
                       name.rfind("model.layers.0.self_attn.", 0) == 0;
    EXPECT_EQ(p.requires_grad(), !want_frozen) << name;
    frozen += !p.requires_grad();
  }
  EXPECT_EQ(frozen, 9);
  // Overlapping patterns count each tensor once; a whole subtree via '**'.
  EXPECT_EQ(mm::training::apply_freeze_plan(*m, {"model.layers.{0-1}.**", "model.layers.1.mlp"}), 2 * 12);

  // Frozen parameters get no gradient; the rest do.
  train_step(*m);
  for (auto& [name, p] : m->named_parameters()) EXPECT_EQ(p.grad().defined(), p.requires_grad()) << name;

  std::string e = config_error([&] { mm::training::apply_freeze_plan(*m, {"model.norm", "vision_tower.**"}); });
  EXPECT_NE(e.find("'vision_tower.**' matches no module or parameter"), std::string::npos) << e;
}

void expect_recompute_matches(at::ScalarType dtype, double tol) {
  auto plain = tiny_model(dtype), ckpt = tiny_model(dtype);
  EXPECT_EQ(mm::training::apply_recompute_plan(*ckpt, {"model.layers.{*}"}), 3);
  for (auto& b : ckpt->blocks()) EXPECT_TRUE(b->has_wrapper("recompute"));
  double l1 = train_step(*plain), l2 = train_step(*ckpt);
  double diff = max_grad_diff(*plain, *ckpt);
  std::printf("recompute %s: loss %.17g vs %.17g, max |grad diff| %.3g\n", at::toString(dtype), l1, l2, diff);
  EXPECT_EQ(l1, l2);
  EXPECT_LE(diff, tol);
}

TEST(Plans, RecomputeGradientsEqualPlainFloat64) { expect_recompute_matches(at::kDouble, 1e-12); }
TEST(Plans, RecomputeGradientsEqualPlainFloat32) { expect_recompute_matches(at::kFloat, 0.0); }

// With a frozen embedding the first block's input does not require grad; its parameters must
// still get gradients through the recomputed block.
TEST(Plans, RecomputeReachesParametersBehindFrozenInput) {
  auto plain = tiny_model(at::kDouble), ckpt = tiny_model(at::kDouble);
  for (auto* m : {plain.get(), ckpt.get()}) EXPECT_EQ(mm::training::apply_freeze_plan(*m, {"model.embed_tokens"}), 1);
  mm::training::apply_recompute_plan(*ckpt, {"model.layers.{*}"});
  train_step(*plain);
  train_step(*ckpt);
  ASSERT_TRUE(ckpt->model->layers[0]->mlp->up_proj->weight.grad().defined());
  EXPECT_LE(max_grad_diff(*plain, *ckpt), 1e-12);
}

// A block with dropout: recompute replays the forward's RNG state, so gradients still match,
// and the block runs twice per step (forward, then again in backward) but once under no_grad.
struct DropoutBlock : mm::nn::Block {
  std::shared_ptr<mm::models::Linear> fc;
  int calls = 0;
  DropoutBlock() { fc = register_module("fc", std::make_shared<mm::models::Linear>(8, 8, true, at::kDouble)); }
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext&) override {
    ++calls;
    return x + at::dropout(at::tanh(fc->forward(x)), 0.5, /*train=*/true);
  }
};

TEST(Plans, RecomputeReplaysDropoutRng) {
  auto make = [] {
    auto root = std::make_shared<mm::nn::Module>();
    auto blk = root->register_module("block", std::make_shared<DropoutBlock>());
    at::NoGradGuard ng;
    blk->fc->weight.copy_(at::linspace(-1, 1, 64, at::kDouble).view({8, 8}));
    return std::make_pair(root, blk);
  };
  auto [root_a, a] = make();
  auto [root_b, b] = make();
  EXPECT_EQ(mm::training::apply_recompute_plan(*root_b, {"block"}), 1);
  at::Tensor x = at::linspace(-2, 2, 32, at::kDouble).view({4, 8});
  mm::nn::ForwardContext ctx;
  auto run = [&](DropoutBlock& blk) {
    at::Tensor xi = x.clone().set_requires_grad(true);
    at::manual_seed(1234);
    blk.call(xi, ctx).pow(2).sum().backward();
    at::Tensor draw_after = at::rand({1}, at::kDouble);  // RNG stream continues as without recompute
    return std::make_pair(xi.grad(), draw_after);
  };
  auto [ga, ra] = run(*a);
  auto [gb, rb] = run(*b);
  EXPECT_EQ(a->calls, 1);
  EXPECT_EQ(b->calls, 2);
  EXPECT_TRUE(at::equal(ga, gb));
  EXPECT_TRUE(at::equal(a->fc->weight.grad(), b->fc->weight.grad()));
  EXPECT_TRUE(at::equal(ra, rb));

  // Inference: no wrapper work, one call.
  at::NoGradGuard ng;
  at::manual_seed(1);
  b->call(x, ctx);
  EXPECT_EQ(b->calls, 3);
}

TEST(Plans, RecomputePatternErrors) {
  auto m = tiny_model(at::kFloat);
  std::string e = config_error([&] { mm::training::apply_recompute_plan(*m, {"model.layerz.{*}"}); });
  EXPECT_NE(e.find("'model.layerz.{*}' matches no module"), std::string::npos) << e;
  e = config_error([&] { mm::training::apply_recompute_plan(*m, {"model.norm"}); });
  EXPECT_NE(e.find("'model.norm'"), std::string::npos) << e;
  EXPECT_NE(e.find("neither a block"), std::string::npos) << e;
  // Applying twice wraps once.
  EXPECT_EQ(mm::training::apply_recompute_plan(*m, {"model.layers.{0-1}"}), 2);
  EXPECT_EQ(mm::training::apply_recompute_plan(*m, {"model.layers.{*}"}), 3);
}

}  // namespace
