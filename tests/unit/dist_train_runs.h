// Helpers of the multi-rank `mm train` tests: tiny text and Qwen2-VL configs on generated data,
// running `mm train` on n ranks under `mm launch` and reading its metrics, and comparing two
// runs' per-step losses.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "colour_images.h"
#include "corpora.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "metrics_file.h"
#include "run_command.h"

namespace mm::test {

namespace fs = std::filesystem;

// Generated sentences: about 560 rows of 32 bytes, so 20 steps of 8 rows stay in one epoch.
inline std::string text_config(const std::string& dir) {
  write_file(dir + "/corpus.txt", make_corpus(11));
  write_file(dir + "/text.yaml",
                       "data:\n  paths: [" + dir + "/corpus.txt]\n  format: text\n  seq_len: 32\n  val_fraction: 0.1\n"
                       "model:\n  id: qwen2\n  config:\n    hidden_size: 48\n    intermediate_size: 96\n"
                       "    num_hidden_layers: 2\n    num_attention_heads: 4\n    num_key_value_heads: 2\n"
                       "    tie_word_embeddings: false\n"
                       "training:\n  train_iters: 20\n  optimizer: {lr: 0.003}\n"
                       "  lr_schedule: {id: cosine, warmup_iters: 3}\n  eval_iters: 0\n  seed: 7\n"
                       "tools:\n  progress: lines\n");
  return dir + "/text.yaml";
}

// n image samples of varying size (so a different number of image tokens each) whose answers
// differ in length (so per-sample and per-token normalisation differ).
inline std::string vl_config(const std::string& dir, int n) {
  const char* answers[] = {"red", "a green one", "blue, clearly"};
  fs::create_directories(dir + "/media");
  std::string jsonl;
  for (int i = 0; i < n; ++i) {
    const int c = i % 3;
    const std::string name = mm::test::write_colour_image(dir, i);
    nlohmann::json j;
    j["messages"] = {{{"role", "user"}, {"content", "<image>What colour is this?"}},
                     {{"role", "assistant"}, {"content", answers[c]}}};
    j["images"] = {name};
    jsonl += j.dump() + "\n";
  }
  write_file(dir + "/train.jsonl", jsonl);
  write_file(dir + "/vl.yaml",
                       "data:\n  dataset: mllm\n  paths: [" + dir + "/train.jsonl]\n  val_fraction: 0.15\n"
                       "  cutoff_len: 512\n  num_workers: 1\n  processor: {min_pixels: 784, max_pixels: 3136}\n"
                       "model:\n  id: qwen2_vl\n  config:\n    hidden_size: 32\n    intermediate_size: 64\n"
                       "    num_hidden_layers: 2\n    num_attention_heads: 4\n    num_key_value_heads: 2\n"
                       "    rope_scaling: {type: mrope, mrope_section: [1, 1, 2]}\n"
                       "    image_token_id: 261\n    video_token_id: 262\n    vision_start_token_id: 259\n"
                       "    vision_end_token_id: 260\n"
                       "    vision_config: {depth: 2, embed_dim: 32, num_heads: 2, mlp_ratio: 2, patch_size: 14}\n"
                       "training:\n  train_iters: 20\n  optimizer: {lr: 0.003}\n  eval_iters: 0\n  seed: 5\n"
                       "tools:\n  progress: lines\n");
  return dir + "/vl.yaml";
}

struct TrainRun {
  std::map<int64_t, double> losses;
  std::vector<double> val_losses;
  double memory_fraction = 0;     // parameter + gradient + optimizer bytes per rank / one process's
  double optimizer_fraction = 0;  // optimizer state bytes alone
  double memory_one_process = 0;  // one process's parameter + gradient + optimizer bytes
  std::vector<double> memory_per_rank;  // every rank's, by world rank
  std::string output;
};

// `mm train cfg` on `ranks` processes (1: no launcher) with the given overrides.
inline TrainRun train(const std::string& cfg, int ranks, const std::string& metrics, const std::string& overrides) {
  const std::string cmd = (ranks > 1 ? mm_launch(ranks) : std::string()) + mm_binary() + " train " +
                          cfg + " training.metrics_file=" + metrics + " " + overrides;
  fs::remove(metrics);
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  TrainRun out;
  out.output = r.output;
  out.losses = metrics_losses(metrics);
  out.val_losses = metrics_val_losses(metrics);
  std::istringstream in(read_file(metrics));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("memory_bytes"))
    {
      out.memory_fraction = j["memory_bytes"].get<double>() / j["memory_bytes_one_process"].get<double>();
      out.optimizer_fraction = j["optimizer_bytes"].get<double>() / j["optimizer_bytes_one_process"].get<double>();
      out.memory_one_process = j["memory_bytes_one_process"].get<double>();
      if (j.contains("memory_bytes_per_rank")) out.memory_per_rank = j["memory_bytes_per_rank"].get<std::vector<double>>();
    }
  }
  return out;
}

// Per-step losses within 1e-5 relative over all 20 steps, and the same validation losses.
inline void expect_same_run(const TrainRun& one, const TrainRun& dist, const std::string& what) {
  ASSERT_EQ(one.losses.size(), 20u) << what << "\n" << one.output;
  ASSERT_EQ(dist.losses.size(), 20u) << what << "\n" << dist.output;
  double worst = 0;
  for (auto& [it, l] : one.losses) {
    ASSERT_TRUE(dist.losses.count(it)) << what << " iteration " << it;
    worst = std::max(worst, std::abs(dist.losses.at(it) - l) / std::abs(l));
  }
  EXPECT_LT(worst, 1e-5) << what;
  ASSERT_EQ(one.val_losses.size(), dist.val_losses.size()) << what;
  for (size_t i = 0; i < one.val_losses.size(); ++i)
    EXPECT_NEAR(dist.val_losses[i], one.val_losses[i], 1e-5 * one.val_losses[i]) << what << " validation " << i;
  // The run learned: equivalence of two runs that do nothing would prove nothing.
  EXPECT_LT(one.losses.rbegin()->second, 0.8 * one.losses.begin()->second) << what;
  std::printf("%s: max relative loss difference over 20 steps %.2e\n", what.c_str(), worst);
}


// Every tensor of two HF exports within tol (0: equal) (relative to the tensor's largest element), except
// the key projections' biases: softmax over the keys does not change when the same vector is
// added to every key, so their true gradient is zero and what Adam makes of the rounding noise
// differs between any two layouts (DDP included). Those must stay small in absolute terms.
inline void expect_same_weights(const std::string& a, const std::string& b, double tol, const std::string& what) {
  mm::st::HFWeights wa(a), wb(b);
  auto ka = wa.keys(), kb = wb.keys();
  std::sort(ka.begin(), ka.end());
  std::sort(kb.begin(), kb.end());
  ASSERT_EQ(ka, kb) << what;
  double worst = 0;
  std::string worst_name;
  for (const auto& k : ka) {
    const at::Tensor x = wa.get(k).to(at::kDouble), y = wb.get(k).to(at::kDouble);
    ASSERT_EQ(x.sizes(), y.sizes()) << what << " " << k;
    if (k.find("k_proj.bias") != std::string::npos) {
      EXPECT_LT((x - y).abs().max().item<double>(), 1e-2) << what << " " << k;
      continue;
    }
    const double d = ((x - y).abs().max() / x.abs().max().clamp_min(1e-12)).item<double>();
    if (d > worst) worst = d, worst_name = k;
  }
  EXPECT_LE(worst, tol) << what << " (" << worst_name << ")";
  std::printf("%s: max relative weight difference after 20 steps %.2e (%s)\n", what.c_str(), worst, worst_name.c_str());
}

// A layout `mm train cfg` must refuse: on `ranks` processes with `overrides`, the error `want`.
struct BadLayout {
  int ranks;
  std::string overrides, want;
};

// Each case fails with its error on one line, before any process group is built (no rank
// logs "distributed: rank") and before any step.
inline void expect_clear_layout_errors(const std::string& cfg, const std::vector<BadLayout>& cases) {
  for (const BadLayout& c : cases) {
    const std::string cmd = (c.ranks > 1 ? mm_launch(c.ranks) : std::string()) + mm_binary() + " train " + cfg + " " +
                            c.overrides;
    auto r = run_command(cmd);
    EXPECT_NE(r.exit_code, 0) << cmd;
    const size_t at = r.output.find(c.want);
    ASSERT_NE(at, std::string::npos) << cmd << "\n" << r.output;
    const size_t line = r.output.rfind('\n', at) + 1;  // npos + 1 = 0 on the first line
    EXPECT_NE(r.output.find("error: ", line), std::string::npos) << cmd << "\n" << r.output;
    EXPECT_LT(r.output.find("error: ", line), at) << "the error is not on one line: " << cmd << "\n" << r.output;
    EXPECT_EQ(r.output.find("distributed: rank"), std::string::npos) << "groups built first: " << cmd << "\n" << r.output;
    EXPECT_EQ(r.output.find("iter 1/"), std::string::npos) << cmd << "\n" << r.output;
  }
}

}  // namespace mm::test
