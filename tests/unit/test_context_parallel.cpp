// Context parallelism (parallel/context_parallel.h, training/context_parallel.h) on real loopback
// ranks (this binary re-run under mm launch): Ulysses, ring (zigzag) and hybrid attention give one
// process's output rows and gradients for this rank's tokens, causal or not, with packed samples
// of unequal lengths and padding, with fewer key/value heads than Ulysses ranks; in float64. And
// the Qwen2-VL and Qwen2.5-VL vision towers with their patches cut (per-frame and per-window
// segments changing from block to block): outputs and gradients equal one process's.
#include <gtest/gtest.h>

#include "dist_worker.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/qwen2vl/vision.h"
#include "mindspeed_mm/parallel/communicator.h"
#include "mindspeed_mm/parallel/context_parallel.h"
#include "mindspeed_mm/training/context_parallel.h"

using namespace mm::parallel;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }
// Relative to the largest magnitude of b (at least 1).
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return max_diff(a, b) / std::max(1.0, b.abs().max().item<double>());
}

CpLayout layout_for(const std::string& mode, int n) {
  CpLayout l;
  if (mode == "ulysses") l.ulysses = n;
  else if (mode == "ring") l.ring = n;
  else l = {2, n / 2};
  return l;
}

}  // namespace

TEST(ContextParallel, LayoutShardsZigzagAndContiguously) {
  CpLayout ring{1, 2};
  EXPECT_EQ(ring.multiple(), 4);
  EXPECT_EQ(ring.token_indices(8, 0), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(ring.token_indices(8, 1), (std::vector<int64_t>{2, 3, 4, 5}));
  CpLayout ulysses{4, 1};
  EXPECT_EQ(ulysses.multiple(), 4);
  EXPECT_EQ(ulysses.token_indices(8, 2), (std::vector<int64_t>{4, 5}));
  CpLayout hybrid{2, 2};  // ring rank 1 holds chunks 1 and 2 of 4 (tokens 4..11 of 16), split in two
  EXPECT_EQ(hybrid.multiple(), 8);
  EXPECT_EQ(hybrid.token_indices(16, 2), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(hybrid.token_indices(16, 3), (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_EQ(hybrid.token_indices(16, 1), (std::vector<int64_t>{12, 13, 14, 15}));
}

TEST(DistWorker, ContextParallelAttention) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto world = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(60));
  const int n = world->size(), r = world->rank();
  const CpLayout layout = layout_for(mm::test::dist_mode(), n);
  auto cp = std::make_shared<mm::training::ContextParallel>(layout, world);

  const int64_t B = 2, S = 37, D = 8;  // 37 tokens: padded to the layout's multiple
  for (int64_t kv_heads : {2, 1})
    for (bool packed : {true, false})
      for (bool causal : {true, false}) {
        SCOPED_TRACE(testing::Message() << "kv heads " << kv_heads << (packed ? " packed" : " one sample")
                                        << (causal ? " causal" : ""));
        // Row 0: samples of 9, 14 and 6 tokens, then padding; row 1: 20 and 17.
        at::Tensor seg = at::zeros({B, S}, at::kLong);
        if (packed) {
          auto a = seg.accessor<int64_t, 2>();
          for (int64_t s = 0; s < S; ++s) {
            a[0][s] = s < 9 ? 0 : s < 23 ? 1 : s < 29 ? 2 : -1;
            a[1][s] = s < 20 ? 0 : 1;
          }
        }
        mm::data::Batch host;
        host.set(mm::data::kInputIds, at::zeros({B, S}, at::kLong));
        if (packed) host.set(mm::data::kSegmentIds, seg);
        const mm::data::Batch shard = cp->shard(host);
        const at::Tensor whole_seg = shard[mm::training::kCpSegmentIds];
        const int64_t P = whole_seg.size(1);
        ASSERT_EQ(P % layout.multiple(), 0);
        const at::Tensor idx = at::tensor(layout.token_indices(P, cp->rank()), at::kLong);
        EXPECT_TRUE(shard[mm::data::kPositionIds].select(0, 0).equal(idx));  // true positions, padding too
        cp->begin(shard);

        at::manual_seed(11);
        const at::Tensor q = at::randn({B, 4, P, D}, at::kDouble), k = at::randn({B, kv_heads, P, D}, at::kDouble);
        const at::Tensor v = at::randn({B, kv_heads, P, D}, at::kDouble), w = at::randn({B, 4, P, D}, at::kDouble);
        // One process: the whole padded sequence, samples kept apart by a mask.
        at::Tensor q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true), v1 = v.clone().requires_grad_(true);
        at::Tensor o1 = mm::models::scaled_dot_product_attention_math(
            q1, k1, v1, mm::models::segment_attention_mask(whole_seg), causal);
        (o1 * w).sum().backward();

        auto mine = [&](const at::Tensor& t) { return t.index_select(2, idx).contiguous(); };
        at::Tensor qc = mine(q).requires_grad_(true), kc = mine(k).requires_grad_(true), vc = mine(v).requires_grad_(true);
        at::Tensor oc = cp->attend(qc, kc, vc, causal, c10::nullopt);
        EXPECT_LT(max_diff(oc, mine(o1)), 1e-12);
        (oc * mine(w)).sum().backward();
        EXPECT_LT(max_diff(qc.grad(), mine(q1.grad())), 1e-12);
        EXPECT_LT(max_diff(kc.grad(), mine(k1.grad())), 1e-12);
        EXPECT_LT(max_diff(vc.grad(), mine(v1.grad())), 1e-12);
      }
  (void)r;
}

TEST(ContextParallel, AttentionEqualsOneProcess) {
  for (auto [mode, n] : std::vector<std::pair<std::string, int>>{{"ulysses", 2}, {"ulysses", 4}, {"ring", 2}, {"ring", 3},
                                                                 {"hybrid", 4}})
    mm::test::expect_all_ranks_passed(mm::test::launch_worker(n, "ContextParallelAttention", mode), n);
}

TEST(DistWorker, ContextParallelVisionTower) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto world = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(60));
  const int n = world->size();
  const CpLayout layout = layout_for(mm::test::dist_mode(), n);
  const auto groups = std::make_shared<mm::training::ContextParallel>(layout, world);  // made once
  for (bool qwen2_5 : {false, true}) {
    SCOPED_TRACE(qwen2_5 ? "qwen2.5-vl" : "qwen2-vl");
    mm::models::Qwen2VLVisionConfig c;
    c.qwen2_5 = qwen2_5;
    c.depth = 3;
    c.embed_dim = 32;
    c.num_heads = 4;
    c.mlp_ratio = 2;
    c.intermediate_size = 48;
    c.hidden_size = 16;
    c.hidden_act = qwen2_5 ? "silu" : "quick_gelu";
    c.window_size = 56;  // 2 x 2 merged units: windows of 16 patches, smaller at the edges
    c.fullatt_block_indexes = {1};
    mm::models::Qwen2VisionTransformer tower(c, at::kDouble);
    at::manual_seed(5);
    {
      at::NoGradGuard no_grad;
      for (auto& [name, p] : tower.named_parameters()) p.normal_(0, 0.2);
    }
    // An image of 4 x 6 patches and a two-frame video of 4 x 4: 56 patches, padded to the layout.
    const at::Tensor grid = at::tensor(std::vector<int64_t>{1, 4, 6, 2, 4, 4}, at::kLong).view({2, 3});
    const at::Tensor pixels = at::randn({56, c.patch_dim()}, at::kDouble), w = at::randn({14, 16}, at::kDouble);
    auto run = [&](at::Tensor& grad_pixels, const at::Tensor& input = {}) {
      at::Tensor x = (input.defined() ? input : pixels).clone().requires_grad_(true);
      tower.zero_grad();
      at::Tensor out = tower.forward(x, grid, /*cut=*/input.defined());
      (out * w).sum().backward();
      grad_pixels = x.grad();
      return out.detach();
    };
    at::Tensor ref_grad_pixels;
    const at::Tensor ref = run(ref_grad_pixels);
    std::vector<at::Tensor> ref_grads;
    for (auto& [name, p] : tower.named_parameters()) ref_grads.push_back(p.grad().clone());

    auto cp = std::make_shared<mm::training::ContextParallel>(*groups, 1);
    mm::models::PlanTable::CpStretch stretch;
    stretch.attention = {"blocks.{*}.attn"};
    stretch.blocks = {"blocks.{*}"};
    stretch.inputs = {{"pixel_values", "image_grid_thw"}};
    stretch.order = [c](const at::Tensor& g) { return mm::models::qwen2vl_patch_block_order(c, g); };
    EXPECT_EQ(cp->apply_encoder(tower, stretch), 3);
    at::Tensor grad_pixels;
    const at::Tensor out = run(grad_pixels);
    EXPECT_LT(rel_diff(out, ref), 1e-12);
    // Every rank's loss is over the whole output: the ranks' gradients sum to n times one process's.
    // (Gradients to 1e-7: the tower rotates q and k in fp32 as HF does, so a float64 difference
    // of 1e-16 in q's gradient can round to another float.)
    auto mean = [&](at::Tensor g) {
      g = g.contiguous();
      world->all_reduce(g);
      return g / n;
    };
    EXPECT_LT(rel_diff(mean(grad_pixels), ref_grad_pixels), 1e-7);
    size_t i = 0;
    for (auto& [name, p] : tower.named_parameters()) EXPECT_LT(rel_diff(mean(p.grad()), ref_grads[i++]), 1e-7) << name;
    // Again (a new cut each call; the tables and segments are this call's).
    const at::Tensor again = run(grad_pixels);
    EXPECT_LT(rel_diff(again, ref), 1e-12);
    // The loader's cut: this rank's pixel rows only, in block order, padded with zero rows.
    mm::data::Batch host;
    host.set(mm::data::kPixelValues, pixels);
    host.set(mm::data::kImageGridThw, grid, /*host=*/true);
    const mm::data::Batch mine = cp->shard_inputs(host);
    EXPECT_TRUE(mine.has(mm::data::kPixelRowsCut));
    const int64_t m = layout.multiple(), padded = (56 + m - 1) / m * m;
    ASSERT_EQ(mine[mm::data::kPixelValues].size(0), padded / n);
    const at::Tensor from_rows = run(grad_pixels, mine[mm::data::kPixelValues]);
    EXPECT_LT(rel_diff(from_rows, ref), 1e-12);
    i = 0;
    for (auto& [name, p] : tower.named_parameters()) EXPECT_LT(rel_diff(mean(p.grad()), ref_grads[i++]), 1e-7) << name;
  }
}

TEST(ContextParallel, VisionTowerEqualsOneProcess) {
  for (auto [mode, n] : std::vector<std::pair<std::string, int>>{{"ulysses", 2}, {"ulysses", 4}, {"ring", 3}, {"hybrid", 4}})
    mm::test::expect_all_ranks_passed(mm::test::launch_worker(n, "ContextParallelVisionTower", mode), n);
}
