// `mm memory` against what the runs measure: each rank's peak of live tensors in the steps (the
// counting CPU allocator, core/allocator.h), within 15%, on the quickstarts (text: Debian's
// fortunes; vision-language: Fashion-MNIST) and the parallel test layouts of dist_train_runs.h
// (DDP, ZeRO-1, FSDP, tensor and sequence parallel, pipeline, recompute, gradient accumulation).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist_train_runs.h"
#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/data/features.h"
#include "run_command.h"

namespace {

using mm::test::read_file;
using mm::test::run_command;
using json = nlohmann::json;

struct Compared {
  std::vector<double> estimated, measured;  // by world rank
  std::string text;
};

// `mm memory` and a 4-step `mm train` of the same config and overrides on `ranks` processes.
Compared compare(const std::string& name, const std::string& cfg, int ranks, const std::string& overrides,
                 const std::string& dir) {
  Compared c;
  const std::string mm = mm::test::mm_binary();
  std::string slug;
  for (char ch : name) slug += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  const std::string est_path = dir + "/" + slug + ".estimate.json", metrics = dir + "/" + slug + ".jsonl";
  auto e = run_command(mm + " memory " + cfg + " " + overrides + " --world " + std::to_string(ranks) + " --json " + est_path);
  EXPECT_EQ(e.exit_code, 0) << name << "\n" << e.output;
  if (e.exit_code != 0) return c;
  const json est = json::parse(read_file(est_path));
  c.estimated.assign(static_cast<size_t>(ranks), 0);
  for (const auto& r : est["ranks"])
    for (int rank : r["ranks"].get<std::vector<int>>()) c.estimated[static_cast<size_t>(rank)] = r["peak"].get<double>();
  const std::string cmd = (ranks > 1 ? mm::test::mm_launch(ranks) : std::string()) + mm + " train " + cfg + " " +
                          overrides + " training.train_iters=4 training.save_interval=0 training.eval_interval=0 "
                          "training.save_dir=" + dir + "/" + slug + "_run training.metrics_file=" + metrics +
                          " tools.progress=lines";
  auto t = run_command(cmd);
  EXPECT_EQ(t.exit_code, 0) << cmd << "\n" << t.output;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("peak_tensor_bytes_per_rank")) c.measured = j["peak_tensor_bytes_per_rank"].get<std::vector<double>>();
  }
  EXPECT_EQ(c.measured.size(), static_cast<size_t>(ranks)) << name << "\n" << t.output;
  char line[256];
  for (size_t r = 0; r < c.measured.size(); ++r) {
    std::snprintf(line, sizeof line, "%-34s rank %zu: estimated %8.2f MiB, measured %8.2f MiB (%+.1f%%)\n",
                  name.c_str(), r, c.estimated[r] / 1048576.0, c.measured[r] / 1048576.0,
                  100.0 * (c.estimated[r] - c.measured[r]) / c.measured[r]);
    c.text += line;
    EXPECT_NEAR(c.estimated[r], c.measured[r], 0.15 * c.measured[r]) << name << " rank " << r << "\n" << e.output;
  }
  std::fputs(c.text.c_str(), stdout);
  return c;
}

}  // namespace

TEST(Memory, CountingAllocatorSeesTensorsComeAndGo) {
  mm::count_cpu_tensor_memory();
  const int64_t before = mm::cpu_tensor_bytes();
  {
    at::Tensor t = at::empty({1024, 256}, at::kFloat);  // 1 MiB
    EXPECT_EQ(mm::cpu_tensor_bytes() - before, 1 << 20);
    mm::reset_peak_cpu_tensor_bytes();
    at::Tensor u = t * 2;  // another MiB
    u.reset();
    EXPECT_EQ(mm::cpu_tensor_bytes() - before, 1 << 20);
    EXPECT_GE(mm::peak_cpu_tensor_bytes() - before, 2 << 20);
  }
  EXPECT_EQ(mm::cpu_tensor_bytes(), before);
}

TEST(Memory, EstimateWithin15PercentOfMeasuredOnTheParallelLayouts) {
  const std::string dir = mm::test::fresh_dir("memory_layouts");
  std::filesystem::create_directories(dir + "/text");
  std::filesystem::create_directories(dir + "/vl");
  const std::string text = mm::test::text_config(dir + "/text");
  const std::string vl = mm::test::vl_config(dir + "/vl", 24);
  // Layers wide enough that activations, not the process's fixed tensors, make the peak.
  const std::string wide = "training.micro_batch_size=8 model.config.hidden_size=128 model.config.intermediate_size=384 ";
  const std::string vl_wide = "training.micro_batch_size=4 ";
  const std::string pp2 = "parallel.pipeline_parallel_size=2 training.gradient_accumulation_steps=4";
  const struct {
    const char* name;
    const std::string& cfg;
    int ranks;
    std::string overrides;
  } layouts[] = {
      {"text one process", text, 1, wide},
      {"text ddp 2", text, 2, wide + "parallel.data_parallel_replicate_size=2"},
      {"text ddp 2 zero-1", text, 2, wide + "parallel.data_parallel_replicate_size=2 parallel.distributed_optimizer=true"},
      {"text fsdp 2", text, 2, wide + "parallel.data_parallel_shard_size=2"},
      {"text tp 2", text, 2, wide + "parallel.tensor_parallel_size=2"},
      {"text tp 2 sequence parallel", text, 2, wide + "parallel.tensor_parallel_size=2 parallel.sequence_parallel=true"},
      {"text pp 2 (4 micro-batches)", text, 2, wide + pp2},
      {"text recompute", text, 1, wide + "'features.recompute=[model.layers.{*}]'"},
      {"text 2 micro-batches", text, 1, wide + "training.gradient_accumulation_steps=2"},
      {"text cp 2 (Ulysses)", text, 2, wide + "parallel.context_parallel_size=2"},
      {"text cp 2 (ring)", text, 2, wide + "parallel.context_parallel_size=2 parallel.context_parallel_algo=ring"},
      {"text cp 2 x fsdp 2", text, 4, wide + "parallel.context_parallel_size=2 parallel.data_parallel_shard_size=2"},
      {"vl one process", vl, 1, vl_wide},
      {"vl ddp 2", vl, 2, vl_wide + "parallel.data_parallel_replicate_size=2"},
      {"vl fsdp 2", vl, 2, vl_wide + "parallel.data_parallel_shard_size=2"},
      {"vl tp 2", vl, 2, vl_wide + "model.config.vocab_size=264 parallel.tensor_parallel_size=2"},
      {"vl pp 2 (4 micro-batches)", vl, 2, vl_wide + pp2},
      {"vl cp 2 (Ulysses)", vl, 2, vl_wide + "parallel.context_parallel_size=2"},
      {"vl cp 2 (ring)", vl, 2, vl_wide + "parallel.context_parallel_size=2 parallel.context_parallel_algo=ring"},
  };
  for (const auto& l : layouts) compare(l.name, l.cfg, l.ranks, l.overrides, dir);
}

// Features of the tiny DiT quickstart's shapes (16 x 3 x 12 x 12 latents, 64-wide text of 12
// tokens), random: memory does not depend on the values.
std::string dit_features(const std::string& dir, int n, std::vector<int64_t> latent, int64_t text, int64_t width) {
  at::manual_seed(0);
  std::vector<mm::data::FeatureSample> samples;
  for (int i = 0; i < n; ++i) {
    mm::data::FeatureSample s;
    s.latents = at::randn(latent);
    s.prompt_embeds = at::randn({text, width});
    s.caption = "sample " + std::to_string(i);
    samples.push_back(s);
  }
  mm::data::write_features(dir, samples);
  return dir;
}

TEST(Memory, EstimateWithin15PercentOfMeasuredOnTheQuickstarts) {
  const std::string dir = mm::test::fresh_dir("memory_quickstarts");
  const std::string mm = mm::test::mm_binary(), src = mm::test::source_dir();
  auto d = run_command(mm + " data fashion-mnist --out " + dir + "/fm --max-train 2000 --max-test 100 --threads 2");
  ASSERT_EQ(d.exit_code, 0) << d.output;
  const std::string fm = "data.paths=[" + dir + "/fm/train.jsonl] data.val_paths=[" + dir + "/fm/test.jsonl]";
  compare("qwen2-vl quickstart", src + "/examples/qwen2vl/tiny_fashion_mnist.yaml", 1, fm, dir);
  compare("qwen2.5-vl quickstart", src + "/examples/qwen2.5vl/tiny_fashion_mnist.yaml", 1, fm, dir);
  compare("llava quickstart", src + "/examples/llava/tiny_fashion_mnist.yaml", 1, fm, dir);
  // The video quickstart's two trainings: the VAE on moving garments, the DiT on their features.
  auto v = run_command(mm + " data moving-fashion-mnist --out " + dir + "/moving --train 40 --test 8 --size 48 --frames 5");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  compare("wan vae quickstart", src + "/examples/wan2.1/tiny_vae.yaml", 1,
          "data.paths=[" + dir + "/moving/train.jsonl]", dir);
  compare("wan dit quickstart", src + "/examples/wan2.1/tiny_dit.yaml", 1,
          "data.paths=[" + dit_features(dir + "/features", 64, {16, 3, 12, 12}, 12, 64) + "] training.export_dir=", dir);
  if (!std::filesystem::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "Debian's fortunes is not installed";
  compare("text quickstart", src + "/examples/qwen2/tiny_fortunes.yaml", 1, "", dir);
}

TEST(Memory, EstimateWithin15PercentOfMeasuredOnDiTLayouts) {
  const std::string dir = mm::test::fresh_dir("memory_dit");
  const std::string cfg = mm::test::source_dir() + "/examples/wan2.1/tiny_dit.yaml";
  const std::string common = "data.paths=[" + dit_features(dir + "/features", 64, {16, 3, 12, 12}, 12, 64) +
                             "] training.export_dir= training.micro_batch_size=8 ";
  compare("dit fsdp 2", cfg, 2, common + "parallel.data_parallel_shard_size=2", dir);
  compare("dit tp 2", cfg, 2, common + "parallel.tensor_parallel_size=2", dir);
  compare("dit pp 2 (4 micro-batches)", cfg, 2, common + "parallel.pipeline_parallel_size=2 training.gradient_accumulation_steps=4", dir);
  compare("dit recompute", cfg, 1, common + "'features.recompute=[blocks.{*}]'", dir);
  compare("dit cp 2 (Ulysses, cut inside)", cfg, 2, common + "parallel.context_parallel_size=2", dir);
  compare("dit cp 2 (ring, cut inside)", cfg, 2, common + "parallel.context_parallel_size=2 parallel.context_parallel_algo=ring", dir);
}

TEST(Memory, FullSizeConfigsSizeWithoutTheirData) {
  const std::string dir = mm::test::fresh_dir("memory_full_size");
  const std::string mm = mm::test::mm_binary(), src = mm::test::source_dir();
  // Qwen2-VL-7B (8,291,375,616 parameters) under FSDP over 8: an eighth of them per rank in fp32,
  // the frozen ViT without gradients or optimizer state; 2048 tokens and a 672x672 image a row.
  auto r = run_command(mm + " memory " + src + "/examples/qwen2vl/qwen2vl_7b.yaml --world 8 --seq-len 2048 --images 1 "
                       "--image-height 672 --image-width 672 --json " + dir + "/7b.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fsdp 8 on 8 ranks, micro-batch 1 x 2048 tokens, pixel_values 2304 x 1176"), std::string::npos)
      << r.output;
  const json e = json::parse(read_file(dir + "/7b.json"));
  ASSERT_EQ(e["ranks"].size(), 1u);
  const json& rank = e["ranks"][0];
  EXPECT_NEAR(rank["params"].get<double>(), 8291375616.0 * 4 / 8, 1e6);
  EXPECT_LT(rank["grads"].get<double>(), rank["params"].get<double>());  // the ViT is frozen
  EXPECT_EQ(rank["optimizer"].get<double>(), 2 * rank["grads"].get<double>());
  EXPECT_GT(rank["activations"].get<double>(), 1e9);
  // The same rows from the data and from --seq-len give the same activations (fixed-length text;
  // without the data, the vocabulary comes from the config: the byte tokenizer's 260).
  if (!std::filesystem::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "Debian's fortunes is not installed";
  const std::string text = src + "/examples/qwen2/tiny_fortunes.yaml";
  auto a = run_command(mm + " memory " + text + " --json " + dir + "/data.json");
  auto b = run_command(mm + " memory " + text + " model.config.vocab_size=260 --seq-len 128 --json " + dir + "/synthetic.json");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(json::parse(read_file(dir + "/data.json"))["ranks"][0]["activations"],
            json::parse(read_file(dir + "/synthetic.json"))["ranks"][0]["activations"]);
}

// Selective recompute (features.recompute naming an attention or an MLP): the same losses as
// without (recompute re-runs the same kernels), `mm memory` within 15% of each, and the step's
// measured peak between none and whole layers. Offload on the CPU is a one-line error.
TEST(Memory, SelectiveRecomputeKeepsLossesAndLowersThePeak) {
  const std::string dir = mm::test::fresh_dir("memory_selective");
  const std::string text = mm::test::text_config(dir);
  const std::string wide = " training.micro_batch_size=8 model.config.hidden_size=128 model.config.intermediate_size=384 "
                           "data.seq_len=128 training.train_iters=4 training.eval_interval=0 ";
  const std::string mm = mm::test::mm_binary();
  auto run = [&](const std::string& name, const std::string& plan) {
    std::string slug;
    for (char ch : name) slug += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    const std::string metrics = dir + "/" + slug + ".jsonl";
    auto r = run_command(mm + " train " + text + wide + plan + " training.metrics_file=" + metrics);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    double peak = 0;
    std::istringstream in(read_file(metrics));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("peak_tensor_bytes_per_rank")) peak = j["peak_tensor_bytes_per_rank"][0].get<double>();
    }
    // mm memory counts the parts a plan recomputes.
    const std::string est_path = dir + "/" + slug + ".estimate.json";
    auto e = run_command(mm + " memory " + text + wide + plan + " --json " + est_path);
    EXPECT_EQ(e.exit_code, 0) << e.output;
    const double estimated = e.exit_code == 0 ? json::parse(read_file(est_path))["ranks"][0]["peak"].get<double>() : 0;
    std::printf("%-28s peak %.2f MiB, estimated %.2f MiB (%+.1f%%)\n", name.c_str(), peak / 1048576.0,
                estimated / 1048576.0, 100.0 * (estimated - peak) / peak);
    EXPECT_NEAR(estimated, peak, 0.15 * peak) << name << "\n" << e.output;
    return std::make_pair(mm::test::metrics_losses(metrics), peak);
  };
  const auto none = run("no recompute", "");
  const auto mlp = run("MLP only", "'features.recompute=[model.layers.{*}.mlp]'");
  const auto attn = run("attention only", "'features.recompute=[model.layers.{*}.self_attn]'");
  const auto block = run("whole layers", "'features.recompute=[model.layers.{*}]'");
  ASSERT_EQ(none.first.size(), 4u);
  for (const auto* r : {&mlp, &attn, &block}) {
    ASSERT_EQ(r->first.size(), 4u);
    for (auto& [it, l] : none.first) EXPECT_NEAR(r->first.at(it), l, 1e-6 * l) << it;
  }
  EXPECT_LT(mlp.second, none.second);
  EXPECT_LT(attn.second, none.second);
  EXPECT_LT(block.second, mlp.second);
  EXPECT_LT(block.second, attn.second);
  auto bad = run_command(mm + " train " + text + wide + "'features.offload=[model.layers.{*}]'");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("features.offload needs a CUDA device"), std::string::npos) << bad.output;
  auto wrong = run_command(mm + " train " + text + wide + "'features.recompute=[model.norm]'");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("neither a block"), std::string::npos) << wrong.output;
}
