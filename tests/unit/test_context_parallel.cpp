// Context parallelism (parallel/context_parallel.h, training/context_parallel.h) on real loopback
// ranks (this binary re-run under mm launch): Ulysses, ring (zigzag) and hybrid attention give one
// process's output rows and gradients for this rank's tokens, causal or not, with packed samples
// of unequal lengths and padding, with fewer key/value heads than Ulysses ranks; in float64.
#include <gtest/gtest.h>

#include "dist_worker.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/parallel/communicator.h"
#include "mindspeed_mm/parallel/context_parallel.h"
#include "mindspeed_mm/training/context_parallel.h"

using namespace mm::parallel;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

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
