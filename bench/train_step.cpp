// Train-step throughput of the tiny Qwen2 LM in our engine: mm::training::train_step() itself
// (forward, summed next-token cross-entropy / token count, backward, grad-norm clip, AdamW step,
// zero_grad), the function `mm train` calls. bench/train_step_baseline.py is the same model and
// loop in eager PyTorch; bench/run_train_step.sh runs both and prints the ratio.
//
// Weights and token batches come from seeded CPU generators in the same order as the baseline
// draws them, so both implementations start from the same weights and see the same data: their
// loss_first values should agree to float rounding (about ln(vocab) = 5.56 for vocab 260).
// Batches are generated before timing, so data cost is excluded.
//
// --device cuda runs the step on a GPU (each step ends in a loss read, so the timing covers the
// device's work; bf16 is CUDA autocast, AdamW ATen's fused kernel as `mm train` picks there).
// --docs N splits every row into N packed documents (positions restart; attention stays inside a
// document: the varlen flash kernel on CUDA, a segment mask on the CPU).
//
// Output: one line `RESULT impl=mm tokens_per_s=... step_ms=... loss_first=... loss_last=... tflops=...`.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/training/optimizer.h"
#include "mindspeed_mm/training/train_step.h"

namespace {

struct Args {
  int64_t hidden = 192, layers = 4, heads = 6, kv_heads = 2, intermediate = 512, vocab = 260;
  int64_t seq = 128, batch = 16, steps = 20, warmup = 3, threads = 1, seed = 42, docs = 1;
  std::string precision = "fp32", device = "cpu";
  bool phases = false;  // --phases 1: also print mean ms per phase over the timed steps
  std::string trace;    // --trace PATH: Chrome trace of the timed steps (autograd profiler)
};

Args parse_args(int argc, char** argv) {
  Args a;
  std::map<std::string, int64_t*> ints = {
      {"--hidden", &a.hidden}, {"--layers", &a.layers},   {"--heads", &a.heads}, {"--kv-heads", &a.kv_heads},
      {"--intermediate", &a.intermediate}, {"--vocab", &a.vocab}, {"--seq", &a.seq}, {"--batch", &a.batch},
      {"--steps", &a.steps}, {"--warmup", &a.warmup}, {"--threads", &a.threads}, {"--seed", &a.seed},
      {"--docs", &a.docs}};
  int64_t phases = 0;
  ints["--phases"] = &phases;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "train_step: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    std::string v = argv[++i];
    if (k == "--trace") {
      a.trace = v;
    } else if (k == "--device") {
      a.device = v;
    } else if (k == "--precision") {
      if (v != "fp32" && v != "bf16") {
        std::fprintf(stderr, "train_step: --precision must be fp32 or bf16 (got %s)\n", v.c_str());
        std::exit(2);
      }
      a.precision = v;
    } else if (ints.count(k)) {
      *ints[k] = std::atoll(v.c_str());
    } else {
      std::fprintf(stderr, "train_step: unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  a.phases = phases != 0;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  mm::configure_host_allocator();  // as the mm binary does at start-up
  const Args a = parse_args(argc, argv);
  at::set_num_threads(static_cast<int>(a.threads));
  const bool bf16 = a.precision == "bf16";
  at::Device device = at::kCPU;
  try {
    device = mm::resolve_device(a.device, 0, "--device");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 2;
  }
  mm::set_current_device(device);

  nlohmann::json hf = {{"vocab_size", a.vocab},
                       {"hidden_size", a.hidden},
                       {"intermediate_size", a.intermediate},
                       {"num_hidden_layers", a.layers},
                       {"num_attention_heads", a.heads},
                       {"num_key_value_heads", a.kv_heads},
                       {"max_position_embeddings", std::max<int64_t>(512, a.seq)},
                       {"rope_theta", 10000.0},
                       {"rms_norm_eps", 1e-6},
                       {"tie_word_embeddings", true},
                       {"initializer_range", 0.02}};
  std::shared_ptr<mm::models::Model> model;
  {
    mm::nn::DeferredInitGuard deferred;  // storage only on the device (a 1B model never sits on the host)
    model = mm::models::model_registry().get("qwen2")(hf, "bench config", /*strict=*/false);
  }
  mm::nn::materialize(*model, device);
  model->init_weights(static_cast<uint64_t>(a.seed));

  // One process: the data-parallel layer and the objective as `mm train` sets them up.
  mm::config::Config cfg;
  cfg.training.precision = a.precision;
  cfg.training.clip_grad = 1.0;
  mm::training::TrainParallel par(cfg.parallel, mm::parallel::DistEnv{}, device);
  mm::training::DataParallelModel dp(*model, par, cfg.parallel, device);
  auto objective = mm::training::make_objective(cfg, *model);
  mm::training::AdamW optimizer(dp.param_groups({}), 0.9, 0.95, 1e-8, 0.1,
                                mm::training::use_fused_optimizer("auto", device));
  const double lr = 1e-3;

  // One [B, S+1] token row per step: inputs are the first S, labels the last S (aligned).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(a.seed) + 1);
  std::vector<mm::training::MicroBatch> batches;
  for (int64_t i = 0; i < a.warmup + a.steps; ++i) {
    at::Tensor t = at::randint(a.vocab, {a.batch, a.seq + 1}, gen, at::TensorOptions().dtype(at::kLong));
    mm::data::Batch b;
    b.num_samples = a.batch;
    b.set(mm::data::kInputIds, t.narrow(1, 0, a.seq).contiguous());
    b.set(mm::data::kLabels, t.narrow(1, 1, a.seq).contiguous());
    if (a.docs > 1) {
      // Packed documents: equal lengths (the last takes the remainder), positions from 0 in each.
      const int64_t len = a.seq / a.docs;
      at::Tensor seg =
          (at::arange(a.seq, at::kLong) / len).clamp_max(a.docs - 1).unsqueeze(0).expand({a.batch, a.seq}).contiguous();
      at::Tensor pos = at::arange(a.seq, at::kLong) - seg[0] * len;
      b.set(mm::data::kPositionIds, pos.unsqueeze(0).expand({a.batch, a.seq}).contiguous());
      b.set(mm::data::kSegmentIds, seg);
      auto [cu, longest] = mm::models::packed_cu_seqlens(seg);
      b.set(mm::data::kCuSeqlens, cu);
      b.set(mm::data::kMaxSeqlen, at::scalar_tensor(longest, at::kLong), /*host=*/true);
    }
    batches.push_back({b, mm::data::batch_to_device(b, device)});
  }

  // Seconds per phase, summed over timed steps (on the CPU ops are synchronous, so wall clock is exact).
  const char* kPhases[] = {"forward", "loss_backward_clip", "adamw_zero_grad"};
  std::vector<double> phase_s(3, 0.0);
  bool timing = false;
  auto clock = std::chrono::steady_clock::now();
  auto lap = [&](int phase) {
    if (!a.phases) return;
    auto now = std::chrono::steady_clock::now();
    if (timing) phase_s[phase] += std::chrono::duration<double>(now - clock).count();
    clock = now;
  };
  mm::training::StepEnv env{*model, *objective, dp, optimizer, par, bf16, cfg.training.clip_grad};
  env.after_forward = [&](size_t) { lap(0); };
  env.before_update = [&] { lap(1); };

  double loss_first = 0, loss_last = 0;
  int64_t iteration = 0;
  auto step = [&](const mm::training::MicroBatch& b) {
    clock = std::chrono::steady_clock::now();
    const double loss = mm::training::train_step(env, {b}, lr, iteration++).loss;
    lap(2);
    return loss;
  };

  for (int64_t i = 0; i < a.warmup; ++i) {
    double l = step(batches[i]);
    if (i == 0) loss_first = l;
  }
  timing = true;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
  if (!a.trace.empty()) profile = std::make_unique<torch::autograd::profiler::RecordProfile>(a.trace);
  const int64_t allocations0 = mm::cpu_tensor_allocations();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < a.steps; ++i) {
    loss_last = step(batches[a.warmup + i]);
    if (a.warmup == 0 && i == 0) loss_first = loss_last;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double allocations = static_cast<double>(mm::cpu_tensor_allocations() - allocations0) / static_cast<double>(a.steps);
  profile.reset();  // writes the trace

  const double tokens = static_cast<double>(a.steps * a.batch * a.seq);
  // Training FLOPs (forward + backward) per token at the documents' length.
  const double tflops = mm::models::as_causal_lm(model, "train_step")->flops_per_token(a.seq / std::max<int64_t>(1, a.docs)) * tokens / secs / 1e12;
  std::printf("RESULT impl=mm precision=%s threads=%lld tokens_per_s=%.1f step_ms=%.2f loss_first=%.4f loss_last=%.4f "
              "tflops=%.3f device=%s params=%lld\n",
              a.precision.c_str(), static_cast<long long>(a.threads), tokens / secs, 1e3 * secs / a.steps, loss_first,
              loss_last, tflops, device.str().c_str(), static_cast<long long>(model->num_parameters()));
  // CPU tensors allocated per step (the counting allocator of core/allocator.h; 0 when disabled).
  std::printf("ALLOCATIONS impl=mm per_step=%.0f\n", allocations);
  if (a.phases) {
    std::printf("PHASES impl=mm");
    for (int i = 0; i < 3; ++i) std::printf(" %s_ms=%.2f", kPhases[i], 1e3 * phase_s[i] / a.steps);
    std::printf("\n");
  }
  return 0;
}
