// training.loss_chunk_size: a language model's head fused with its cross-entropy, chunk by chunk
// (models/common/cross_entropy.h chunked_linear_cross_entropy), gives the whole-logits loss and
// gradients, trains the same, and needs far less memory (measured by the runs' own peak).
#include <gtest/gtest.h>

#include <torch/csrc/autograd/autograd.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "dist_train_runs.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "run_command.h"

namespace {

using json = nlohmann::json;

double peak_tensor_bytes(const std::string& metrics) {
  double peak = 0;
  std::istringstream in(mm::test::read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("peak_tensor_bytes_per_rank")) peak = j["peak_tensor_bytes_per_rank"][0].get<double>();
  }
  return peak;
}

}  // namespace

TEST(ChunkedLoss, EqualsWholeLogitsLossAndGradients) {
  at::manual_seed(3);
  const at::Tensor hidden = at::randn({2, 37, 16}, at::kDouble).requires_grad_(true);
  const at::Tensor weight = (0.3 * at::randn({101, 16}, at::kDouble)).requires_grad_(true);
  at::Tensor labels = at::randint(0, 101, {2, 37}, at::kLong);
  labels.narrow(1, 30, 7).fill_(mm::models::kIgnoreIndex);
  const at::Tensor upstream = at::rand({2, 37}, at::kDouble);
  for (int64_t chunk : {1, 8, 37, 100}) {
    const at::Tensor a = mm::models::chunked_linear_cross_entropy(hidden, weight, labels, chunk);
    const auto [ga_h, ga_w] = [&] {
      auto g = torch::autograd::grad({(a.to(at::kDouble) * upstream).sum()}, {hidden, weight});
      return std::make_pair(g[0], g[1]);
    }();
    const at::Tensor logits = at::matmul(hidden, weight.t());
    const at::Tensor b = at::cross_entropy_loss(logits.reshape({-1, 101}), labels.reshape({-1}), {}, at::Reduction::None,
                                                mm::models::kIgnoreIndex)
                             .view({2, 37});
    auto gb = torch::autograd::grad({(b * upstream).sum()}, {hidden, weight});
    EXPECT_TRUE(at::allclose(a.to(at::kDouble), b, 1e-6, 1e-6)) << chunk;
    EXPECT_TRUE(at::allclose(ga_h, gb[0], 1e-6, 1e-7)) << chunk;
    EXPECT_TRUE(at::allclose(ga_w, gb[1], 1e-6, 1e-7)) << chunk;
    EXPECT_TRUE(a.narrow(1, 30, 7).eq(0).all().item<bool>()) << "ignored labels score 0";
  }
  EXPECT_THROW(mm::models::chunked_linear_cross_entropy(hidden, weight, labels.narrow(1, 0, 36), 8), mm::Error);
}

// Training with the chunked head and loss equals training with whole logits (20 steps, 1e-5
// relative): text (per-token normalisation, untied head) and the tiny Qwen2-VL (per-sample,
// tied embedding), alone, under FSDP, tensor parallelism (vocabulary-parallel chunks) and
// pipeline parallelism (the last stage's).
TEST(ChunkedLoss, TrainsLikeWholeLogits) {
  using namespace mm::test;
  const std::string dir = fresh_dir("chunked_loss_train");
  std::filesystem::create_directories(dir + "/text");
  std::filesystem::create_directories(dir + "/vl");
  const std::string text = text_config(dir + "/text");
  const std::string vl = vl_config(dir + "/vl", 200);  // one epoch: the layouts read the same samples
  const TrainRun a = train(text, 1, dir + "/a.jsonl", "training.micro_batch_size=4");
  const TrainRun b = train(text, 1, dir + "/b.jsonl", "training.micro_batch_size=4 training.loss_chunk_size=7");
  EXPECT_NE(b.output.find("plan: head and cross-entropy in chunks of 7 tokens"), std::string::npos) << b.output;
  expect_same_run(a, b, "text, chunks of 7 tokens");
  const std::string vl_common = "training.micro_batch_size=4 training.loss_normalization=per_sample ";
  const TrainRun c = train(vl, 1, dir + "/c.jsonl", vl_common);
  const TrainRun d = train(vl, 1, dir + "/d.jsonl", vl_common + "training.loss_chunk_size=16");
  expect_same_run(c, d, "qwen2-vl per-sample, chunks of 16 tokens");
  const TrainRun e = train(vl, 2, dir + "/e.jsonl", "training.micro_batch_size=2 training.loss_normalization=per_sample "
                                                    "training.loss_chunk_size=16 parallel.data_parallel_shard_size=2");
  expect_same_run(c, e, "qwen2-vl per-sample, chunks of 16 tokens, FSDP 2");
  // Tensor parallelism: the head split along the vocabulary, each rank's columns of each chunk
  // (an untied head; and the tied embedding of the VL model), against the same layout's whole
  // split logits and one process.
  const TrainRun tp = train(text, 2, dir + "/tp.jsonl", "training.micro_batch_size=4 training.loss_chunk_size=7 "
                                                        "parallel.tensor_parallel_size=2");
  EXPECT_NE(tp.output.find("each rank's 1/2 of the vocabulary"), std::string::npos) << tp.output;
  expect_same_run(a, tp, "text, chunks of 7 tokens, TP 2 (vocabulary-parallel)");
  const TrainRun tp_sp = train(text, 2, dir + "/tp_sp.jsonl", "training.micro_batch_size=4 training.loss_chunk_size=7 "
                                                              "parallel.tensor_parallel_size=2 parallel.sequence_parallel=true");
  expect_same_run(a, tp_sp, "text, chunks of 7 tokens, TP 2 + SP");
  const TrainRun vl_tp = train(vl, 2, dir + "/vl_tp.jsonl", vl_common + "training.loss_chunk_size=16 "
                                                            "parallel.tensor_parallel_size=2 model.config.vocab_size=264");
  const TrainRun vl_one = train(vl, 1, dir + "/vl_one.jsonl", vl_common + "model.config.vocab_size=264");
  expect_same_run(vl_one, vl_tp, "qwen2-vl per-sample, tied, chunks of 16 tokens, TP 2");
  // Pipeline parallelism: the last stage fuses the head with the loss (2 micro-batches of 2).
  const TrainRun pp = train(text, 2, dir + "/pp.jsonl", "training.micro_batch_size=2 training.gradient_accumulation_steps=2 "
                                                        "training.loss_chunk_size=7 parallel.pipeline_parallel_size=2 "
                                                        "parallel.data_parallel_shard_size=1");
  expect_same_run(a, pp, "text, chunks of 7 tokens, PP 2");
}

// A 16k vocabulary at 2048 tokens a step: the whole logits (and their log-softmax and gradients,
// 128 MiB each) against chunks of 256 tokens; `mm memory` predicts both peaks.
TEST(ChunkedLoss, PeakMemoryDropsAndMmMemoryPredictsIt) {
  using namespace mm::test;
  const std::string dir = fresh_dir("chunked_loss_memory");
  const std::string text = text_config(dir);
  const std::string big = "training.micro_batch_size=64 model.config.vocab_size=16384 training.train_iters=3 "
                          "training.eval_iters=0 ";
  double peaks[2] = {0, 0}, estimates[2] = {0, 0};
  const char* chunked[2] = {"", "training.loss_chunk_size=256 "};
  for (int i = 0; i < 2; ++i) {
    const std::string metrics = dir + "/m" + std::to_string(i) + ".jsonl";
    auto t = run_command(mm_binary() + " train " + text + " " + big + chunked[i] + "training.metrics_file=" + metrics);
    ASSERT_EQ(t.exit_code, 0) << t.output;
    peaks[i] = peak_tensor_bytes(metrics);
    auto e = run_command(mm_binary() + " memory " + text + " " + big + chunked[i] + "--json " + dir + "/e.json");
    ASSERT_EQ(e.exit_code, 0) << e.output;
    estimates[i] = json::parse(read_file(dir + "/e.json"))["ranks"][0]["peak"].get<double>();
    EXPECT_NEAR(estimates[i], peaks[i], 0.15 * peaks[i]) << chunked[i];
  }
  std::printf("vocab 16384, 2048 tokens: peak %.1f MiB with whole logits, %.1f MiB in chunks of 256 (mm memory: %.1f, %.1f)\n",
              peaks[0] / 1048576, peaks[1] / 1048576, estimates[0] / 1048576, estimates[1] / 1048576);
  EXPECT_LT(peaks[1], peaks[0] - 300.0 * 1048576) << "the whole logits are 128 MiB, their log-softmax and gradients more";
}
