// Tensor- and sequence-parallel regions (parallel/tensor_parallel.h) on real loopback ranks
// (this binary re-run under mm launch): a column-parallel and a row-parallel linear, and the
// sequence-parallel gather / reduce-scatter pair, give one process's outputs and gradients
// (input and weight) on 2 and 4 ranks, in float64; and Qwen2 under its tensor-parallel plan
// (training/tensor_parallel_plan.h) gives one process's logits, loss and gradients.
#include <gtest/gtest.h>

#include <algorithm>

#include "config_error.h"
#include "dist_worker.h"
#include "mindspeed_mm/parallel/communicator.h"
#include "mindspeed_mm/parallel/tensor_parallel.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/training/tensor_parallel_plan.h"

using namespace mm::parallel;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::shared_ptr<mm::models::CausalLM> tiny_qwen2(int64_t vocab = 40, int64_t heads = 4, int64_t kv_heads = 2,
                                                bool tied = false) {
  const nlohmann::json cfg = {{"vocab_size", vocab},    {"hidden_size", 8 * heads},   {"intermediate_size", 48},
                              {"num_hidden_layers", 2}, {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
                              {"rope_theta", 10000.0},  {"tie_word_embeddings", tied}};
  auto m = mm::models::as_causal_lm(mm::models::model_registry().get("qwen2")(cfg, "tp test", true), "tp test");
  m->init_weights(7);
  m->to(at::kDouble);
  return m;
}

at::Tensor seeded(at::IntArrayRef shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kDouble);
}

// Every parameter's gradient under the plan equals one process's (its slice where split, summed
// over the group where partial), to 1e-10; returns the names of the split ones.
std::vector<std::string> expect_tp_grads_equal(mm::nn::Module& ref, mm::nn::Module& par,
                                               const mm::training::TpLayout& layout, Communicator& tp) {
  auto pa = ref.named_parameters(), pb = par.named_parameters();
  EXPECT_EQ(pa.size(), pb.size());
  std::vector<std::string> split;
  for (size_t i = 0; i < pa.size() && i < pb.size(); ++i) {
    const std::string& name = pa[i].first;
    at::Tensor ga = pa[i].second.grad(), gb = pb[i].second.grad();
    if (!ga.defined() || !gb.defined()) {
      ADD_FAILURE() << name << " has no gradient";
      continue;
    }
    if (layout.partial_grads.count(name)) {
      gb = gb.clone();
      tp.all_reduce(gb);
    }
    at::Tensor want = ga;
    if (layout.split(name)) {
      want = layout.local(name, ga);
      split.push_back(name);
    }
    EXPECT_LT(max_diff(gb, want), 1e-10) << name;
  }
  return split;
}

}  // namespace

TEST(DistWorker, TensorParallelRegions) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto tp = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  const int n = tp->size(), r = tp->rank();
  // The same full tensors on every rank; out and in divide by 2 and 4.
  const at::Tensor x = seeded({3, 5, 8}, 1), w = seeded({12, 8}, 2), b = seeded({12}, 3), g = seeded({3, 5, 12}, 4);

  // One process.
  at::Tensor x1 = x.clone().requires_grad_(true), w1 = w.clone().requires_grad_(true), b1 = b.clone().requires_grad_(true);
  at::Tensor y1 = at::linear(x1, w1, b1);
  (y1 * g).sum().backward();

  // Column-parallel: this rank's rows of W and b, the outputs gathered along the last dim.
  {
    at::Tensor xc = x.clone().requires_grad_(true);
    at::Tensor wc = tp_slice(w, 0, r, n).clone().requires_grad_(true), bc = tp_slice(b, 0, r, n).clone().requires_grad_(true);
    at::Tensor y = gather_from_tp_region(at::linear(copy_to_tp_region(xc, tp), wc, bc), tp);
    EXPECT_LT(max_diff(y, y1), 1e-12);
    (y * g).sum().backward();
    EXPECT_LT(max_diff(xc.grad(), x1.grad()), 1e-12);  // summed over the ranks' partial input gradients
    EXPECT_LT(max_diff(wc.grad(), tp_slice(w1.grad(), 0, r, n)), 1e-12);
    EXPECT_LT(max_diff(bc.grad(), tp_slice(b1.grad(), 0, r, n)), 1e-12);
  }
  // Row-parallel: the input scattered along its last dim, this rank's columns of W, the partial
  // products summed; the bias added once, after the sum.
  {
    at::Tensor xr = x.clone().requires_grad_(true);
    at::Tensor wr = tp_slice(w, 1, r, n).clone().requires_grad_(true), br = b.clone().requires_grad_(true);
    at::Tensor y = reduce_from_tp_region(at::linear(scatter_to_tp_region(xr, tp), wr), tp) + br;
    EXPECT_LT(max_diff(y, y1), 1e-12);
    (y * g).sum().backward();
    EXPECT_LT(max_diff(xr.grad(), x1.grad()), 1e-12);
    EXPECT_LT(max_diff(wr.grad(), tp_slice(w1.grad(), 1, r, n)), 1e-12);
    EXPECT_LT(max_diff(br.grad(), b1.grad()), 1e-12);
  }
  // Sequence parallel around a column + row pair (an MLP): the input sharded along the sequence
  // (dim 1), gathered before the column linear, reduce-scattered after the row linear.
  {
    const at::Tensor w2 = seeded({8, 12}, 5);
    at::Tensor xs = x.clone().requires_grad_(true), w2s = w2.clone().requires_grad_(true);
    at::Tensor ref_x = x.clone().requires_grad_(true), ref_w2 = w2.clone().requires_grad_(true);
    at::Tensor ref = at::linear(at::tanh(at::linear(ref_x, w)), ref_w2);  // [3, 5, 8]
    // A sequence of 5 does not divide by 2 or 4: the sharded run pads it to 8, as callers will.
    const at::Tensor pad = at::zeros({3, 3, 8}, at::kDouble);
    at::Tensor local = tp_slice(at::cat({xs, pad}, 1), 1, r, n);
    at::Tensor h = at::tanh(at::linear(gather_from_sequence_region(local, tp, 1), tp_slice(w, 0, r, n)));
    at::Tensor out = reduce_scatter_to_sequence_region(at::linear(h, tp_slice(w2s, 1, r, n)), tp, 1);
    const at::Tensor go = seeded({3, 8, 8}, 6);
    EXPECT_LT(max_diff(out, tp_slice(at::cat({ref, at::zeros({3, 3, 8}, at::kDouble)}, 1), 1, r, n)), 1e-12);
    (out * tp_slice(go, 1, r, n)).sum().backward();
    (ref * go.narrow(1, 0, 5)).sum().backward();
    // Each rank's xs gradient is non-zero on the rows it owns, its w2s gradient on its columns:
    // summed over the ranks, both are the one-process gradients.
    at::Tensor gx = xs.grad().clone();
    tp->all_reduce(gx);
    EXPECT_LT(max_diff(gx, ref_x.grad()), 1e-12);
    at::Tensor gw2 = w2s.grad().clone();  // only this rank's columns are non-zero
    tp->all_reduce(gw2);
    EXPECT_LT(max_diff(gw2, ref_w2.grad()), 1e-12);
  }
  // A size that does not divide is a clear error.
  const std::string e = mm::test::config_error([&] { scatter_to_tp_region(at::zeros({2, 7}), tp); });
  EXPECT_NE(e.find("dimension 1 of size 7 does not divide by the tensor-parallel size"), std::string::npos) << e;
}

// Qwen2's plan table: q/k/v and gate/up column-parallel, o and down row-parallel, the
// vocabulary split in the embedding and the head, the logits left split for the vocabulary-
// parallel loss. On 4 ranks the 2 key/value heads are replicated (each rank runs the one its
// query heads use); with sequence parallelism the hidden states between the layers are split
// along the sequence. Logits (this rank's vocabulary slice) and loss equal one process's; every
// gradient equals one process's (split weights: this rank's slice of it) once the partial ones
// are summed over the group, as DataParallelModel::finish_gradients does.
TEST(DistWorker, TensorParallelQwen2) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto tp = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  const int n = tp->size(), r = tp->rank();
  for (bool tied : {false, true})
    for (bool sp : {false, true}) {
      SCOPED_TRACE(testing::Message() << "tied " << tied << " sequence parallel " << sp);
      auto ref = tiny_qwen2(40, 4, 2, tied), par = tiny_qwen2(40, 4, 2, tied);
      const auto table = par->plans();
      mm::training::TpOptions o;
      o.sequence_parallel = sp;
      o.sequence_parallel_blocks = table.sequence_parallel;
      const auto layout = mm::training::apply_tensor_parallel_plan(*par, table.tensor_parallel, tp, o);
      EXPECT_EQ(layout.modules, 2 * 8 + (tied ? 1 : 2));
      EXPECT_TRUE(layout.vocab_parallel_logits);
      at::manual_seed(3);
      const at::Tensor ids = at::randint(40, {2, 8}, at::kLong), labels = at::randint(40, {2, 8}, at::kLong);
      at::Tensor a = ref->forward(ids), b = par->forward(ids);
      ASSERT_EQ(b.size(-1), 40 / n);
      EXPECT_LT(max_diff(tp_slice(a, -1, r, n), b), 1e-12);
      auto ce = mm::models::lm_cross_entropy_sum(a, labels);
      auto [sum, count] = vocab_parallel_cross_entropy_sum(b, labels, tp);
      EXPECT_LT(std::abs(ce.sum.item<double>() - sum.item<double>()), 1e-10);
      ce.sum.backward();
      sum.backward();
      const int64_t split = static_cast<int64_t>(expect_tp_grads_equal(*ref, *par, layout, *tp).size());
      // Per layer: q weight and bias, o, gate, up, down, and k/v weights and biases when the heads
      // divide; the embedding (tied: also the head) and the head.
      const int64_t kv = n == 2 ? 4 : 0;
      EXPECT_EQ(split, 2 * (2 + 4 + kv) + (tied ? 1 : 2));
      if (n == 4) EXPECT_TRUE(layout.partial_grads.count("model.layers.0.self_attn.k_proj.weight"));
      if (sp) EXPECT_TRUE(layout.partial_grads.count("model.layers.1.post_attention_layernorm.weight"));
    }
}

// The tiny Qwen2-VL under its whole plan (vision blocks' fused qkv and MLPs, the merger, the
// language model, vocabulary-parallel embedding and head), with and without sequence parallelism:
// one process's loss and every gradient, in float64, on a batch of two rows with an image each.
TEST(DistWorker, TensorParallelQwen2VL) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto tp = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  const int n = tp->size(), r = tp->rank();
  const nlohmann::json cfg = nlohmann::json::parse(R"({
    "vocab_size": 264, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0, "tie_word_embeddings": false,
    "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
    "image_token_id": 261, "video_token_id": 262, "vision_start_token_id": 259, "vision_end_token_id": 260,
    "vision_config": {"depth": 2, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2, "patch_size": 14}
  })");
  auto make = [&] {
    auto m = mm::models::as_causal_lm(mm::models::model_registry().get("qwen2_vl")(cfg, "tp test", true), "tp test");
    m->init_weights(7);
    m->to(at::kDouble);
    return m;
  };
  // Each row: 3 text tokens, vision start, 4 image pads (a 1x4x4 grid merged 2x2), vision end, 6
  // text tokens (16: divides by the TP size for sequence parallelism).
  std::vector<int64_t> row = {'a', 'b', 'c', 259, 261, 261, 261, 261, 260, 'd', 'e', 'f', 'g', 'h', 'i', 'j'};
  mm::data::Batch batch;
  batch.set(mm::data::kInputIds, at::tensor(row, at::kLong).view({1, 16}).repeat({2, 1}));
  batch.set(mm::data::kImageGridThw, at::tensor(std::vector<int64_t>{1, 4, 4, 1, 4, 4}, at::kLong).view({2, 3}), true);
  batch.set(mm::data::kPixelValues, seeded({32, 3 * 2 * 14 * 14}, 11));
  at::manual_seed(5);
  const at::Tensor labels = at::randint(256, {2, 16}, at::kLong);
  for (bool sp : {false, true}) {
    SCOPED_TRACE(testing::Message() << "sequence parallel " << sp);
    auto ref = make(), par = make();
    const auto table = par->plans();
    mm::training::TpOptions o;
    o.sequence_parallel = sp;
    o.sequence_parallel_blocks = table.sequence_parallel;
    const auto layout = mm::training::apply_tensor_parallel_plan(*par, table.tensor_parallel, tp, o);
    EXPECT_TRUE(layout.vocab_parallel_logits);
    const at::Tensor a = ref->forward(batch)[mm::models::kLogits], b = par->forward(batch)[mm::models::kLogits];
    ASSERT_EQ(b.size(-1), 264 / n);
    EXPECT_LT(max_diff(tp_slice(a, -1, r, n), b), 1e-12);
    auto ce = mm::models::lm_cross_entropy_sum(a, labels);
    auto [sum, count] = vocab_parallel_cross_entropy_sum(b, labels, tp);
    EXPECT_LT(std::abs(ce.sum.item<double>() - sum.item<double>()), 1e-10);
    ce.sum.backward();
    sum.backward();
    const auto split_names = expect_tp_grads_equal(*ref, *par, layout, *tp);
    const int64_t split = static_cast<int64_t>(split_names.size());
    const int64_t vision_split = std::count_if(split_names.begin(), split_names.end(),
                                               [](const std::string& n) { return n.rfind("visual.", 0) == 0; });
    // Per vision block: qkv weight and bias, proj weight, fc1 weight and bias, fc2 weight; the
    // merger's two linears (weights, first bias).
    EXPECT_EQ(vision_split, 2 * 6 + 3);
    EXPECT_GT(split, vision_split);
  }
}

TEST(DistWorker, TensorParallelPlanErrors) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto tp = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  auto expect_error = [&](std::shared_ptr<mm::models::CausalLM> m, const std::string& want) {
    const std::string e = mm::test::config_error([&] { mm::training::apply_tensor_parallel_plan(*m, m->plans().tensor_parallel, tp); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
    for (auto& [name, t] : m->named_parameters())
      if (name == "model.layers.0.self_attn.q_proj.weight") EXPECT_EQ(t.size(0), t.size(1)) << "q_proj untouched";
  };
  expect_error(tiny_qwen2(42), "model.embed_tokens has 42 rows (the vocabulary), which do not divide by 4: set model.config.vocab_size");
  expect_error(tiny_qwen2(40, 6, 2), "model.layers.0.self_attn has 6 query heads, which do not divide by 4");
  expect_error(tiny_qwen2(40, 12, 3), "model.layers.0.self_attn has 3 key/value heads: they must divide by 4 or divide 4");
}

// Vocab-parallel cross-entropy: each rank holds a slice of the vocabulary's logits; the loss and
// count equal the full logits' and each rank's gradient is its slice of the full gradient.
TEST(DistWorker, TensorParallelVocabCrossEntropy) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto tp = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  const int n = tp->size(), r = tp->rank();
  const at::Tensor full = seeded({2, 7, 12}, 11) * 4;
  at::manual_seed(12);
  at::Tensor labels = at::randint(12, {2, 7}, at::kLong);
  labels[0][3] = -100;
  labels[1][6] = -100;
  at::Tensor ref = full.clone().requires_grad_(true);
  auto ce = mm::models::lm_cross_entropy_sum(ref, labels);
  ce.sum.backward();
  at::Tensor local = tp_slice(full, -1, r, n).clone().requires_grad_(true);
  auto [sum, count] = vocab_parallel_cross_entropy_sum(local, labels, tp);
  EXPECT_NEAR(sum.item<double>(), ce.sum.item<double>(), 1e-10);
  EXPECT_EQ(count.item<int64_t>(), 12);
  EXPECT_EQ(count.item<int64_t>(), ce.count.item<int64_t>());
  sum.backward();
  EXPECT_LT(max_diff(local.grad(), tp_slice(ref.grad(), -1, r, n)), 1e-12);
}

TEST(TensorParallel, PlanStylesAndPatternsAreChecked) {
  auto m = tiny_qwen2();
  EXPECT_NE(mm::test::config_error([&] { mm::training::apply_tensor_parallel_plan(*m, {{"model.norm", "colwise"}}, nullptr); })
                .find("model.norm is a RMSNorm, not a Linear (colwise)"),
            std::string::npos);
  EXPECT_NE(mm::test::config_error([&] { mm::training::apply_tensor_parallel_plan(*m, {{"lm_head", "diagonal"}}, nullptr); })
                .find("unknown style 'diagonal'"),
            std::string::npos);
  EXPECT_NE(mm::test::config_error([&] { mm::training::apply_tensor_parallel_plan(*m, {{"model.decoder", "rowwise"}}, nullptr); })
                .find("pattern 'model.decoder' matches no module"),
            std::string::npos);
}

TEST(TensorParallel, Qwen2PlanEqualsOneProcessOnTwoAndFourRanks) {
  for (int n : {2, 4}) mm::test::expect_all_ranks_passed(mm::test::launch_worker(n, "TensorParallelQwen2"), n);
  auto e = mm::test::launch_worker(4, "TensorParallelPlanErrors");
  mm::test::expect_all_ranks_passed(e, 4);
}

TEST(TensorParallel, Qwen2VLPlanEqualsOneProcessOnTwoRanks) {
  mm::test::expect_all_ranks_passed(mm::test::launch_worker(2, "TensorParallelQwen2VL"), 2);
}

TEST(TensorParallel, VocabParallelCrossEntropyOnTwoAndFourRanks) {
  for (int n : {2, 4}) mm::test::expect_all_ranks_passed(mm::test::launch_worker(n, "TensorParallelVocabCrossEntropy"), n);
}

TEST(TensorParallel, RegionsEqualOneProcessOnTwoAndFourRanks) {
  for (int n : {2, 4}) {
    auto r = mm::test::launch_worker(n, "TensorParallelRegions");
    mm::test::expect_all_ranks_passed(r, n);
  }
}
