// Attention time per token under context parallelism: forward + backward of causal attention
// over one sequence of S tokens, by one process (the whole sequence, libtorch's fused kernel) or
// by the ranks of an `mm launch` group (Ulysses: all-to-all to whole heads; ring: zigzag key/value
// blocks passed round, the same fused kernel per block). Each rank reports its time; rank 0
// prints one line: algo, ranks, S, median seconds per iteration and microseconds per token.
//
// Usage: cp_attention --algo one|ulysses|ring --seq S [--heads 8] [--kv-heads 2] [--dim 64]
//        [--iters 3] [--warmup 1] [--threads T] [--dtype fp32|bf16] [--device cpu|cuda]
//   (ulysses / ring under mm launch; bench/run_cp_attention.sh runs the table)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/parallel/communicator.h"
#include "mindspeed_mm/training/context_parallel.h"

int main(int argc, char** argv) {
  std::string algo = "one", dtype = "fp32", device_name = "cpu";
  int64_t S = 4096, H = 8, Hkv = 2, D = 64, iters = 3, threads = 0, warmup = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--algo") algo = v;
    else if (k == "--seq") S = std::stoll(v);
    else if (k == "--heads") H = std::stoll(v);
    else if (k == "--kv-heads") Hkv = std::stoll(v);
    else if (k == "--dim") D = std::stoll(v);
    else if (k == "--iters") iters = std::stoll(v);
    else if (k == "--threads") threads = std::stoll(v);
    else if (k == "--warmup") warmup = std::stoll(v);
    else if (k == "--dtype") dtype = v;
    else if (k == "--device") device_name = v;
    else {
      std::fprintf(stderr, "cp_attention: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    if (threads > 0) at::set_num_threads(static_cast<int>(threads));
    const at::Device device = device_name == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
    const auto opts = at::TensorOptions().dtype(dtype == "bf16" ? at::kBFloat16 : at::kFloat).device(device);
    std::shared_ptr<mm::parallel::Communicator> world;
    std::shared_ptr<mm::training::ContextParallel> cp;
    int rank = 0, n = 1;
    int64_t local = S;
    if (algo != "one") {
      const auto env = mm::parallel::DistEnv::from_environment();
      world = mm::parallel::Communicator::create(env, std::chrono::minutes(10), device);
      rank = world->rank();
      n = world->size();
      mm::parallel::CpLayout layout;
      if (algo == "ulysses") layout.ulysses = n;
      else layout.ring = n;
      cp = std::make_shared<mm::training::ContextParallel>(layout, world);
      mm::data::Batch b;
      b.set(mm::data::kInputIds, at::zeros({1, S}, at::kLong));
      mm::data::Batch shard = cp->shard(b);
      local = shard[mm::data::kInputIds].size(1);
      cp->begin(mm::data::batch_to_device(shard, device));
    }
    at::manual_seed(1 + rank);
    const at::Tensor q0 = at::randn({1, H, local, D}, opts), k0 = at::randn({1, Hkv, local, D}, opts);
    const at::Tensor v0 = at::randn({1, Hkv, local, D}, opts), g = at::randn({1, H, local, D}, opts);
    std::vector<double> times;
    for (int64_t it = 0; it < iters + warmup; ++it) {
      at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
      if (world) world->barrier();
      mm::synchronize(device);
      const auto t0 = std::chrono::steady_clock::now();
      at::Tensor o = cp ? cp->attend(q, k, v, true, c10::nullopt) : mm::models::scaled_dot_product_attention(q, k, v, {}, true);
      (o * g).sum().backward();
      mm::synchronize(device);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (it >= warmup) times.push_back(dt);
    }
    std::sort(times.begin(), times.end());
    double med = times[times.size() / 2];
    if (world) {  // the slowest rank's
      at::Tensor t = at::tensor({med}, at::kDouble);
      world->all_reduce(t, mm::parallel::ReduceOp::kMax);
      med = t.item<double>();
    }
    if (rank == 0)
      std::printf("%s ranks %d seq %lld: %.3f s per forward+backward, %.2f us per token\n", algo.c_str(), n,
                  static_cast<long long>(S), med, 1e6 * med / static_cast<double>(S));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
