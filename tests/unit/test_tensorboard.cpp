// TensorBoard event files (mindspeed_mm/tools/tensorboard.h) read back by PyPI's tensorboard
// (tests/conformance/tensorboard_reference.py: its EventAccumulator, which checks every record's
// CRC): scalars, a PNG image and text as written; then `tools.tensorboard_dir` on a training run:
// the loss, learning rate, grad norm, throughput and memory of every step, validation, the
// planned schedule and the resolved config, equal to the run's metrics.jsonl; under DDP only
// rank 0 writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "dist_train_runs.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/tools/tensorboard.h"
#include "run_command.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_events(const std::string& dir, const std::string& out) {
  const std::string cmd = std::string(MM_PYTHON) + " " + mm::test::source_dir() +
                          "/tests/conformance/tensorboard_reference.py read " + dir + " " + out;
  auto r = mm::test::run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  return r.exit_code == 0 ? json::parse(mm::test::read_file(out)) : json();
}

}  // namespace

TEST(TensorBoard, Crc32cOfTheStandardCheckString) {
  const std::string check = "123456789";
  EXPECT_EQ(mm::tools::crc32c(check.data(), check.size()), 0xe3069283u);  // CRC-32C's check value
  EXPECT_EQ(mm::tools::crc32c("", 0), 0u);
}

TEST(TensorBoard, TensorboardReadsScalarsImagesAndText) {
  const std::string dir = mm::test::fresh_dir("tensorboard_writer");
  mm::data::Image image(5, 3);
  for (size_t i = 0; i < image.rgb.size(); ++i) image.rgb[i] = static_cast<uint8_t>(i * 7);
  {
    mm::tools::EventWriter w(dir + "/events");
    for (int step = 1; step <= 30; ++step) w.add_scalar("train/loss", 1.0 / step, step);
    w.add_scalar("validation/loss", 0.25, 30);
    w.add_image("samples/first", image, 30);
    w.add_text("config", "    training:\n      train_iters: 30\n", 0);
  }
  const json got = read_events(dir + "/events", dir + "/read.json");
  ASSERT_FALSE(got.is_null());
  EXPECT_EQ(got["files"], 1);
  const auto& loss = got["scalars"]["train/loss"];
  ASSERT_EQ(loss.size(), 30u) << got.dump();
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(loss[i][0], i + 1);
    EXPECT_FLOAT_EQ(loss[i][1].get<float>(), static_cast<float>(1.0 / (i + 1)));
  }
  EXPECT_FLOAT_EQ(got["scalars"]["validation/loss"][0][1].get<float>(), 0.25f);
  const auto& img = got["images"]["samples/first"];
  ASSERT_EQ(img.size(), 1u) << got.dump();
  EXPECT_EQ(img[0][0], 30);
  EXPECT_EQ(img[0][1], 5);
  EXPECT_EQ(img[0][2], 3);
  const mm::data::Image back = mm::data::load_image(img[0][3].get<std::string>());
  EXPECT_EQ(back.rgb, image.rgb);
  ASSERT_EQ(got["text"]["config"].size(), 1u) << got.dump();
  EXPECT_EQ(got["text"]["config"][0][1], "    training:\n      train_iters: 30\n");
}

TEST(TensorBoard, TrainingRunLogsWhatMetricsJsonlHolds) {
  using namespace mm::test;
  const std::string dir = fresh_dir("tensorboard_train");
  const std::string cfg = text_config(dir);
  const TrainRun run = train(cfg, 1, dir + "/one.jsonl", "training.eval_interval=10 training.eval_iters=2 "
                                                         "tools.sample.prompt=The tools.sample.max_new_tokens=6 tools.tensorboard_dir=" +
                                                             dir + "/tb");
  ASSERT_EQ(run.losses.size(), 20u) << run.output;
  EXPECT_NE(run.output.find(" | mem "), std::string::npos) << "no memory in the progress line\n" << run.output;
  const json got = read_events(dir + "/tb", dir + "/read.json");
  ASSERT_FALSE(got.is_null());
  const auto& s = got["scalars"];
  for (const char* tag : {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/tflops",
                          "train/step_time_s", "memory/mem_mib", "memory/mem_peak_mib"})
    EXPECT_EQ(s[tag].size(), 20u) << tag << ": " << s.dump().substr(0, 400);
  // Every step's loss, lr and peak memory as metrics.jsonl has them (float32 in the event file).
  std::map<int64_t, json> steps;
  std::istringstream in(read_file(dir + "/one.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("loss")) steps[j["iter"].get<int64_t>()] = j;
  }
  for (const auto& row : s["train/loss"]) {
    const int64_t it = row[0];
    ASSERT_TRUE(steps.count(it)) << it;
    EXPECT_FLOAT_EQ(row[1].get<float>(), static_cast<float>(steps[it]["loss"].get<double>())) << it;
  }
  for (const auto& row : s["train/lr"])
    EXPECT_FLOAT_EQ(row[1].get<float>(), static_cast<float>(steps[row[0].get<int64_t>()]["lr"].get<double>()));
  for (const auto& row : s["memory/mem_peak_mib"]) {
    const json& st = steps[row[0].get<int64_t>()];
    ASSERT_TRUE(st.contains("mem_peak_bytes")) << st.dump();
    EXPECT_NEAR(row[1].get<double>(), st["mem_peak_bytes"].get<double>() / 1048576.0, 1e-3);
    // Live tensors (the counting allocator) within the process's resident set.
    EXPECT_GT(st["mem_peak_bytes"].get<double>(), 0.0) << st.dump();
    EXPECT_LT(st["mem_peak_bytes"].get<double>(), st["mem_peak_reserved_bytes"].get<double>()) << st.dump();
    EXPECT_GT(st["mem_peak_reserved_bytes"].get<double>(), 50e6) << "a libtorch process is larger than 50 MB";
  }
  EXPECT_EQ(s["memory/mem_peak_reserved_mib"].size(), s["memory/mem_peak_mib"].size());
  // The planned schedule covers every step and equals the lr each step used.
  ASSERT_EQ(s["schedule/lr"].size(), 20u);
  for (size_t i = 0; i < 20; ++i)
    EXPECT_FLOAT_EQ(s["schedule/lr"][i][1].get<float>(), s["train/lr"][i][1].get<float>()) << i;
  // Validation (before training, at 10 and 20), the end-of-run memory event, the config.
  ASSERT_EQ(s["validation/loss"].size(), 3u) << s.dump().substr(0, 400);
  ASSERT_EQ(run.val_losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(s["validation/loss"][i][1].get<float>(), static_cast<float>(run.val_losses[i]));
  EXPECT_EQ(s["memory/peak_rss_bytes"].size(), 1u);
  // The closing greedy sample (tools.sample) as text: the prompt and its continuation.
  ASSERT_TRUE(got["text"].contains("samples/text")) << got["text"].dump().substr(0, 300);
  ASSERT_EQ(got["text"]["samples/text"].size(), 1u) << got["text"].dump();
  EXPECT_EQ(got["text"]["samples/text"][0][0], 20);
  EXPECT_EQ(got["text"]["samples/text"][0][1].get<std::string>().rfind("The", 0), 0u);
  ASSERT_EQ(got["text"]["config"].size(), 1u);
  EXPECT_NE(got["text"]["config"][0][1].get<std::string>().find("    training:"), std::string::npos);
  EXPECT_NE(got["text"]["config"][0][1].get<std::string>().find("train_iters: 20"), std::string::npos);

  // DDP over 2: one event file (rank 0's), with the same steps.
  const TrainRun ddp = train(cfg, 2, dir + "/ddp.jsonl", "parallel.data_parallel_replicate_size=2 training.micro_batch_size=4 "
                                                         "tools.tensorboard_dir=" + dir + "/tb_ddp");
  const json two = read_events(dir + "/tb_ddp", dir + "/read_ddp.json");
  ASSERT_FALSE(two.is_null());
  EXPECT_EQ(two["files"], 1);
  EXPECT_EQ(two["scalars"]["train/loss"].size(), 20u);

  // A directory that cannot be made is one line naming it, before any step.
  write_file(dir + "/file", "x");
  auto bad = run_command(mm_binary() + " train " + cfg + " tools.tensorboard_dir=" + dir + "/file/tb");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find(dir + "/file/tb: cannot create the TensorBoard directory"), std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find("iter 1/"), std::string::npos) << bad.output;
}
