// End-to-end `mm train` on mllm data through the threaded loader: planted bad samples (corrupt
// and truncated images, a truncated video, malformed lines) are skipped and counted exactly;
// too many stop the run with a clear error; per-step losses are identical for 1, 2 and 4 loader
// workers and across a kill and resume. `mm data` subcommands on the same data.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "colour_images.h"
#include "metrics_file.h"
#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using mm::test::run_command;

const char* kColors[] = {"red", "green", "blue"};

// n samples; sample i shows a w x h image tinted kColors[i % 3]; every 10th holds a video clip.
// plant: indices whose media are broken ("img-trunc", "img-garbage", "vid-trunc") or whose line
// is malformed ("json", "mismatch").
std::string make_dataset(const std::string& dir, int n, const std::map<int, std::string>& plant) {
  fs::create_directories(dir + "/media");
  const std::string clip = dir + "/media/clip.mp4";
  auto r = run_command("ffmpeg -loglevel error -y -f lavfi -i testsrc=size=64x48:rate=10 -t 1.2 -pix_fmt yuv420p "
                       "-c:v libx264 " + clip);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string clip_bytes = mm::test::read_file(clip);
  std::string jsonl;
  for (int i = 0; i < n; ++i) {
    const int c = i % 3;
    const std::string name = mm::test::write_colour_image(dir, i);
    auto it = plant.find(i);
    const std::string kind = it == plant.end() ? "" : it->second;
    if (kind == "img-trunc") {
      std::string b = mm::test::read_file(dir + "/" + name);
      mm::test::write_file(dir + "/" + name, b.substr(0, b.size() / 2));
    } else if (kind == "img-garbage") {
      mm::test::write_file(dir + "/" + name, "\x89PNG\r\n\x1a\n this is not really a PNG");
    }
    nlohmann::json j;
    std::string question = "<image>What colour is this?";
    if (i % 10 == 0 || kind == "vid-trunc") {
      const std::string v = "media/clip" + std::to_string(i) + ".mp4";
      mm::test::write_file(dir + "/" + v, kind == "vid-trunc" ? clip_bytes.substr(0, clip_bytes.size() * 3 / 10) : clip_bytes);
      question = "<video>" + question;
      j["videos"] = {v};
    }
    j["messages"] = {{{"role", "user"}, {"content", question}}, {{"role", "assistant"}, {"content", kColors[c]}}};
    j["images"] = {name};
    if (kind == "json") jsonl += "{\"messages\": [ this line is cut";
    else if (kind == "mismatch") jsonl += R"({"messages":[{"role":"user","content":"<image><image>?"},{"role":"assistant","content":"x"}],"images":["a.png"]})";
    else jsonl += j.dump();
    jsonl += "\n";
  }
  mm::test::write_file(dir + "/train.jsonl", jsonl);
  return dir + "/train.jsonl";
}

std::string config(const std::string& dir, const std::string& data, int iters, const std::string& extra_training = "") {
  std::string text =
      "data:\n  dataset: mllm\n  paths: [" + data + "]\n  val_fraction: 0\n  cutoff_len: 512\n  num_workers: 2\n"
      "  processor: {min_pixels: 784, max_pixels: 3136, video_min_pixels: 784, video_max_pixels: 1568, fps: 4}\n"
      "model:\n  id: qwen2\n  config:\n    hidden_size: 32\n    intermediate_size: 64\n    num_hidden_layers: 2\n"
      "    num_attention_heads: 4\n    num_key_value_heads: 2\n"
      "training:\n  train_iters: " + std::to_string(iters) + "\n  micro_batch_size: 4\n  optimizer: {lr: 0.003}\n"
      "  seed: 3\n" + extra_training +
      "tools:\n  progress: lines\n";
  mm::test::write_file(dir + "/cfg.yaml", text);
  return dir + "/cfg.yaml";
}


int64_t last_skipped(const std::string& metrics_path) {
  int64_t v = 0;
  std::istringstream in(mm::test::read_file(metrics_path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("skipped_samples")) v = j["skipped_samples"].get<int64_t>();
  }
  return v;
}

}  // namespace

TEST(MllmE2E, PlantedBadSamplesAreSkippedAndCountedExactly) {
  const std::string dir = mm::test::fresh_dir("mllm_bad");
  // 100 lines, 5% planted: 2 broken images, 1 truncated video, 2 malformed lines.
  const std::map<int, std::string> plant = {
      {7, "img-trunc"}, {33, "img-garbage"}, {50, "vid-trunc"}, {61, "json"}, {88, "mismatch"}};
  const std::string data = make_dataset(dir, 100, plant);
  // 98 readable records, batches of 4: 25 steps cover every record as a first choice.
  const std::string cfg = config(dir, data, 25);
  auto r = run_command(mm::test::mm_binary() + " train " + cfg + " training.metrics_file=" + dir + "/m.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("iter 25/25"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data: skipped 5 bad sample(s)"), std::string::npos) << r.output;
  EXPECT_EQ(last_skipped(dir + "/m.jsonl"), 5);
  // Each is named once, with its file and line or path.
  for (const char* what : {"train.jsonl:62: not valid JSON", "train.jsonl:89: 2 <image> placeholder(s)", "media/7.png",
                           "media/33.png", "media/clip50.mp4"}) {
    const size_t first = r.output.find(what);
    EXPECT_NE(first, std::string::npos) << what << "\n" << r.output;
    EXPECT_EQ(r.output.find(what, first + 1), std::string::npos) << what << " reported twice";
  }
  auto l = mm::test::metrics_losses(dir + "/m.jsonl");
  ASSERT_EQ(l.size(), 25u);
  EXPECT_LT(l[25], l[1]);
}

TEST(MllmE2E, TooManyBadSamplesStopWithAClearError) {
  const std::string dir = mm::test::fresh_dir("mllm_too_bad");
  std::map<int, std::string> plant;
  for (int i = 0; i < 40; i += 3) plant[i] = "img-garbage";  // 14 of 40
  const std::string data = make_dataset(dir, 40, plant);
  const std::string cfg = config(dir, data, 10);
  auto r = run_command(mm::test::mm_binary() + " train " + cfg + " data.max_bad_fraction=0.2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("more than data.max_bad_fraction 0.2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Segmentation"), std::string::npos);
}

TEST(MllmE2E, LossesAreIdenticalForAnyWorkerCountAndAcrossResume) {
  const std::string dir = mm::test::fresh_dir("mllm_determinism");
  const std::string data = make_dataset(dir, 48, {{5, "img-trunc"}, {20, "vid-trunc"}});
  const std::string mm = mm::test::mm_binary();
  const std::string cfg = config(dir, data, 12, "  save_interval: 4\n  resume: auto\n");
  std::map<int, std::map<int64_t, double>> by_workers;
  for (int w : {1, 2, 4}) {
    const std::string save = dir + "/w" + std::to_string(w);
    auto r = run_command(mm + " train " + cfg + " data.num_workers=" + std::to_string(w) + " training.save_dir=" + save);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    by_workers[w] = mm::test::metrics_losses(save + "/metrics.jsonl");
    ASSERT_EQ(by_workers[w].size(), 12u);
  }
  for (int64_t it = 1; it <= 12; ++it) {
    EXPECT_EQ(by_workers[2][it], by_workers[1][it]) << "iteration " << it;
    EXPECT_EQ(by_workers[4][it], by_workers[1][it]) << "iteration " << it;
  }
  // Killed as iteration 7 begins (checkpoint at 4), then resumed with a different worker count.
  const std::string resumed = dir + "/resumed";
  auto k = run_command("MM_DEBUG_KILL_AT_ITER=7 " + mm + " train " + cfg + " training.save_dir=" + resumed);
  ASSERT_EQ(k.exit_code, 137) << k.output;
  auto r = run_command(mm + " train " + cfg + " data.num_workers=1 training.save_dir=" + resumed);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = mm::test::metrics_losses(resumed + "/metrics.jsonl");
  ASSERT_EQ(l.size(), 12u);
  for (int64_t it = 1; it <= 12; ++it) EXPECT_EQ(l[it], by_workers[1][it]) << "iteration " << it;
}

// The content-hashed train/val split keys media by their path under the media root, so the same
// dataset stored in two places splits the same way and trains to the same losses.
TEST(MllmE2E, SplitDoesNotDependOnWhereTheDataIsStored) {
  const std::string dir = mm::test::fresh_dir("mllm_split_location");
  const std::string mm = mm::test::mm_binary();
  std::map<std::string, std::string> metrics;
  for (const std::string where : {"a", "elsewhere/deeper/b"}) {
    const std::string data = make_dataset(dir + "/" + where, 40, {});
    const std::string cfg = config(dir + "/" + where, data, 3);
    metrics[where] = dir + "/" + where + "/metrics.jsonl";
    auto r = run_command(mm + " train " + cfg + " data.val_fraction=0.3 training.eval_iters=0 training.metrics_file=" +
                         metrics[where]);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const auto va = mm::test::metrics_val_losses(metrics["a"]), vb = mm::test::metrics_val_losses(metrics["elsewhere/deeper/b"]);
  ASSERT_FALSE(va.empty()) << "no validation loss logged";
  EXPECT_EQ(vb, va);
  const auto la = mm::test::metrics_losses(metrics["a"]), lb = mm::test::metrics_losses(metrics["elsewhere/deeper/b"]);
  ASSERT_EQ(la.size(), 3u);
  EXPECT_EQ(lb, la);
}

TEST(MllmE2E, PackedLengthGroupedTrainingRuns) {
  const std::string dir = mm::test::fresh_dir("mllm_grouped");
  const std::string data = make_dataset(dir, 24, {});
  const std::string cfg = config(dir, data, 4);
  auto r = run_command(mm::test::mm_binary() + " train " + cfg + " data.collator=packed data.group_by_length=true "
                       "training.metrics_file=" + dir + "/m.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = mm::test::metrics_losses(dir + "/m.jsonl");
  ASSERT_EQ(l.size(), 4u);
  for (auto& [it, loss] : l) EXPECT_TRUE(std::isfinite(loss) && loss > 0) << it;
}

TEST(MllmE2E, Qwen2VLTrainsOnImagesAndVideos) {
  const std::string dir = mm::test::fresh_dir("mllm_qwen2vl");
  const std::string data = make_dataset(dir, 24, {});
  std::string cfg = mm::test::read_file(config(dir, data, 8));
  // The tiny Qwen2-VL: the byte chat tokenizer's vision ids, a one-block vision tower.
  const std::string vl =
      "model:\n  id: qwen2_vl\n  config:\n    hidden_size: 32\n    intermediate_size: 64\n    num_hidden_layers: 2\n"
      "    num_attention_heads: 4\n    num_key_value_heads: 2\n"
      "    rope_scaling: {type: mrope, mrope_section: [1, 1, 2]}\n"
      "    image_token_id: 261\n    video_token_id: 262\n    vision_start_token_id: 259\n    vision_end_token_id: 260\n"
      "    vision_config: {depth: 1, embed_dim: 16, num_heads: 2, mlp_ratio: 2}\n";
  const size_t a = cfg.find("model:"), b = cfg.find("training:");
  cfg = cfg.substr(0, a) + vl + cfg.substr(b);
  mm::test::write_file(dir + "/vl.yaml", cfg);
  for (const char* collator : {"padded", "packed"}) {
    const std::string metrics = dir + "/" + collator + ".jsonl";
    // The padded run also freezes the tower's blocks and trains the merger at 10x the learning rate.
    const std::string plans = std::string(collator) == "padded"
                                  ? " features.freeze=[visual.blocks] training.optimizer.lr_multipliers=[visual.merger=10]"
                                  : "";
    auto r = run_command(mm::test::mm_binary() + " train " + dir + "/vl.yaml data.collator=" + collator +
                         " training.metrics_file=" + metrics + plans);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("has no vision tower"), std::string::npos) << r.output;
    if (!plans.empty()) EXPECT_NE(r.output.find("plan: froze"), std::string::npos) << r.output;
    auto l = mm::test::metrics_losses(metrics);
    ASSERT_EQ(l.size(), 8u);
    EXPECT_LT(l[8], l[1]) << collator;
  }
}

TEST(MllmE2E, DataCommands) {
  const std::string dir = mm::test::fresh_dir("mllm_cli");
  const std::string data = make_dataset(dir, 20, {{3, "img-garbage"}, {9, "json"}});
  const std::string mm = mm::test::mm_binary();
  auto r = run_command(mm + " data inspect " + data);
  ASSERT_EQ(r.exit_code, 1) << r.output;  // the report, then an error: bad samples fail the check
  EXPECT_NE(r.output.find("error: data: " + data + ": 2 of 20 samples are bad (listed above)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("20 records (1 malformed)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad samples: 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("media/3.png"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("token lengths"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("image sizes: width 28-"), std::string::npos) << r.output;

  mm::test::write_file(dir + "/llava.json", R"([{"id": "a", "image": "media/0.png", "conversations": [
      {"from": "human", "value": "What colour?"}, {"from": "gpt", "value": "red"}]}])");
  auto c = run_command(mm + " data convert-llava " + dir + "/llava.json " + dir + "/llava.jsonl");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("wrote 1 samples"), std::string::npos) << c.output;
  auto i2 = run_command(mm + " data inspect " + dir + "/llava.jsonl");
  EXPECT_EQ(i2.exit_code, 0) << i2.output;
  EXPECT_NE(i2.output.find("bad samples: 0"), std::string::npos) << i2.output;
  auto bad = run_command(mm + " data inspect " + dir + "/nope.jsonl");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("nope.jsonl"), std::string::npos) << bad.output;
}

// `mm train` with the other vision-language ids on the same data: Qwen2.5-VL on images and videos
// (window attention, tokens_per_second), LLaVA on images through the fixed CLIP processor.
TEST(MllmE2E, Qwen2_5VLAndLlavaTrain) {
  const std::string dir = mm::test::fresh_dir("mllm_other_vl");
  const std::string data = make_dataset(dir, 24, {});
  const std::string base = mm::test::read_file(config(dir, data, 8));
  const size_t a = base.find("model:"), b = base.find("training:");
  const std::string qwen25 =
      "model:\n  id: qwen2_5_vl\n  config:\n    hidden_size: 32\n    intermediate_size: 64\n    num_hidden_layers: 2\n"
      "    num_attention_heads: 4\n    num_key_value_heads: 2\n"
      "    rope_scaling: {type: mrope, mrope_section: [1, 1, 2]}\n"
      "    image_token_id: 261\n    video_token_id: 262\n    vision_start_token_id: 259\n    vision_end_token_id: 260\n"
      "    vision_config: {depth: 2, hidden_size: 16, intermediate_size: 24, num_heads: 2, window_size: 28,\n"
      "                    fullatt_block_indexes: [1], tokens_per_second: 2}\n";
  // LLaVA: no videos, so a copy of the data without them; 28x28 crops = 4 patches per image.
  std::string images_only;
  {
    std::istringstream in(mm::test::read_file(data));
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      j.erase("videos");
      auto& q = j["messages"][0]["content"];
      std::string t = q.get<std::string>();
      if (t.rfind("<video>", 0) == 0) q = t.substr(7);
      images_only += j.dump() + "\n";
    }
  }
  mm::test::write_file(dir + "/images.jsonl", images_only);
  const std::string llava =
      "model:\n  id: llava\n  config:\n    image_token_index: 261\n"
      "    text_config: {model_type: llama, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,\n"
      "                  num_attention_heads: 4, num_key_value_heads: 2}\n"
      "    vision_config: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 2,\n"
      "                    image_size: 28, patch_size: 14}\n";
  const std::pair<std::string, std::string> runs[] = {
      {"qwen2_5_vl", qwen25},
      {"llava", llava}};
  for (const auto& [id, model] : runs) {
    std::string cfg = base.substr(0, a) + model + base.substr(b);
    mm::test::write_file(dir + "/" + id + ".yaml", cfg);
    std::string extra = id == "llava" ? " data.paths=[" + dir + "/images.jsonl] data.processor.type=fixed "
                                        "data.processor.image_size=28 data.processor.image_tokens=4"
                                      : "";
    const std::string metrics = dir + "/" + id + ".jsonl";
    auto r = run_command(mm::test::mm_binary() + " train " + dir + "/" + id + ".yaml training.metrics_file=" + metrics + extra);
    ASSERT_EQ(r.exit_code, 0) << id << "\n" << r.output;
    EXPECT_NE(r.output.find("model: " + id), std::string::npos) << r.output;
    auto l = mm::test::metrics_losses(metrics);
    ASSERT_EQ(l.size(), 8u) << id;
    EXPECT_LT(l[8], l[1]) << id;
  }
}
