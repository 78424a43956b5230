// `mm train` on several loopback ranks under `mm launch`, against one process with the same
// global batch: DDP and FSDP over 2, 3 and 4 ranks and HSDP 2x2 give the same per-step losses
// (1e-5 relative over 20 steps, fp32) and the same validation losses, on the Qwen2 text model
// and the tiny Qwen2-VL model, per token and per sample, with recompute, prefetch depths and
// units that stay gathered; FSDP over 4 holds a quarter of one process's parameter, gradient
// and optimizer bytes; bf16 gathers stay close to fp32; rank 0 alone logs and writes; a mesh
// that does not fit the world is a one-line error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mindspeed_mm/data/media/image.h"
#include "metrics_file.h"
#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using mm::test::run_command;

// Generated sentences: about 560 rows of 32 bytes, so 20 steps of 8 rows stay in one epoch.
std::string make_corpus() {
  const char* subj[] = {"the cat", "a dog", "my neighbour", "the old sailor", "every child", "the robot"};
  const char* verb[] = {"likes", "paints", "watches", "remembers", "builds", "sells"};
  const char* obj[] = {"red apples", "the sea", "tall towers", "quiet songs", "small boats", "warm bread"};
  std::string s;
  uint64_t x = 11;
  for (int i = 0; i < 600; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += std::string(subj[(x >> 33) % 6]) + " " + verb[(x >> 40) % 6] + " " + obj[(x >> 50) % 6] + ".\n\n";
  }
  return s;
}

std::string text_config(const std::string& dir) {
  mm::test::write_file(dir + "/corpus.txt", make_corpus());
  mm::test::write_file(dir + "/text.yaml",
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
std::string vl_config(const std::string& dir, int n) {
  const char* answers[] = {"red", "a green one", "blue, clearly"};
  fs::create_directories(dir + "/media");
  std::string jsonl;
  for (int i = 0; i < n; ++i) {
    const int w = 28 + (i * 7) % 40, h = 28 + (i * 11) % 30, c = i % 3;
    mm::data::Image im(w, h);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int k = 0; k < 3; ++k) im.row(y)[3 * x + k] = static_cast<uint8_t>(k == c ? 200 + (x + y) % 50 : (x * y) % 60);
    const std::string name = "media/" + std::to_string(i) + ".png";
    mm::data::save_png(im, dir + "/" + name);
    nlohmann::json j;
    j["messages"] = {{{"role", "user"}, {"content", "<image>What colour is this?"}},
                     {{"role", "assistant"}, {"content", answers[c]}}};
    j["images"] = {name};
    jsonl += j.dump() + "\n";
  }
  mm::test::write_file(dir + "/train.jsonl", jsonl);
  mm::test::write_file(dir + "/vl.yaml",
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
  double memory_fraction = 0;  // parameter + gradient + optimizer bytes per rank / one process's
  std::string output;
};

// `mm train cfg` on `ranks` processes (1: no launcher) with the given overrides.
TrainRun train(const std::string& cfg, int ranks, const std::string& metrics, const std::string& overrides) {
  const std::string cmd = (ranks > 1 ? mm::test::mm_launch(ranks) : std::string()) + mm::test::mm_binary() + " train " +
                          cfg + " training.metrics_file=" + metrics + " " + overrides;
  fs::remove(metrics);
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  TrainRun out;
  out.output = r.output;
  out.losses = mm::test::metrics_losses(metrics);
  std::istringstream in(mm::test::read_file(metrics));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) out.val_losses.push_back(j["val_loss"].get<double>());
    if (j.contains("memory_bytes"))
      out.memory_fraction = j["memory_bytes"].get<double>() / j["memory_bytes_one_process"].get<double>();
  }
  return out;
}

// Per-step losses within 1e-5 relative over all 20 steps, and the same validation losses.
void expect_same_run(const TrainRun& one, const TrainRun& dist, const std::string& what) {
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

}  // namespace

TEST(DistributedTrain, DdpTextLossesEqualOneProcess) {
  const std::string dir = mm::test::fresh_dir("dist_train_text");
  const std::string cfg = text_config(dir);
  // Global batch of 8 rows per step in 2 accumulation micro-steps: 1 x 4 rows, 2 x 2, 4 x 1.
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4 training.gradient_accumulation_steps=2");
  for (int n : {2, 4}) {
    // Over 2 ranks with recompute too: the recomputed blocks' gradients arrive in nested
    // backward passes, and the buckets must still be waited only at the very end.
    const TrainRun dist = train(cfg, n, dir + "/ddp.jsonl",
                                "training.micro_batch_size=" + std::to_string(4 / n) +
                                    " training.gradient_accumulation_steps=2 parallel.data_parallel_replicate_size=" +
                                    std::to_string(n) + (n == 2 ? " 'features.recompute=[\"model.layers.{*}\"]'" : ""));
    expect_same_run(one, dist, "qwen2 text, DDP over " + std::to_string(n));
    // Only rank 0 prints progress.
    EXPECT_NE(dist.output.find("[rank 0] iter 20/20"), std::string::npos) << dist.output;
    EXPECT_EQ(dist.output.find("[rank 1] iter"), std::string::npos) << dist.output;
  }
  // 3 ranks: a world size that divides no parameter size of this model (48, 96, 256 ...).
  const TrainRun one6 = train(cfg, 1, dir + "/one6.jsonl", "training.micro_batch_size=6");
  const TrainRun three = train(cfg, 3, dir + "/ddp3.jsonl", "training.micro_batch_size=2 parallel.data_parallel_replicate_size=3");
  expect_same_run(one6, three, "qwen2 text, DDP over 3");
}

TEST(DistributedTrain, FsdpAndHsdpTextLossesEqualOneProcess) {
  const std::string dir = mm::test::fresh_dir("dist_train_fsdp_text");
  const std::string cfg = text_config(dir);
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4 training.gradient_accumulation_steps=2");
  EXPECT_NEAR(one.memory_fraction, 1.0, 1e-12);
  // data_parallel_shard_size defaults to the rest of the world: FSDP.
  const TrainRun two = train(cfg, 2, dir + "/fsdp2.jsonl",
                             "training.micro_batch_size=2 training.gradient_accumulation_steps=2 "
                             "'features.recompute=[\"model.layers.{*}\"]'");
  expect_same_run(one, two, "qwen2 text, FSDP over 2 with recompute");
  const TrainRun four = train(cfg, 4, dir + "/fsdp4.jsonl",
                              "training.micro_batch_size=1 training.gradient_accumulation_steps=2 parallel.fsdp.prefetch=2");
  expect_same_run(one, four, "qwen2 text, FSDP over 4, prefetch 2");
  // A quarter, up to the padding of sizes that 4 does not divide.
  EXPECT_GE(four.memory_fraction, 0.25);
  EXPECT_LT(four.memory_fraction, 0.26);
  std::printf("FSDP over 4: parameter + gradient + optimizer bytes per rank = %.4f of one process's\n",
              four.memory_fraction);
  const TrainRun hsdp = train(cfg, 4, dir + "/hsdp.jsonl",
                              "training.micro_batch_size=1 training.gradient_accumulation_steps=2 "
                              "parallel.data_parallel_replicate_size=2 parallel.fsdp.reshard_after_forward=false");
  expect_same_run(one, hsdp, "qwen2 text, HSDP 2x2, units kept gathered after forward");
  EXPECT_NEAR(hsdp.memory_fraction, 0.5, 0.01);
  // 3 ranks: no parameter size of this model divides by 3 (48, 96, 256 x 48 ...); no prefetch.
  const TrainRun one6 = train(cfg, 1, dir + "/one6.jsonl", "training.micro_batch_size=6");
  const TrainRun three = train(cfg, 3, dir + "/fsdp3.jsonl", "training.micro_batch_size=2 parallel.fsdp.prefetch=0");
  expect_same_run(one6, three, "qwen2 text, FSDP over 3");
}

TEST(DistributedTrain, FsdpQwen2VlLossesEqualOneProcessAndBf16StaysClose) {
  const std::string dir = mm::test::fresh_dir("dist_train_fsdp_vl");
  const std::string cfg = vl_config(dir, 200);
  const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4");
  // Every block a unit (the vision tower's and the decoder's).
  const TrainRun two = train(cfg, 2, dir + "/fsdp2.jsonl", "training.micro_batch_size=2");
  expect_same_run(one, two, "qwen2_vl, FSDP over 2");
  // Only the decoder layers: the vision tower is part of the root unit.
  const TrainRun four = train(cfg, 4, dir + "/fsdp4.jsonl",
                              "training.micro_batch_size=1 'parallel.fsdp.units=[\"model.layers.{*}\"]'");
  expect_same_run(one, four, "qwen2_vl, FSDP over 4, decoder layers as units");
  const TrainRun hsdp = train(cfg, 4, dir + "/hsdp.jsonl", "training.micro_batch_size=1 parallel.data_parallel_replicate_size=2");
  expect_same_run(one, hsdp, "qwen2_vl, HSDP 2x2");
  // bf16 gathered parameters, fp32 gradient reduction and master weights: close, not equal.
  const TrainRun bf16 = train(cfg, 2, dir + "/bf16.jsonl", "training.micro_batch_size=2 parallel.fsdp.param_dtype=bf16");
  ASSERT_EQ(bf16.losses.size(), 20u) << bf16.output;
  double worst = 0;
  for (auto& [it, l] : one.losses) worst = std::max(worst, std::abs(bf16.losses.at(it) - l) / l);
  EXPECT_LT(worst, 1e-2);
  EXPECT_GT(worst, 1e-6);  // it really ran in bf16
  std::printf("qwen2_vl, FSDP over 2 with bf16 parameters: max relative loss difference to fp32 %.2e\n", worst);
}

TEST(DistributedTrain, DdpQwen2VlLossesEqualOneProcessPerTokenAndPerSample) {
  const std::string dir = mm::test::fresh_dir("dist_train_vl");
  const std::string cfg = vl_config(dir, 200);
  for (const std::string norm : {"per_token", "per_sample"}) {
    const std::string common = " training.loss_normalization=" + norm;
    const TrainRun one = train(cfg, 1, dir + "/one.jsonl", "training.micro_batch_size=4" + common);
    const TrainRun dist = train(cfg, 2, dir + "/ddp.jsonl",
                           "training.micro_batch_size=2 parallel.data_parallel_replicate_size=2" + common);
    expect_same_run(one, dist, "qwen2_vl " + norm + ", DDP over 2");
    if (norm == "per_sample") {
      // A sample's answer is 1 to 5 tokens here: the two normalisations give different losses.
      const TrainRun per_token = train(cfg, 1, dir + "/tok.jsonl", "training.micro_batch_size=4");
      EXPECT_GT(std::abs(per_token.losses.at(1) - one.losses.at(1)), 1e-3);
    }
  }
}

TEST(DistributedTrain, MeshThatDoesNotFitTheWorldIsAClearError) {
  const std::string dir = mm::test::fresh_dir("dist_train_bad_mesh");
  const std::string cfg = text_config(dir);
  auto r = run_command(mm::test::mm_launch(2) + mm::test::mm_binary() + " train " + cfg +
                       " parallel.data_parallel_replicate_size=3 training.train_iters=1");
  EXPECT_NE(r.output.find("config: parallel.data_parallel_replicate_size 3 x context_parallel_size 1 x "
                          "tensor_parallel_size 1 = 3 does not divide the world size 2"),
            std::string::npos)
      << r.output;
  // Both ranks stop with the error; the launcher exits with its code (2, a config error).
  EXPECT_EQ(r.exit_code, 2) << r.output;
}
