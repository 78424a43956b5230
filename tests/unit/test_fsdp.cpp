// FSDP mechanics on real loopback ranks (this binary re-run under mm launch): chunk gradients
// equal the matching slice of one process's gradients (padding included: sizes that do not
// divide by the ranks), parameter storage really is freed after forward and backward, the
// number of all-gathers and reduce-scatters per step, no re-gather when units stay gathered,
// gradient clipping over all shards, and ranks that run different blocks get a clear error.
#include <gtest/gtest.h>

#include <cmath>

#include "dist_worker.h"
#include "mindspeed_mm/parallel/communicator.h"
#include "mindspeed_mm/parallel/fsdp.h"
#include "mindspeed_mm/training/recompute.h"

using namespace mm::parallel;

namespace {

// y = tanh(W x + b): 5 x 5 weights, 25 elements, which 2 and 3 ranks split with padding.
struct TanhBlock : mm::nn::Block {
  at::Tensor w, b;
  explicit TanhBlock(int seed) {
    at::manual_seed(seed);
    w = register_parameter("weight", at::randn({5, 5}) * 0.5);
    b = register_parameter("bias", at::randn({5}) * 0.1);
  }
  at::Tensor forward(const at::Tensor& x, const mm::nn::ForwardContext&) override { return at::tanh(at::linear(x, w, b)); }
};

struct TwoBlocks : mm::nn::Module {
  std::shared_ptr<TanhBlock> b0, b1;
  at::Tensor head;
  TwoBlocks() {
    b0 = register_module("b0", std::make_shared<TanhBlock>(1));
    b1 = register_module("b1", std::make_shared<TanhBlock>(2));
    at::manual_seed(3);
    head = register_parameter("head", at::randn({5}));
  }
  at::Tensor loss(const at::Tensor& x, bool skip_first = false) {
    mm::nn::ForwardContext ctx;
    at::Tensor h = skip_first ? x : b0->call(x, ctx);
    return (b1->call(h, ctx) * head).sum();
  }
};

}  // namespace

TEST(Fsdp, ShardedGradientsFreedMemoryAndCollectiveCounts) {
  for (int n : {2, 3}) mm::test::expect_all_ranks_passed(mm::test::launch_worker(n, "Fsdp"), n);
  mm::test::expect_all_ranks_passed(mm::test::launch_worker(2, "Fsdp", "recompute"), 2);
}

TEST(Fsdp, RanksRunningDifferentBlocksGetAClearError) {
  auto r = mm::test::launch_worker(2, "FsdpMismatch");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("gathered unit 'b1' while rank 0 gathered 'b0': every rank must run the same blocks"),
            std::string::npos)
      << r.output;
}

// ---- run as the ranks ----

TEST(DistWorker, Fsdp) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto comm = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  const int n = comm->size(), r = comm->rank();
  const bool recompute = mm::test::dist_mode() == "recompute";
  at::manual_seed(9);
  const at::Tensor x = at::randn({4 * n, 5});  // the global batch

  // Reference: one process, the whole batch.
  TwoBlocks ref;
  ref.loss(x).backward();

  TwoBlocks model;
  FullyShardedDataParallel fsdp(model, {{"b0", model.b0.get()}, {"b1", model.b1.get()}}, comm, nullptr);
  // Recompute after FSDP, so that FSDP's wrapper is the outermost (as the trainer orders them).
  if (recompute) mm::training::apply_recompute_plan(model, {"b0", "b1"});
  EXPECT_EQ(fsdp.num_units(), 3);
  EXPECT_EQ(fsdp.gathered_bytes(), 0);
  EXPECT_EQ(fsdp.shard_bytes(), 4 * (2 * ((25 + n - 1) / n + (5 + n - 1) / n) + (5 + n - 1) / n));

  fsdp.begin_forward();
  EXPECT_EQ(fsdp.gathered_bytes(), 5 * 4);  // the root's head only
  at::Tensor loss = model.loss(x.narrow(0, 4 * r, 4));
  EXPECT_EQ(fsdp.gathered_bytes(), 5 * 4);  // each block freed after its forward
  fsdp.prepare_backward(loss).backward();
  EXPECT_EQ(fsdp.gathered_bytes(), 0);
  EXPECT_EQ(fsdp.all_gathers(), 1 + 2 + 2);  // root; each block in forward and again in backward
  EXPECT_EQ(fsdp.reduce_scatters(), 3);

  // Each chunk's gradient is this rank's slice of the flattened full gradient.
  auto check = [&](const char* what) {
    for (auto& [name, full] : ref.named_parameters()) {
      auto [begin, end] = fsdp.shard_range(name);
      at::Tensor g = fsdp.shard(name).grad();
      ASSERT_TRUE(g.defined()) << name;
      at::Tensor want = full.grad().reshape({-1}).narrow(0, begin, end - begin);
      EXPECT_LT((g.narrow(0, 0, end - begin) - want).abs().max().item<double>(), 1e-6) << what << " " << name;
      if (end - begin < g.numel()) EXPECT_EQ(g.narrow(0, end - begin, g.numel() - (end - begin)).abs().sum().item<double>(), 0);
    }
  };
  check("one step");

  // Clipping sees the norm of the whole gradient.
  double ref_sq = 0;
  for (auto& p : ref.parameters()) ref_sq += p.grad().pow(2).sum().item<double>();
  const double norm = fsdp.clip_grad_norm(0.5);
  EXPECT_NEAR(norm, std::sqrt(ref_sq), 1e-5);
  double sq = 0;
  for (auto& [name, s] : fsdp.named_shards()) sq += s.grad().pow(2).sum().item<double>();
  at::Tensor t = at::tensor({sq}, at::kDouble);
  comm->all_reduce(t);
  EXPECT_NEAR(std::sqrt(t.item<double>()), 0.5, 1e-5);

  // gather_all keeps every unit: forwards then need no collective.
  const int64_t before = fsdp.all_gathers();
  fsdp.gather_all();
  {
    at::NoGradGuard no_grad;
    model.loss(x);
    model.loss(x);
  }
  EXPECT_EQ(fsdp.all_gathers(), before + 3);
  fsdp.reshard();
  EXPECT_EQ(fsdp.gathered_bytes(), 0);
}

TEST(DistWorker, FsdpMismatch) {
  if (!mm::test::dist_worker()) GTEST_SKIP() << "runs under mm launch only";
  auto comm = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  TwoBlocks model;
  FullyShardedDataParallel fsdp(model, {{"b0", model.b0.get()}, {"b1", model.b1.get()}}, comm, nullptr);
  fsdp.begin_forward();
  // Rank 1 skips the first block (as a rank whose batch has no image skips the vision tower).
  model.loss(at::ones({2, 5}), comm->rank() == 1);
}
