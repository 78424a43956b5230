// Tensor- and sequence-parallel regions (parallel/tensor_parallel.h) on real loopback ranks
// (this binary re-run under mm launch): a column-parallel and a row-parallel linear, and the
// sequence-parallel gather / reduce-scatter pair, give one process's outputs and gradients
// (input and weight) on 2 and 4 ranks, in float64.
#include <gtest/gtest.h>

#include "config_error.h"
#include "dist_worker.h"
#include "mindspeed_mm/parallel/communicator.h"
#include "mindspeed_mm/parallel/tensor_parallel.h"

using namespace mm::parallel;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

at::Tensor seeded(at::IntArrayRef shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kDouble);
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

TEST(TensorParallel, RegionsEqualOneProcessOnTwoAndFourRanks) {
  for (int n : {2, 4}) {
    auto r = mm::test::launch_worker(n, "TensorParallelRegions");
    mm::test::expect_all_ranks_passed(r, n);
  }
}
