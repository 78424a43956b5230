// The distributed runtime's base: DistEnv from torchrun / Slurm variables; `mm launch` (rank
// prefixes, exit codes, a failing rank stops the others); collectives on real Gloo process groups
// over loopback with 2 and 3 ranks (this binary re-run as the ranks under mm launch, the
// DistWorker tests), including uneven all-gather / all-to-all, the emulated reduce-scatter and
// bf16; a rank that never arrives or dies gives every rank a clear error within the timeout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <thread>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/parallel/communicator.h"
#include "mindspeed_mm/parallel/ddp.h"
#include "mindspeed_mm/parallel/device_mesh.h"
#include "mindspeed_mm/parallel/dist_env.h"
#include "dist_worker.h"

using namespace mm::parallel;

namespace {

DistEnv env_of(const std::map<std::string, std::string>& vars) {
  return DistEnv::from_lookup([&](const char* k) {
    auto it = vars.find(k);
    return it == vars.end() ? std::string() : it->second;
  });
}

using mm::test::expect_all_ranks_passed;
using mm::test::launch_worker;
bool worker() { return mm::test::dist_worker(); }
std::string mode() { return mm::test::dist_mode(); }

}  // namespace

TEST(DistEnv, TorchrunSlurmAndSingle) {
  DistEnv single = env_of({});
  EXPECT_EQ(single.world_size, 1);
  EXPECT_FALSE(single.distributed());
  DistEnv t = env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                      {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(t.source, "torchrun");
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.master_addr, "10.0.0.1");
  EXPECT_EQ(t.master_port, 1234);
  DistEnv s = env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                      {"SLURM_NTASKS_PER_NODE", "4(x2)"}, {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  EXPECT_EQ(s.source, "slurm");
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.world_size, 8);
  EXPECT_EQ(s.local_world_size, 4);
  EXPECT_EQ(s.master_addr, "gpu07");
  EXPECT_EQ(first_slurm_host("a1,b2"), "a1");
  EXPECT_EQ(first_slurm_host("node[3,5-6]"), "node3");
  try {
    env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
    FAIL() << "rank 2 of 2 accepted";
  } catch (const mm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK 2 is outside [0, WORLD_SIZE 2)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}), mm::ConfigError);
}

TEST(Launch, PrefixesRanksAndStopsTheOthersWhenOneFails) {
  auto ok = mm::test::run_command(mm::test::mm_binary() + " launch --nproc-per-node 3 -- sh -c 'echo rank $RANK of $WORLD_SIZE local $LOCAL_RANK'");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(ok.output.find("[rank " + std::to_string(r) + "] rank " + std::to_string(r) + " of 3 local " + std::to_string(r)),
              std::string::npos) << ok.output;
  const auto t0 = std::chrono::steady_clock::now();
  auto bad = mm::test::run_command(mm::test::mm_binary() +
                                   " launch --grace 2 --nproc-per-node 2 -- sh -c 'if [ $RANK = 1 ]; then exit 3; fi; sleep 60'");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(bad.exit_code, 3) << bad.output;
  EXPECT_LT(s, 20.0) << "the surviving rank was not stopped";
  EXPECT_NE(bad.output.find("rank 1 exited with code 3"), std::string::npos) << bad.output;
}

TEST(Distributed, CollectivesOnTwoAndThreeRanks) {
  for (int n : {2, 3}) expect_all_ranks_passed(launch_worker(n, "Collectives"), n);
}

TEST(Distributed, MissingOrDeadRankIsAClearErrorWithinTheTimeout) {
  // A rank that never enters the collective: the other names it after the 4 s timeout.
  auto t0 = std::chrono::steady_clock::now();
  auto absent = launch_worker(2, "Faults", "absent");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_NE(absent.output.find("[rank 0] fault: distributed: all_reduce (collective #1) failed on rank 0 of 2"),
            std::string::npos) << absent.output;
  EXPECT_NE(absent.output.find("ranks that did not arrive: 1"), std::string::npos) << absent.output;
  EXPECT_EQ(absent.exit_code, 0) << absent.output;  // rank 0 caught the error; rank 1 left on its own

  // kill -9 of a rank under mm launch: the launcher stops the others and exits with 128 + 9.
  t0 = std::chrono::steady_clock::now();
  auto killed = launch_worker(2, "Faults", "kill");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << killed.output;
  EXPECT_NE(killed.output.find("rank 1 exited with code 137; stopping the other ranks"), std::string::npos) << killed.output;

  // Without a launcher to stop it, the surviving rank reports the dead peer itself within the timeout.
  const std::string port = std::to_string(mm::test::free_port());
  auto rank = [&](int r) {
    return "env MM_DIST_WORKER=1 MM_DIST_MODE=kill RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
           port + " " + mm::test::self_binary() + " --gtest_filter=DistWorker.Faults";
  };
  t0 = std::chrono::steady_clock::now();
  auto alone = mm::test::run_command("( " + rank(1) + " > /dev/null 2>&1 & " + rank(0) + "; wait )");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_NE(alone.output.find("fault: distributed: all_reduce (collective #1) failed on rank 0 of 2"), std::string::npos)
      << alone.output;
}

TEST(DeviceMesh, LayoutGroupsAndErrors) {
  DeviceMesh m({2, 2, 1, 2}, 8);  // replicate 2 x shard 2 x tp 2
  EXPECT_EQ(m.coords(5), (std::array<int, 5>{1, 0, 0, 1, 0}));
  EXPECT_EQ(m.rank_of({1, 0, 0, 1, 0}), 5);
  EXPECT_EQ(m.group(MeshDim::kTp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group(MeshDim::kDpShard, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group(MeshDim::kDpReplicate, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group(MeshDim::kDp, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.group(MeshDim::kCp, 5), (std::vector<int>{5}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.rank_of(m.coords(r)), r);
  try {
    DeviceMesh bad({2, 2, 1, 1}, 2);
    FAIL() << "a 4-rank mesh on 2 ranks";
  } catch (const mm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("= 4 do not equal the world size 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DeviceMesh({0, 1, 1, 1}, 0), mm::ConfigError);
}

TEST(Distributed, HsdpMeshGroupsOnFourRanks) {
  expect_all_ranks_passed(launch_worker(4, "Mesh"), 4);
}

TEST(Distributed, DdpGradientsEqualOneProcessOnTheWholeBatch) {
  for (int n : {2, 3}) expect_all_ranks_passed(launch_worker(n, "Ddp"), n);
}

// ---- run as the ranks (MM_DIST_WORKER set by the tests above) ----

TEST(DistWorker, Ddp) {
  if (!worker()) GTEST_SKIP() << "runs under mm launch only";
  auto dp = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  const int n = dp->size(), r = dp->rank();
  at::manual_seed(11 + r);  // different on every rank: broadcast_parameters must make them equal
  std::vector<at::Tensor> params = {at::randn({6, 4}).requires_grad_(), at::randn({6}).requires_grad_(),
                                    at::randn({3, 6}).requires_grad_()};
  DistributedDataParallel ddp(params, dp, /*bucket_cap_bytes=*/64);
  EXPECT_GE(ddp.num_buckets(), 3);
  ddp.broadcast_parameters();
  at::manual_seed(7);
  const int64_t B = 4 * n;
  at::Tensor x = at::randn({B, 4});  // the global batch, the same everywhere
  auto loss = [](const std::vector<at::Tensor>& p, const at::Tensor& xs, double count) {
    return (at::linear(at::tanh(at::linear(xs, p[0], p[1])), p[2]).pow(2).sum() / count);
  };
  // The reference: one process, the whole batch, on copies of the (now common) weights.
  std::vector<at::Tensor> ref;
  for (auto& p : params) ref.push_back(p.detach().clone().requires_grad_());
  loss(ref, x, static_cast<double>(B)).backward();

  auto check = [&](const char* what) {
    for (size_t k = 0; k < params.size(); ++k)
      EXPECT_LT((params[k].grad() - ref[k].grad()).abs().max().item<double>(), 1e-6) << what << " parameter " << k;
  };
  // Each rank its share of the rows; the loss divided by the global count.
  ddp.prepare_backward(loss(params, x.narrow(0, 4 * r, 4), static_cast<double>(B))).backward();
  EXPECT_EQ(ddp.reductions(), ddp.num_buckets());
  check("one step");
  // Gradient accumulation: two micro-steps, the first without communication.
  for (auto& p : params) p.mutable_grad().zero_();
  ddp.set_requires_sync(false);
  ddp.prepare_backward(loss(params, x.narrow(0, 4 * r, 2), static_cast<double>(B))).backward();
  EXPECT_EQ(ddp.reductions(), ddp.num_buckets());  // nothing sent
  ddp.set_requires_sync(true);
  ddp.prepare_backward(loss(params, x.narrow(0, 4 * r + 2, 2), static_cast<double>(B))).backward();
  EXPECT_EQ(ddp.reductions(), 2 * ddp.num_buckets());
  check("two micro-steps");

  // A parameter that gets no gradient on rank 1 (its rows take a path without p[0] and p[1], as a
  // text-only batch leaves the vision tower idle): the buckets still pair up across ranks, the
  // idle rank contributes zeros, and the sum equals one process's.
  auto mixed = [](const std::vector<at::Tensor>& p, const at::Tensor& xs, bool use_first, double count) {
    at::Tensor h = use_first ? at::tanh(at::linear(xs, p[0], p[1])) : xs.narrow(1, 0, 4).repeat({1, 2}).narrow(1, 0, 6);
    return at::linear(h, p[2]).pow(2).sum() / count;
  };
  for (auto& p : ref) p.mutable_grad().zero_();
  for (int k = 0; k < n; ++k) mixed(ref, x.narrow(0, 4 * k, 4), k != 1, static_cast<double>(B)).backward();
  for (auto& p : params) p.mutable_grad().zero_();
  ddp.prepare_backward(mixed(params, x.narrow(0, 4 * r, 4), r != 1, static_cast<double>(B))).backward();
  EXPECT_EQ(ddp.reductions(), 3 * ddp.num_buckets());
  check("a parameter unused on rank 1");
}


TEST(DistWorker, Mesh) {
  if (!worker()) GTEST_SKIP() << "runs under mm launch only";
  ParallelState ps(Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30)), {2, 2, 1, 1});
  const int r = ps.world().rank();
  auto sum_over = [&](MeshDim d) {
    at::Tensor t = at::full({1}, static_cast<double>(r));
    ps.group(d).all_reduce(t);
    return t[0].item<double>();
  };
  double expect_shard = 0, expect_rep = 0;
  for (int k : ps.mesh().group(MeshDim::kDpShard, r)) expect_shard += k;
  for (int k : ps.mesh().group(MeshDim::kDpReplicate, r)) expect_rep += k;
  EXPECT_EQ(sum_over(MeshDim::kDpShard), expect_shard);      // {0,1} or {2,3}
  EXPECT_EQ(sum_over(MeshDim::kDpReplicate), expect_rep);    // {0,2} or {1,3}
  EXPECT_EQ(sum_over(MeshDim::kDp), 6.0);
  EXPECT_EQ(sum_over(MeshDim::kTp), r);                      // one rank: nothing to add
  EXPECT_EQ(ps.group(MeshDim::kDpShard).members(), ps.mesh().group(MeshDim::kDpShard, r));
  at::Tensor g = ps.group(MeshDim::kDpReplicate).all_gather(at::full({2}, static_cast<double>(r)));
  EXPECT_EQ(g[1][0].item<double>(), ps.mesh().group(MeshDim::kDpReplicate, r)[1]);
}


TEST(DistWorker, Collectives) {
  if (!worker()) GTEST_SKIP() << "runs under mm launch only";
  auto c = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(30));
  const int n = c->size(), r = c->rank();
  at::Tensor t = at::full({5}, r + 1.0);
  c->all_reduce(t);
  EXPECT_TRUE(at::equal(t, at::full({5}, n * (n + 1) / 2.0)));
  at::Tensor m = at::full({2}, static_cast<double>(r));
  c->all_reduce(m, ReduceOp::kMax);
  EXPECT_EQ(m[0].item<double>(), n - 1);
  at::Tensor avg = at::full({3}, 2.0 * r);
  c->all_reduce(avg, ReduceOp::kAvg);
  EXPECT_NEAR(avg[0].item<double>(), n - 1.0, 1e-6);
  at::Tensor b = at::full({4}, 0.5 * (r + 1)).to(at::kBFloat16);  // Gloo moves it as fp32
  c->all_reduce(b);
  EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  EXPECT_EQ(b[0].item<float>(), 0.5f * n * (n + 1) / 2);

  at::Tensor g = c->all_gather(at::arange(3, at::kFloat) + 10 * r);
  ASSERT_EQ(g.sizes(), (at::IntArrayRef{n, 3}));
  for (int k = 0; k < n; ++k) EXPECT_TRUE(at::equal(g[k], at::arange(3, at::kFloat) + 10 * k));
  std::vector<int64_t> counts;
  for (int k = 0; k < n; ++k) counts.push_back(k + 1);
  at::Tensor ug = c->all_gather_uneven(at::full({r + 1, 2}, static_cast<double>(r)), counts);
  ASSERT_EQ(ug.size(0), n * (n + 1) / 2);
  for (int k = 0, row = 0; k < n; ++k)
    for (int i = 0; i <= k; ++i, ++row) EXPECT_EQ(ug[row][1].item<double>(), k);

  // reduce_scatter: block r of the sum over ranks of (arange(2n) + 100 s).
  at::Tensor rs = c->reduce_scatter(at::arange(2 * n, at::kDouble) + 100.0 * r);
  ASSERT_EQ(rs.size(0), 2);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(rs[i].item<double>(), n * (2 * r + i) + 100.0 * n * (n - 1) / 2);
  at::Tensor rs16 = c->reduce_scatter((at::arange(2 * n, at::kFloat) + r).to(at::kBFloat16));
  EXPECT_EQ(rs16.scalar_type(), at::kBFloat16);
  EXPECT_EQ(rs16[0].item<float>(), static_cast<float>(n * (2 * r) + n * (n - 1) / 2));

  // all_to_all even: rows 2j, 2j+1 go to rank j.
  at::Tensor a2a = c->all_to_all(at::arange(2 * n, at::kFloat) + 1000 * r);
  for (int s = 0; s < n; ++s)
    for (int i = 0; i < 2; ++i) EXPECT_EQ(a2a[2 * s + i].item<float>(), 1000.0f * s + 2 * r + i);
  // Uneven: rank r sends j + 1 rows of value 10 r + j to rank j, so receives r + 1 rows from each.
  std::vector<at::Tensor> parts;
  std::vector<int64_t> send, recv;
  for (int j = 0; j < n; ++j) {
    parts.push_back(at::full({j + 1, 2}, 10.0 * r + j));
    send.push_back(j + 1);
    recv.push_back(r + 1);
  }
  at::Tensor u = c->all_to_all(at::cat(parts, 0), send, recv);
  ASSERT_EQ(u.size(0), n * (r + 1));
  for (int s = 0; s < n; ++s) EXPECT_EQ(u[s * (r + 1)][0].item<double>(), 10.0 * s + r);

  at::Tensor bc = at::full({3}, r == 1 ? 7.0 : -1.0);
  c->broadcast(bc, 1);
  EXPECT_EQ(bc[2].item<double>(), 7.0);
  // A ring of send / recv.
  at::Tensor got = at::zeros({2});
  if (r % 2 == 0) {
    c->send(at::full({2}, static_cast<double>(r)), (r + 1) % n);
    c->recv(got, (r + n - 1) % n);
  } else {
    c->recv(got, (r + n - 1) % n);
    c->send(at::full({2}, static_cast<double>(r)), (r + 1) % n);
  }
  EXPECT_EQ(got[0].item<float>(), static_cast<float>((r + n - 1) % n));
  c->barrier();
}

TEST(DistWorker, Faults) {
  if (!worker()) GTEST_SKIP() << "runs under mm launch only";
  auto c = Communicator::create(DistEnv::from_environment(), std::chrono::seconds(4));
  if (c->rank() == 1) {
    if (mode() == "kill") std::raise(SIGKILL);  // dies before the collective
    std::this_thread::sleep_for(std::chrono::seconds(8));  // "absent": never enters it
    return;
  }
  at::Tensor t = at::ones({4});
  try {
    c->all_reduce(t);
    ADD_FAILURE() << "all_reduce returned without rank 1";
  } catch (const mm::Error& e) {
    std::printf("fault: %s\n", e.what());
  }
}
