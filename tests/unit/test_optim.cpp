// AdamW against a scalar reference of torch.optim.AdamW's update; LR schedules; clipping;
// registries survive static linking.
#include <gtest/gtest.h>

#include <cmath>

#include "mindspeed_mm/training/lr_schedule.h"
#include "mindspeed_mm/training/optimizer.h"

namespace {

using namespace mm::training;

TEST(AdamW, MatchesScalarReferenceOverSteps) {
  at::Tensor w = at::tensor({0.5, -1.0, 2.0}, at::kDouble).to(at::kFloat).set_requires_grad(true);
  ParamGroup g;
  g.names = {"w"};
  g.params = {w};
  AdamW opt({g}, 0.9, 0.95, 1e-8, 0.1);
  double ref[3] = {0.5, -1.0, 2.0}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0};
  const double lr = 0.01;
  for (int step = 1; step <= 5; ++step) {
    // Gradient of sum(w^3): 3 w^2.
    w.mutable_grad() = (3 * w.detach() * w.detach());
    opt.step(lr);
    for (int i = 0; i < 3; ++i) {
      double gr = 3 * ref[i] * ref[i];
      ref[i] *= 1 - lr * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * gr;
      v[i] = 0.95 * v[i] + 0.05 * gr * gr;
      double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
      ref[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + 1e-8);
    }
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w[i].item<double>(), ref[i], 1e-6);
  EXPECT_EQ(opt.step_count(), 5);
}

TEST(AdamW, StateRoundTripContinuesIdentically) {
  auto make = [](at::Tensor& w) {
    ParamGroup g;
    g.names = {"w"};
    g.params = {w};
    return AdamW({g}, 0.9, 0.99, 1e-8, 0.0);
  };
  at::Tensor a = at::randn({4}).set_requires_grad(true);
  at::Tensor b = a.detach().clone().set_requires_grad(true);
  AdamW oa = make(a);
  for (int i = 0; i < 3; ++i) { a.mutable_grad() = a.detach().sin(); oa.step(0.1); }
  b.detach().copy_(a.detach());
  AdamW ob = make(b);
  std::map<std::string, at::Tensor> saved;
  for (auto& [k, t] : oa.state()) saved[k] = t.clone();
  ob.load_state([&](const std::string& k) { return saved.at(k); });
  a.mutable_grad() = a.detach().cos();
  b.mutable_grad() = b.detach().cos();
  oa.step(0.1);
  ob.step(0.1);
  EXPECT_TRUE(at::equal(a, b));
}

TEST(LRSchedule, WarmupCosineLinearConstant) {
  mm::config::LRScheduleConfig c;
  c.warmup_iters = 10;
  c.min_lr = 0.1;
  c.id = "cosine";
  auto cos = make_lr_schedule(c, 1.0, 110);
  EXPECT_DOUBLE_EQ(cos(0), 0.1);
  EXPECT_DOUBLE_EQ(cos(9), 1.0);
  EXPECT_DOUBLE_EQ(cos(10), 1.0);
  EXPECT_NEAR(cos(60), 0.55, 1e-12);  // halfway: min + (max-min)/2
  EXPECT_DOUBLE_EQ(cos(110), 0.1);
  EXPECT_DOUBLE_EQ(cos(500), 0.1);
  c.id = "linear";
  auto lin = make_lr_schedule(c, 1.0, 110);
  EXPECT_NEAR(lin(35), 0.775, 1e-12);
  c.id = "constant";
  EXPECT_DOUBLE_EQ(make_lr_schedule(c, 1.0, 110)(80), 1.0);
  c.id = "cosin";
  try {
    make_lr_schedule(c, 1.0, 10);
    FAIL();
  } catch (const mm::ConfigError& e) {
    EXPECT_STREQ(e.what(), "config: training.lr_schedule.id: unknown lr_schedule id 'cosin' (known: constant, cosine, linear)");
  }
}

TEST(ClipGradNorm, ScalesToMaxNorm) {
  at::Tensor a = at::zeros({2}).set_requires_grad(true), b = at::zeros({1}).set_requires_grad(true);
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(a.grad()[0].item<double>(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad()[0].item<double>(), 0.8, 1e-6);
}

TEST(Registry, BuiltinsSurviveLinking) {
  EXPECT_TRUE(optimizer_registry().has("adamw"));
  EXPECT_EQ(lr_schedule_registry().ids(), (std::vector<std::string>{"constant", "cosine", "linear"}));
}

}  // namespace
