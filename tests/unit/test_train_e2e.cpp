// End-to-end runs of `mm train`: exact resume after a kill, learning on real text, HF export
// and reload, recompute and bf16 through the config.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "corpora.h"
#include "metrics_file.h"
#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using mm::test::run_command;

std::string tiny_config(const std::string& dir, const std::string& save_dir) {
  mm::test::write_file(dir + "/corpus.txt", mm::test::make_corpus(7));
  std::string text =
      "data:\n  paths: [" + dir + "/corpus.txt]\n  format: text\n  seq_len: 32\n  val_fraction: 0.1\n"
      "model:\n  id: qwen2\n  config:\n    hidden_size: 48\n    intermediate_size: 96\n    num_hidden_layers: 2\n"
      "    num_attention_heads: 4\n    num_key_value_heads: 2\n    tie_word_embeddings: false\n"
      "training:\n  train_iters: 20\n  micro_batch_size: 4\n  gradient_accumulation_steps: 2\n"
      "  optimizer: {lr: 0.003}\n  lr_schedule: {id: cosine, warmup_iters: 3}\n  eval_iters: 2\n"
      "  save_interval: 10\n  save_dir: " + save_dir + "\n  resume: auto\n  seed: 7\n"
      "tools:\n  progress: lines\n";
  mm::test::write_file(dir + "/cfg.yaml", text);
  return dir + "/cfg.yaml";
}


void expect_same_tensors(const std::string& a, const std::string& b) {
  mm::st::SafetensorsReader ra(a), rb(b);
  ASSERT_EQ(ra.keys(), rb.keys());
  for (auto& k : ra.keys()) EXPECT_TRUE(at::equal(ra.get(k), rb.get(k))) << k << " differs between " << a << " and " << b;
}

TEST(TrainE2E, ExactResumeAfterKillIsBitwiseEqual) {
  std::string dir = mm::test::fresh_dir("resume");
  std::string straight = dir + "/straight", resumed = dir + "/resumed";
  std::string cfg = tiny_config(dir, straight);
  std::string mm = mm::test::mm_binary();

  auto a = run_command(mm + " train " + cfg);
  ASSERT_EQ(a.exit_code, 0) << a.output;

  // Killed (SIGKILL) as iteration 14 begins: the checkpoint at 10 is the last complete one.
  auto b1 = run_command("MM_DEBUG_KILL_AT_ITER=14 " + mm + " train " + cfg + " training.save_dir=" + resumed);
  ASSERT_EQ(b1.exit_code, 137) << b1.output;
  EXPECT_EQ(mm::test::read_file(resumed + "/latest"), "iter_0000010\n");
  auto b2 = run_command(mm + " train " + cfg + " training.save_dir=" + resumed);
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  EXPECT_NE(b2.output.find("resumed from"), std::string::npos);

  auto la = mm::test::metrics_losses(straight + "/metrics.jsonl"), lb = mm::test::metrics_losses(resumed + "/metrics.jsonl");
  ASSERT_EQ(la.size(), 20u);
  ASSERT_EQ(lb.size(), 20u);
  for (int64_t it = 1; it <= 20; ++it) EXPECT_EQ(la[it], lb[it]) << "iteration " << it;
  EXPECT_LT(la[20], la[1]);
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    expect_same_tensors(straight + "/iter_0000020/" + f, resumed + "/iter_0000020/" + f);
}

TEST(TrainE2E, ExportedHFDirectoryReloadsToTheSameValidationLoss) {
  std::string dir = mm::test::fresh_dir("export");
  std::string save = dir + "/save";
  std::string cfg = tiny_config(dir, save);
  std::string mm = mm::test::mm_binary();
  auto r = run_command(mm + " train " + cfg + " training.train_iters=5 training.export_dir=" + dir + "/hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(dir + "/hf/config.json"));
  ASSERT_TRUE(fs::exists(dir + "/hf/model.safetensors"));
  auto e = run_command(mm + " export --checkpoint " + save + " --out " + dir + "/hf2");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  expect_same_tensors(dir + "/hf/model.safetensors", dir + "/hf2/model.safetensors");

  // Start a new run from the exported directory: its first validation equals the last one.
  auto r2 = run_command(mm + " train " + cfg + " training.train_iters=0 training.save_dir= training.resume= "
                        "training.metrics_file=" + dir + "/m2.jsonl model.pretrained=" + dir + "/hf model.config={}");
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  auto v1 = mm::test::metrics_val_losses(save + "/metrics.jsonl"), v2 = mm::test::metrics_val_losses(dir + "/m2.jsonl");
  ASSERT_GE(v1.size(), 2u);
  ASSERT_GE(v2.size(), 1u);
  EXPECT_EQ(v1.back(), v2.front());
}

// A short run without checkpoints; its per-iteration losses go to dir/name.jsonl.
mm::test::CommandResult short_run(const std::string& cfg, const std::string& dir, const std::string& name,
                                  int iters, const std::string& extra = "") {
  return run_command(mm::test::mm_binary() + " train " + cfg + " training.train_iters=" + std::to_string(iters) +
                     " training.save_dir= training.resume= training.metrics_file=" + dir + "/" + name + ".jsonl " + extra);
}

TEST(TrainE2E, RecomputePlanGivesTheSameLosses) {
  std::string dir = mm::test::fresh_dir("recompute");
  std::string cfg = tiny_config(dir, "");
  auto base = short_run(cfg, dir, "a", 4);
  auto rc = short_run(cfg, dir, "b", 4, "features.recompute=[model.layers.{*}]");
  ASSERT_EQ(base.exit_code, 0) << base.output;
  ASSERT_EQ(rc.exit_code, 0) << rc.output;
  EXPECT_NE(rc.output.find("recomputing activations of 2 modules"), std::string::npos) << rc.output;
  auto la = mm::test::metrics_losses(dir + "/a.jsonl"), lb = mm::test::metrics_losses(dir + "/b.jsonl");
  ASSERT_EQ(la.size(), 4u);
  for (auto& [it, l] : la) EXPECT_EQ(l, lb[it]) << "iteration " << it;
}

TEST(TrainE2E, Bf16TrainsCloseToFp32) {
  std::string dir = mm::test::fresh_dir("bf16");
  std::string cfg = tiny_config(dir, "");
  auto f = short_run(cfg, dir, "f", 6);
  auto b = short_run(cfg, dir, "b", 6, "training.precision=bf16");
  ASSERT_EQ(f.exit_code, 0) << f.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto lf = mm::test::metrics_losses(dir + "/f.jsonl"), lb = mm::test::metrics_losses(dir + "/b.jsonl");
  ASSERT_EQ(lb.size(), 6u);
  for (auto& [it, l] : lf) {
    EXPECT_TRUE(std::isfinite(lb[it]));
    EXPECT_NEAR(lb[it], l, 0.05 * l) << "iteration " << it;  // bf16 matmuls: ~1% per-step noise
  }
}

// The fortunes corpus (Debian `fortunes`): a model must get well below the unigram baseline.
TEST(TrainE2E, LearnsFortunesWellBelowUnigramBaseline) {
  const std::string corpus = "/usr/share/games/fortunes";
  ASSERT_TRUE(fs::exists(corpus)) << "install Debian's fortunes package (make deps)";
  std::string dir = mm::test::fresh_dir("fortunes");
  std::string mm = mm::test::mm_binary();
  auto r = run_command(mm + " train " + mm::test::source_dir() + "/examples/qwen2/tiny_fortunes.yaml "
                       "training.train_iters=150 training.save_dir= training.resume= training.eval_interval=0 "
                       "training.metrics_file=" + dir + "/m.jsonl tools.sample.max_new_tokens=0 "
                       "training.lr_schedule.warmup_iters=15");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(mm::test::read_file(dir + "/m.jsonl"));
  std::string line;
  double baseline = NAN, before = NAN, after = NAN;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("unigram_baseline")) {
      baseline = j["unigram_baseline"];
      before = j["val_loss"];
    } else if (j.contains("val_loss")) {
      after = j["val_loss"];
    }
  }
  std::printf("fortunes: held-out loss %.4f -> %.4f nats/byte (ppl %.2f -> %.2f); unigram baseline %.4f\n", before,
              after, std::exp(before), std::exp(after), baseline);
  EXPECT_GT(before, baseline);            // an untrained model is worse than unigram
  EXPECT_LT(after, baseline - 0.5);       // a trained one is well below it
}

}  // namespace
