// The CUDA path (CTest label `cuda`; bench/gpu/run.sh runs them on the GPU machine). Every test
// skips where no CUDA device is visible, so the suite builds and passes on a CPU machine too.
// References and tolerances:
//   fp32 on the GPU against fp32 on the CPU (TF32 off, libtorch's default for matmuls): 1e-4
//     relative for logits, 2e-3 for losses after a few optimizer steps;
//   bf16 autocast on the GPU against fp32: 3e-2 relative for logits, 5e-2 for the loss;
//   the varlen flash kernel (bf16) against fp32 masked attention: 2e-2 relative, forward and backward;
//   fused AdamW on the GPU against the for-loop update on the CPU: 1e-5 relative.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/torch_compat.h"
#include "mindspeed_mm/inference/model_loader.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/training/optimizer.h"
#include "run_command.h"

namespace {

using mm::test::rel_err;
using mm::test::run_command;
using nlohmann::json;

#define REQUIRE_CUDA(n)                                                                            \
  do {                                                                                             \
    if (mm::cuda_device_count() < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA device(s)";       \
  } while (0)

const at::Device kGpu(at::kCUDA, 0);

std::string corpus() {
  const char* words[] = {"red", "green", "sea", "boat", "bread", "tower", "song", "child", "robot", "cat"};
  std::string s;
  uint64_t x = 3;
  for (int i = 0; i < 3000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += words[(x >> 33) % 10];
    s += (i % 9 == 8) ? ".\n\n" : " ";
  }
  return s;
}

std::string tiny_train_config(const std::string& dir) {
  mm::test::write_file(dir + "/corpus.txt", corpus());
  const std::string text =
      "data:\n  paths: [" + dir + "/corpus.txt]\n  format: text\n  seq_len: 64\n  val_fraction: 0.1\n"
      "model:\n  id: qwen2\n  config:\n    hidden_size: 64\n    intermediate_size: 128\n    num_hidden_layers: 2\n"
      "    num_attention_heads: 4\n    num_key_value_heads: 2\n    tie_word_embeddings: false\n"
      "training:\n  train_iters: 6\n  micro_batch_size: 4\n  gradient_accumulation_steps: 2\n"
      "  optimizer: {lr: 0.003}\n  eval_iters: 2\n  seed: 7\n"
      "tools:\n  progress: lines\n";
  mm::test::write_file(dir + "/cfg.yaml", text);
  return dir + "/cfg.yaml";
}

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    auto j = json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// The same run on the CPU and the GPU: equal losses step by step within 2e-3 relative in fp32,
// and bf16 autocast on the GPU within 5e-2 of them while still learning.
TEST(Cuda, TrainingMatchesTheCpuRun) {
  REQUIRE_CUDA(1);
  const std::string dir = mm::test::fresh_dir("cuda_train");
  const std::string cfg = tiny_train_config(dir), mm = mm::test::mm_binary();
  auto run = [&](const std::string& name, const std::string& extra) {
    auto r = run_command(mm + " train " + cfg + " training.metrics_file=" + dir + "/" + name + ".jsonl " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return losses(dir + "/" + name + ".jsonl");
  };
  auto cpu = run("cpu", "training.device=cpu");
  auto gpu = run("gpu", "training.device=cuda");
  auto gpu_loop = run("gpu_loop", "training.device=cuda training.optimizer.implementation=for_loop");
  auto bf16 = run("bf16", "training.device=cuda training.precision=bf16");
  ASSERT_EQ(cpu.size(), 6u);
  ASSERT_EQ(gpu.size(), 6u);
  ASSERT_EQ(gpu_loop.size(), 6u);
  ASSERT_EQ(bf16.size(), 6u);
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 2e-3 * cpu[i]) << "step " << i + 1 << " (fused AdamW on the GPU)";
    EXPECT_NEAR(gpu_loop[i], cpu[i], 2e-3 * cpu[i]) << "step " << i + 1 << " (for-loop AdamW on the GPU)";
    EXPECT_NEAR(bf16[i], cpu[i], 5e-2 * cpu[i]) << "step " << i + 1 << " (bf16)";
  }
  EXPECT_LT(bf16.back(), bf16.front());
}

// A checkpoint written from the GPU resumes on the GPU where the straight run would be, and
// the exported model generates the same greedy tokens on the CPU and the GPU.
TEST(Cuda, CheckpointResumeAndGenerate) {
  REQUIRE_CUDA(1);
  const std::string dir = mm::test::fresh_dir("cuda_resume");
  const std::string cfg = tiny_train_config(dir), mm = mm::test::mm_binary();
  const std::string common = " training.device=cuda training.save_interval=3 training.resume=auto";
  auto a = run_command(mm + " train " + cfg + common + " training.save_dir=" + dir + "/straight training.export_dir=" +
                       dir + "/hf");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b1 = run_command("MM_DEBUG_KILL_AT_ITER=5 " + mm + " train " + cfg + common + " training.save_dir=" + dir + "/resumed");
  ASSERT_EQ(b1.exit_code, 137) << b1.output;
  auto b2 = run_command(mm + " train " + cfg + common + " training.save_dir=" + dir + "/resumed");
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  auto la = losses(dir + "/straight/metrics.jsonl"), lb = losses(dir + "/resumed/metrics.jsonl");
  ASSERT_FALSE(la.empty());
  ASSERT_FALSE(lb.empty());
  EXPECT_NEAR(la.back(), lb.back(), 1e-5 * la.back());
  mm::st::SafetensorsReader ra(dir + "/straight/iter_0000006/model.safetensors"),
      rb(dir + "/resumed/iter_0000006/model.safetensors");
  for (auto& k : ra.keys()) EXPECT_LT(rel_err(rb.get_copy(k), ra.get_copy(k)), 1e-5) << k;

  auto gen = [&](const char* device) {
    auto r = run_command(mm + " generate --model " + dir + "/hf --config " + cfg + " --device " + device +
                         " --prompt 'red sea' --max-new-tokens 16 --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const size_t brace = r.output.find('{');
    return brace == std::string::npos ? json() : json::parse(r.output.substr(brace, r.output.find('\n', brace) - brace))["tokens"];
  };
  EXPECT_EQ(gen("cpu"), gen("cuda"));
}

// transformers' Qwen2 (on the CPU, fp32) against mm's on the GPU: fp32 within 1e-4, bf16
// autocast within 3e-2.
TEST(Cuda, Qwen2LogitsMatchTransformers) {
  REQUIRE_CUDA(1);
  const std::string dir = mm::test::fresh_dir("cuda_qwen2_hf");
  json cfg = {{"model_type", "qwen2"},    {"architectures", {"Qwen2ForCausalLM"}},
              {"vocab_size", 97},         {"hidden_size", 64},
              {"intermediate_size", 112}, {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"initializer_range", 0.2}, {"tie_word_embeddings", false},
              {"rope_theta", 10000.0},    {"dtype", "float32"}};
  mm::test::run_hf("create " + dir + " '" + cfg.dump() + "' --seed 5");
  at::Tensor ids = at::randint(97, {2, 24}, at::kLong);
  mm::st::save_safetensors(dir + "/inputs.safetensors", {{"input_ids", ids}});
  mm::test::run_hf("logits " + dir);
  at::Tensor ref = mm::st::SafetensorsReader(dir + "/logits.safetensors").get_copy("logits");
  auto loaded = mm::inference::load_model(dir, kGpu);
  at::NoGradGuard no_grad;
  at::Tensor fp32 = loaded.model->forward(ids.to(kGpu)).to(at::kCPU);
  EXPECT_LT(rel_err(fp32, ref), 1e-4);
  at::Tensor bf16;
  {
    mm::compat::set_autocast(at::kCUDA, true, at::kBFloat16);
    bf16 = loaded.model->forward(ids.to(kGpu)).to(at::kCPU, at::kFloat);
    mm::compat::set_autocast(at::kCUDA, false, at::kBFloat16);
  }
  EXPECT_LT(rel_err(bf16, ref), 3e-2);
  std::printf("qwen2 on %s: fp32 rel err %.2e, bf16 autocast %.2e\n", mm::describe_device(kGpu).c_str(),
              rel_err(fp32, ref), rel_err(bf16, ref));
}

// The varlen flash kernel (packed rows, no mask) against fp32 masked attention on the CPU.
TEST(Cuda, VarlenFlashMatchesMaskedAttention) {
  REQUIRE_CUDA(1);
  at::manual_seed(1);
  const int64_t B = 2, Hq = 8, Hkv = 2, S = 96, D = 64;
  std::vector<int64_t> seg_v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) seg_v.push_back(b == 0 ? s / 40 : (s < 90 ? s / 30 : -1));
  at::Tensor seg = at::tensor(seg_v, at::kLong).view({B, S});
  auto [cu, longest] = mm::models::packed_cu_seqlens(seg);
  for (bool causal : {true, false}) {
    at::Tensor q = at::randn({B, Hq, S, D}), k = at::randn({B, Hkv, S, D}), v = at::randn({B, Hkv, S, D});
    at::Tensor qg = q.to(kGpu, at::kBFloat16).set_requires_grad(true), kg = k.to(kGpu, at::kBFloat16).set_requires_grad(true),
               vg = v.to(kGpu, at::kBFloat16).set_requires_grad(true);
    at::Tensor qc = q.clone().set_requires_grad(true), kc = k.clone().set_requires_grad(true), vc = v.clone().set_requires_grad(true);
    at::Tensor og = mm::models::varlen_attention(qg, kg, vg, cu.to(kGpu), longest, causal);
    at::Tensor oc = mm::models::scaled_dot_product_attention(qc, kc, vc, mm::models::segment_attention_mask(seg), causal);
    EXPECT_LT(rel_err(og.to(at::kCPU, at::kFloat), oc), 2e-2) << "causal " << causal;
    at::Tensor w = at::randn(oc.sizes());
    auto gg = torch::autograd::grad({(og.to(at::kFloat) * w.to(kGpu)).sum()}, {qg, kg, vg});
    auto gc = torch::autograd::grad({(oc * w).sum()}, {qc, kc, vc});
    for (int i = 0; i < 3; ++i) EXPECT_LT(rel_err(gg[i].to(at::kCPU, at::kFloat), gc[i]), 2e-2) << "grad " << i;
  }
}

TEST(Cuda, FusedAdamWMatchesTheCpuForLoop) {
  REQUIRE_CUDA(1);
  at::manual_seed(4);
  at::Tensor init = at::randn({257, 33});
  at::Tensor a = init.clone().set_requires_grad(true), b = init.to(kGpu).set_requires_grad(true);
  auto group = [](at::Tensor p) {
    mm::training::ParamGroup g;
    g.names = {"w"};
    g.params = {p};
    return std::vector<mm::training::ParamGroup>{g};
  };
  mm::training::AdamW loop(group(a), 0.9, 0.95, 1e-8, 0.1, false), fused(group(b), 0.9, 0.95, 1e-8, 0.1, true);
  for (int s = 0; s < 5; ++s) {
    at::Tensor g = at::randn(init.sizes());
    a.mutable_grad() = g;
    b.mutable_grad() = g.to(kGpu);
    loop.step(0.01);
    fused.step(0.01);
  }
  EXPECT_LT(rel_err(b.to(at::kCPU), a), 1e-5);
}

// NCCL: two ranks on two GPUs train like one process (DDP and FSDP), and a rank that dies
// ends the other with a message naming the collective instead of a hang.
TEST(Cuda, NcclDataParallelMatchesOneProcess) {
  REQUIRE_CUDA(2);
  const std::string dir = mm::test::fresh_dir("cuda_nccl");
  const std::string cfg = tiny_train_config(dir), mm = mm::test::mm_binary();
  auto one = run_command(mm + " train " + cfg + " training.device=cuda training.metrics_file=" + dir + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  // Two ranks, each half the micro-batch: the same global batch.
  for (const char* layout : {"parallel.data_parallel_shard_size=1", "parallel.data_parallel_shard_size=2"}) {
    auto two = run_command(mm::test::mm_launch(2) + " train " + cfg + " training.device=cuda training.micro_batch_size=2 " +
                           layout + " training.metrics_file=" + dir + "/two.jsonl");
    ASSERT_EQ(two.exit_code, 0) << two.output;
    auto l1 = losses(dir + "/one.jsonl"), l2 = losses(dir + "/two.jsonl");
    ASSERT_EQ(l1.size(), l2.size());
    for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l2[i], 2e-3 * l1[i]) << layout << " step " << i + 1;
  }
  auto dead = run_command("MM_DEBUG_KILL_AT_ITER=3 MM_DEBUG_KILL_RANK=1 " + mm::test::mm_launch(2) + " train " + cfg +
                          " training.device=cuda training.micro_batch_size=2 parallel.timeout_s=20");
  EXPECT_NE(dead.exit_code, 0);
  EXPECT_NE(dead.output.find("distributed:"), std::string::npos) << dead.output;
}

// A profile window on the GPU: Kineto's kernels join the trace on its timeline (inside the
// window's step), the CUDA allocator's history is written as PyTorch's pickle, the memory
// readings are the caching allocator's, and `mm memory` is within 15% of the measured peak.
TEST(Cuda, ProfileHasKernelsMemorySnapshotAndEstimate) {
  REQUIRE_CUDA(1);
  const std::string dir = mm::test::fresh_dir("cuda_profile");
  const std::string cfg = tiny_train_config(dir), mm = mm::test::mm_binary();
  auto r = run_command(mm + " train " + cfg + " training.device=cuda training.save_dir=" + dir +
                       "/run training.metrics_file=" + dir + "/m.jsonl tools.profile.start_step=2 tools.profile.steps=2 "
                       "tools.profile.memory_snapshot=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json trace = json::parse(mm::test::read_file(dir + "/run/profile/trace_rank0.json"));
  double step_begin = 1e300, step_end = 0;
  int kernels = 0, inside = 0;
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "phase" && e.value("name", "") == "step") {
      step_begin = std::min(step_begin, e["ts"].get<double>());
      step_end = std::max(step_end, e["ts"].get<double>() + e["dur"].get<double>());
    }
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "kernel") {
      ++kernels;
      // Kernels run after their launch, at most a little after the step ends (a step ends in a sync).
      if (e["ts"].get<double>() >= step_begin && e["ts"].get<double>() <= step_end + 1000) ++inside;
    }
  EXPECT_GT(kernels, 20) << r.output;
  EXPECT_GT(inside, kernels * 9 / 10) << "kernels off the window's timeline";
  const std::string pickle = mm::test::read_file(dir + "/run/profile/memory_snapshot_rank0.pickle");
  ASSERT_GT(pickle.size(), 100u);
  EXPECT_EQ(static_cast<unsigned char>(pickle[0]), 0x80) << "a pickle starts with its protocol opcode";
  EXPECT_NE(pickle.find("segments"), std::string::npos);
  EXPECT_NE(pickle.find("device_traces"), std::string::npos);
  auto est = run_command(mm + " memory " + cfg + " training.device=cuda --json " + dir + "/est.json");
  ASSERT_EQ(est.exit_code, 0) << est.output;
  double measured = 0;
  std::ifstream in(dir + "/m.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("peak_tensor_bytes_per_rank")) measured = j["peak_tensor_bytes_per_rank"][0].get<double>();
  }
  const double estimated = json::parse(mm::test::read_file(dir + "/est.json"))["ranks"][0]["peak"].get<double>();
  std::printf("cuda memory: estimated %.2f MiB, measured %.2f MiB\n", estimated / 1048576, measured / 1048576);
  EXPECT_NEAR(estimated, measured, 0.15 * measured);
}

}  // namespace

// Activation offload: the recomputed layers' kept inputs go to pinned host memory and come back
// ahead of backward; losses equal plain recompute's bitwise (the same kernels in the same order)
// and the step's peak is lower than without recompute. Context parallelism on the GPU (NCCL):
// ring and Ulysses equal one process to 1e-5.
TEST(Cuda, OffloadAndContextParallel) {
  REQUIRE_CUDA(1);
  const std::string dir = mm::test::fresh_dir("cuda_offload");
  const std::string cfg = tiny_train_config(dir), mm = mm::test::mm_binary();
  auto run = [&](const std::string& name, const std::string& extra, int ranks = 1) {
    const std::string metrics = dir + "/" + name + ".jsonl";
    auto r = run_command((ranks > 1 ? mm::test::mm_launch(ranks) : std::string()) + mm + " train " + cfg +
                         " training.device=cuda training.eval_iters=0 training.metrics_file=" + metrics + " " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    double peak = 0;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line);
      if (j.contains("peak_tensor_bytes_per_rank")) peak = j["peak_tensor_bytes_per_rank"][0].get<double>();
    }
    return std::make_pair(losses(metrics), peak);
  };
  const std::string layers = "'[model.layers.{*}]'";
  auto plain = run("plain", "");
  auto recompute = run("recompute", "features.recompute=" + layers);
  auto offload = run("offload", "features.offload=" + layers);
  ASSERT_EQ(offload.first.size(), 6u);
  EXPECT_EQ(offload.first, recompute.first);
  EXPECT_LT(offload.second, plain.second);
  std::printf("peak tensor memory: plain %.2f MiB, recompute %.2f MiB, offload %.2f MiB\n", plain.second / 1048576.0,
              recompute.second / 1048576.0, offload.second / 1048576.0);
  if (mm::cuda_device_count() < 2) return;
  for (const char* algo : {"ring", "ulysses"}) {
    auto cp = run(std::string("cp_") + algo, std::string("parallel.context_parallel_size=2 parallel.context_parallel_algo=") + algo, 2);
    ASSERT_EQ(cp.first.size(), plain.first.size()) << algo;
    for (size_t i = 0; i < cp.first.size(); ++i) EXPECT_NEAR(cp.first[i], plain.first[i], 1e-5 * plain.first[i]) << algo;
  }
}
