// The device layer on a machine without a GPU: training.device resolution and its errors, a
// model materialised from the deferred build equal to an eager one, one-step-ahead batch
// prefetching that keeps the loader state exact, fused AdamW against the for-loop update, and
// varlen (cu_seqlens) attention's fallback against the segment-mask path it replaces. The same
// code on CUDA is covered by tests/cuda (label cuda).
#include <gtest/gtest.h>

#include "config_error.h"
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/models/qwen2/qwen2.h"
#include "mindspeed_mm/training/device_batches.h"
#include "mindspeed_mm/training/optimizer.h"
#include "mindspeed_mm/training/model_builder.h"

namespace {

using nlohmann::json;

using mm::test::config_error;

TEST(Device, ResolvesAutoCpuAndCuda) {
  EXPECT_EQ(mm::resolve_device("cpu", 3, "training.device"), at::Device(at::kCPU));
  const int n = mm::cuda_device_count();
  if (n == 0) {
    EXPECT_EQ(mm::resolve_device("auto", 0, "training.device"), at::Device(at::kCPU));
    const std::string e = config_error([] { mm::resolve_device("cuda", 0, "training.device"); });
    EXPECT_NE(e.find("training.device is cuda"), std::string::npos) << e;
    EXPECT_NE(e.find("use auto or cpu"), std::string::npos) << e;
  } else {
    EXPECT_EQ(mm::resolve_device("auto", 0, "training.device"), at::Device(at::kCUDA, 0));
    EXPECT_EQ(mm::resolve_device("cuda", n - 1, "training.device"), at::Device(at::kCUDA, n - 1));
    const std::string e = config_error([n] { mm::resolve_device("cuda", n, "training.device"); });
    EXPECT_NE(e.find("LOCAL_RANK " + std::to_string(n)), std::string::npos) << e;
  }
  const std::string bad = config_error([] { mm::resolve_device("gpu", 0, "--device"); });
  EXPECT_NE(bad.find("--device 'gpu' must be auto, cpu, cuda or cuda:N"), std::string::npos) << bad;
  EXPECT_FALSE(config_error([] { mm::resolve_device("cuda:x", 0, "--device"); }).empty());
  EXPECT_EQ(mm::describe_device(at::kCPU), "cpu");
}

TEST(Device, ConfigDefaultsToAutoAndRejectsOthers) {
  mm::config::Config c;
  EXPECT_EQ(c.training.device, "auto");
  EXPECT_EQ(c.training.optimizer.implementation, "auto");
  const std::string e = config_error([] {
    mm::config::parse_config("training:\n  device: tpu\n", "cfg.yaml", {}, false);
  });
  EXPECT_NE(e.find("training.device"), std::string::npos) << e;
}

json tiny_qwen2() {
  return json{{"vocab_size", 40},       {"hidden_size", 32},        {"intermediate_size", 48},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-6},   {"rope_theta", 10000.0},    {"tie_word_embeddings", false}};
}

// build_model's deferred build, materialised on the device and initialised there, equals the
// eager build (constructor values, then init_weights) bit for bit: the constants of norms and
// biases come back, the random draws are the same.
TEST(Device, MaterialisedModelEqualsEagerBuild) {
  mm::config::ModelConfig mc;
  mc.id = "qwen2";
  mc.config = tiny_qwen2();
  auto built = mm::training::build_model(mc, 40, 11, nullptr, false, at::kCPU);
  auto eager = mm::models::model_registry().get("qwen2", "model.id")(tiny_qwen2(), "tiny", true);
  eager->init_weights(11);
  auto a = built->named_parameters(), b = eager->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
    EXPECT_TRUE(a[i].second.requires_grad()) << a[i].first;
  }
  // A model left deferred has shapes and no storage until materialised.
  auto deferred = mm::training::build_model(mc, 40, 11, nullptr, true);
  EXPECT_EQ(deferred->named_parameters()[0].second.storage().nbytes(), 0u);
  mm::nn::materialize(*deferred, at::kCPU);
  deferred->init_weights(11);
  EXPECT_TRUE(at::equal(deferred->named_parameters()[1].second, b[1].second));
}

// A stream of numbered batches whose state is the number handed out.
class CountingStream : public mm::data::BatchStream {
 public:
  mm::data::Batch next() override {
    mm::data::Batch b;
    b.set(mm::data::kInputIds, at::full({1, 4}, n_, at::kLong));
    b.set(mm::data::kLabels, b[mm::data::kInputIds].clone());
    ++n_;
    return b;
  }
  nlohmann::json state() const override { return {{"n", n_}}; }
  void load_state(const nlohmann::json& s) override { n_ = s.at("n").get<int64_t>(); }
  int64_t skipped_samples() const override { return n_ / 3; }
  int64_t n_ = 0;
};

TEST(Device, PrefetcherStaysAheadAndReportsTheConsumedState) {
  CountingStream s;
  mm::training::DevicePrefetcher p(s, at::kCPU, 2);
  EXPECT_EQ(p.state()["n"], 0);
  for (int64_t k = 0; k < 5; ++k) {
    auto item = p.next();
    EXPECT_EQ(item.host[mm::data::kInputIds][0][0].item<int64_t>(), k);
    EXPECT_TRUE(at::equal(item.device[mm::data::kInputIds], item.host[mm::data::kInputIds]));
    EXPECT_EQ(s.n_, k + 3) << "two batches beyond the one handed out are read";
    EXPECT_EQ(p.state()["n"], k + 1) << "the state is the consumed one, not the loader's";
    EXPECT_EQ(p.skipped_samples(), (k + 1) / 3);
  }
  // Resuming from the reported state hands out the next batch, whatever was prefetched.
  nlohmann::json saved = p.state();
  p.next();
  p.load_state(saved);
  EXPECT_EQ(p.next().host[mm::data::kInputIds][0][0].item<int64_t>(), 5);
  // ahead 0: read on demand.
  CountingStream t;
  mm::training::DevicePrefetcher q(t, at::kCPU, 0);
  q.next();
  EXPECT_EQ(t.n_, 1);
}

// ATen's fused AdamW (the CUDA default; `implementation: fused` on the CPU) against our
// for-loop update: 6 steps over two groups (decay with an lr multiplier, no decay), fp32 to 1e-6.
TEST(AdamW, FusedMatchesForLoop) {
  at::manual_seed(3);
  auto make_groups = [](std::vector<at::Tensor> ps) {
    mm::training::ParamGroup decay, plain;
    decay.names = {"w1", "w2"};
    decay.params = {ps[0], ps[1]};
    decay.lr_scale = 3.0;
    plain.names = {"b"};
    plain.params = {ps[2]};
    plain.weight_decay = false;
    return std::vector<mm::training::ParamGroup>{decay, plain};
  };
  std::vector<at::Tensor> init = {at::randn({7, 5}), at::randn({33}), at::randn({5})};
  std::vector<at::Tensor> a, b;
  for (auto& t : init) {
    a.push_back(t.clone().set_requires_grad(true));
    b.push_back(t.clone().set_requires_grad(true));
  }
  mm::training::AdamW loop(make_groups(a), 0.9, 0.95, 1e-8, 0.1, /*fused=*/false);
  mm::training::AdamW fused(make_groups(b), 0.9, 0.95, 1e-8, 0.1, /*fused=*/true);
  EXPECT_TRUE(fused.fused());
  for (int step = 0; step < 6; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      at::Tensor g = at::randn(a[i].sizes());
      if (step == 2 && i == 1) continue;  // a parameter without a gradient this step: skipped by both
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    loop.step(0.01);
    fused.step(0.01);
    for (auto* v : {&a, &b})
      for (auto& p : *v) p.mutable_grad() = at::Tensor();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = (a[i] - b[i]).abs().max().item<double>() / a[i].abs().max().item<double>();
    EXPECT_LT(err, 1e-6) << "parameter " << i;
  }
  auto sa = loop.state(), sb = fused.state();
  for (size_t i = 1; i < sa.size(); ++i)
    EXPECT_LT((sa[i].second - sb[i].second).abs().max().item<double>(), 1e-6 * (1 + sa[i].second.abs().max().item<double>()))
        << sa[i].first;
  EXPECT_TRUE(mm::training::use_fused_optimizer("auto", at::Device(at::kCUDA, 0)));
  EXPECT_FALSE(mm::training::use_fused_optimizer("auto", at::kCPU));
  EXPECT_TRUE(mm::training::use_fused_optimizer("fused", at::kCPU));
  EXPECT_FALSE(mm::training::use_fused_optimizer("for_loop", at::Device(at::kCUDA, 0)));
}

TEST(Attention, PackedCuSeqlensCoverEveryTokenPerRow) {
  at::Tensor seg = at::tensor({0, 0, 0, 1, 1, -1, 0, 1, 1, 1, 2, 2}, at::kLong).view({2, 6});
  auto [cu, longest] = mm::models::packed_cu_seqlens(seg);
  EXPECT_TRUE(at::equal(cu, at::tensor({0, 3, 5, 6, 7, 10, 12}, at::kInt))) << cu;
  EXPECT_EQ(longest, 3);
}

// varlen_attention without the flash kernel (here: the CPU) equals SDPA with the block-diagonal
// segment mask, causal and not, with GQA, forward and backward.
TEST(Attention, VarlenFallbackEqualsSegmentMask) {
  at::manual_seed(5);
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 9, D = 8;
  at::Tensor seg = at::tensor({0, 0, 0, 0, 1, 1, 2, 2, -1, 0, 0, 1, 1, 1, 1, 1, 1, 1}, at::kLong).view({B, S});
  auto [cu, longest] = mm::models::packed_cu_seqlens(seg);
  for (bool causal : {true, false}) {
    at::Tensor q = at::randn({B, Hq, S, D}, at::kDouble).set_requires_grad(true);
    at::Tensor k = at::randn({B, Hkv, S, D}, at::kDouble).set_requires_grad(true);
    at::Tensor v = at::randn({B, Hkv, S, D}, at::kDouble).set_requires_grad(true);
    at::Tensor o1 = mm::models::varlen_attention(q, k, v, cu, longest, causal);
    at::Tensor o2 = mm::models::scaled_dot_product_attention(q, k, v, mm::models::segment_attention_mask(seg), causal);
    EXPECT_LT((o1 - o2).abs().max().item<double>(), 1e-12) << "causal " << causal;
    auto g1 = torch::autograd::grad({(o1 * o1).sum()}, {q, k, v});
    auto g2 = torch::autograd::grad({(o2 * o2).sum()}, {q, k, v});
    for (int i = 0; i < 3; ++i) EXPECT_LT((g1[i] - g2[i]).abs().max().item<double>(), 1e-12);
  }
}

// A packed Qwen2 batch through cu_seqlens (what the trainer hands the model on CUDA) gives the
// logits of the mask path (what it hands it on the CPU).
TEST(Attention, Qwen2PackedRowsThroughCuSeqlensEqualTheMask) {
  auto model = mm::models::as_causal_lm(mm::models::model_registry().get("qwen2", "model.id")(tiny_qwen2(), "tiny", true), "test");
  model->init_weights(2);
  model->to(at::kDouble);
  at::Tensor ids = at::randint(0, 40, {2, 10}, at::kLong);
  at::Tensor seg = at::tensor({0, 0, 0, 1, 1, 1, 1, 2, 2, -1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, at::kLong).view({2, 10});
  at::Tensor pos = at::tensor({0, 1, 2, 0, 1, 2, 3, 0, 1, 0, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4}, at::kLong).view({2, 10});
  mm::models::MultimodalInputs masked;
  masked.input_ids = ids;
  masked.position_ids = pos;
  masked.attn_mask = mm::models::segment_attention_mask(seg);
  mm::models::MultimodalInputs varlen = masked;
  varlen.attn_mask = at::Tensor();
  std::tie(varlen.cu_seqlens, varlen.max_seqlen) = mm::models::packed_cu_seqlens(seg);
  at::Tensor a = model->forward_multimodal(masked), b = model->forward_multimodal(varlen);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-10);
}

}  // namespace
