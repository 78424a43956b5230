// `mm data extract-features` (mindspeed_mm/inference/extract_features.h): H.264 clips written
// here (two aspect ratios, one too short for every bucket, one broken file, one missing) go
// through a tiny random Wan pipeline's VAE and umT5 into a features directory: each clip lands
// in the bucket nearest its aspect ratio, its latents are the VAE's normalised encoding of its
// resized, cropped frames taken at the target fps, its text features the pipeline's; bad records
// are skipped, named and counted; then `mm train` fine-tunes the pipeline's transformer on the
// features.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "mindspeed_mm/data/features.h"
#include "mindspeed_mm/data/media/video_writer.h"
#include "mindspeed_mm/inference/extract_features.h"
#include "mindspeed_mm/models/umt5/umt5.h"
#include "mindspeed_mm/models/wan/wan_vae.h"
#include "metrics_file.h"
#include "run_command.h"

using namespace mm;
using mm::test::run_command;

namespace {

// frames x h x w RGB: a bright square moving right over a colour that depends on `tint`.
void write_clip(const std::string& path, int frames, int h, int w, double fps, int tint) {
  at::Tensor f = at::zeros({frames, h, w, 3}, at::kByte);
  f.select(3, tint % 3).fill_(120);
  for (int t = 0; t < frames; ++t) f[t].narrow(0, h / 4, h / 2).narrow(1, (t * 2) % (w / 2), w / 4).fill_(230);
  data::write_mp4(path, f, fps);
}

// DIR/pipe: a tiny random Wan pipeline made and saved by diffusers.
void make_tiny_pipeline(const std::string& dir) {
  const nlohmann::json spec = {{"prompt", "a sandal"}, {"negative_prompt", ""}, {"height", 32}, {"width", 32},
                               {"frames", 5}, {"steps", 1}, {"guidance_scale", 1.0}, {"seed", 1}, {"shift", 3.0},
                               {"max_sequence_length", 8}};
  mm::test::write_file(dir + "/spec.json", spec.dump());
  auto r = run_command(std::string(MM_PYTHON) + " " + mm::test::source_dir() +
                       "/tests/conformance/diffusers_reference.py wan_pipeline " + dir + "/pipe " + dir + "/spec.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace

TEST(ExtractFeatures, ClipsToBucketedFeaturesAndTraining) {
  const std::string dir = mm::test::fresh_dir("extract_features");
  ASSERT_NO_FATAL_FAILURE(make_tiny_pipeline(dir));

  std::filesystem::create_directories(dir + "/clips");
  write_clip(dir + "/clips/wide.mp4", 24, 40, 64, 24.0, 0);   // 24 fps: frames 0, 2, 3, 5, 6 at 16 fps
  write_clip(dir + "/clips/tall.mp4", 12, 64, 40, 16.0, 1);
  write_clip(dir + "/clips/square.mp4", 9, 48, 48, 16.0, 2);
  write_clip(dir + "/clips/short.mp4", 3, 32, 32, 16.0, 0);   // 3 frames: no bucket fits
  mm::test::write_file(dir + "/clips/broken.mp4", "not a video at all");
  mm::test::write_file(dir + "/videos.jsonl",
                       "{\"path\": \"clips/wide.mp4\", \"cap\": \"a sandal moving left\"}\n"
                       "{\"path\": \"clips/tall.mp4\", \"caption\": \"a bag moving up\"}\n"
                       "{\"path\": \"clips/square.mp4\", \"cap\": \"a shirt moving right\"}\n"
                       "{\"path\": \"clips/short.mp4\", \"cap\": \"too short\"}\n"
                       "{\"path\": \"clips/broken.mp4\", \"cap\": \"broken\"}\n"
                       "{\"path\": \"clips/missing.mp4\", \"cap\": \"missing\"}\n"
                       "{\"cap\": \"no path\"}\n");
  const std::string mm = mm::test::mm_binary();
  auto e = run_command(mm + " data extract-features --model " + dir + "/pipe --data " + dir + "/videos.jsonl --out " + dir +
                       "/features --buckets 32x48x5,48x32x5 --max-sequence-length 8 --max-bad-fraction 0.6");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("wrote 3 samples"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("32x48x5: 2, 48x32x5: 1"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("skipped 4 bad record(s)"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("videos.jsonl:4: video: " + dir + "/clips/short.mp4: has 3 frames at 16 fps: fewer than any bucket needs"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("videos.jsonl:5: video:"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("videos.jsonl:7: has no \"path\" string"), std::string::npos) << e.output;

  // The features: the VAE's latents of the processed clip and the pipeline's text features.
  const inference::WanPipeline pipe = inference::load_wan_pipeline(dir + "/pipe");
  config::DataConfig c;
  c.dataset = "features";
  c.paths = {dir + "/features"};
  c.val_fraction = 0;
  data::DataContext ctx;
  ctx.micro_batch_size = 1;
  data::TrainData d = data::make_features_data(c, ctx);
  std::map<int64_t, data::Batch> by_id;
  for (int k = 0; k < 3; ++k) {
    data::Batch b = d.train->next();
    by_id[b[data::kSampleIds][0].item<int64_t>()] = b;
  }
  ASSERT_EQ(by_id.size(), 3u);
  EXPECT_EQ(by_id[0][data::kLatents].sizes(), (std::vector<int64_t>{1, 4, 2, 4, 6}));  // wide: 32x48
  EXPECT_EQ(by_id[1][data::kLatents].sizes(), (std::vector<int64_t>{1, 4, 2, 6, 4}));  // tall: 48x32
  const at::Tensor text = inference::encode_prompts(pipe, {"a bag moving up"}, 8);
  EXPECT_TRUE(at::allclose(by_id[1][data::kPromptEmbeds], text, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(by_id[0][data::kNullPromptEmbeds], inference::encode_prompts(pipe, {""}, 8), 1e-5, 1e-6));
  // The square clip (9 frames at 16 fps: frames 0..4) ties between the buckets' aspects and goes
  // to the first, 32x48: no resize, a centre crop of rows 8..39; its latents are the VAE's
  // normalised encoding of those frames in [-1, 1].
  {
    at::NoGradGuard no_grad;
    const data::DecodedVideo v = data::decode_video_frames(dir + "/clips/square.mp4", [](const data::VideoInfo&) {
      return std::vector<int64_t>{0, 1, 2, 3, 4};
    });
    at::Tensor clip = at::empty({1, 3, 5, 32, 48});
    for (int t = 0; t < 5; ++t) {
      const at::Tensor px = at::from_blob(const_cast<uint8_t*>(v.frames[static_cast<size_t>(t)].rgb.data()), {48, 48, 3}, at::kByte);
      clip[0].select(1, t).copy_(px.narrow(0, 8, 32).permute({2, 0, 1}).to(at::kFloat) / 127.5 - 1.0);
    }
    EXPECT_TRUE(at::allclose(by_id[2][data::kLatents], pipe.vae->encode(clip), 1e-5, 1e-6));
  }

  // Fine-tuning the pipeline's transformer on them.
  mm::test::write_file(dir + "/train.yaml",
                       "data:\n  dataset: features\n  paths: [" + dir + "/features]\n  val_fraction: 0\n"
                       "model:\n  id: wan_dit\n  pretrained: " + dir + "/pipe/transformer\n"
                       "training:\n  train_iters: 4\n  micro_batch_size: 1\n  optimizer: {lr: 0.001}\n"
                       "  flow_matching: {shift: 3.0, text_dropout: 0.5}\n  export_dir: " + dir + "/tuned\n"
                       "tools:\n  progress: lines\n");
  auto t = run_command(mm + " train " + dir + "/train.yaml training.metrics_file=" + dir + "/m.jsonl");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_EQ(mm::test::metrics_losses(dir + "/m.jsonl").size(), 4u);
  EXPECT_TRUE(std::filesystem::exists(dir + "/tuned/config.json"));
}

// Online encoding (model.encoders {id: wan}): the videos dataset's clips and captions run through
// the pipeline's frozen VAE and umT5 every step give the transformer the same training as the
// features `mm data extract-features` wrote from the same JSONL: equal losses and validation
// losses (same samples, timesteps, noise and text dropout; batched encoding rounds differently
// from one clip at a time, hence 1e-5).
TEST(ExtractFeatures, OnlineEncodingTrainsAsExtractedFeatures) {
  const std::string dir = mm::test::fresh_dir("online_encoding");
  ASSERT_NO_FATAL_FAILURE(make_tiny_pipeline(dir));
  std::filesystem::create_directories(dir + "/clips");
  const char* caps[] = {"a sandal moving left", "a bag moving up", "a shirt moving right", "a coat moving down",
                        "a dress moving left", "a sneaker moving up"};
  std::string jsonl;
  for (int i = 0; i < 6; ++i) {
    write_clip(dir + "/clips/c" + std::to_string(i) + ".mp4", 9, 32, 32, 16.0, i);
    jsonl += "{\"path\": \"clips/c" + std::to_string(i) + ".mp4\", \"cap\": \"" + caps[i] + "\"}\n";
  }
  mm::test::write_file(dir + "/videos.jsonl", jsonl);
  const std::string mm = mm::test::mm_binary();
  auto e = run_command(mm + " data extract-features --model " + dir + "/pipe --data " + dir + "/videos.jsonl --out " + dir +
                       "/features --buckets 32x32x5 --max-sequence-length 8");
  ASSERT_EQ(e.exit_code, 0) << e.output;

  const std::string model = "model:\n  id: wan_dit\n  pretrained: " + dir + "/pipe/transformer\n";
  const std::string rest =
      "training:\n  train_iters: 4\n  micro_batch_size: 2\n  optimizer: {lr: 0.001}\n"
      "  flow_matching: {shift: 3.0, text_dropout: 0.5}\n  eval_interval: 2\n  eval_iters: 2\n"
      "tools:\n  progress: lines\n";
  mm::test::write_file(dir + "/features.yaml",
                       "data:\n  dataset: features\n  paths: [" + dir + "/features]\n  val_fraction: 0.3\n" + model + rest);
  mm::test::write_file(dir + "/online.yaml",
                       "data:\n  dataset: videos\n  paths: [" + dir + "/videos.jsonl]\n  val_fraction: 0.3\n"
                       "  video: {height: 32, width: 32, frames: 5, fps: 16}\n" + model +
                       "  encoders: {id: wan, path: " + dir + "/pipe, max_sequence_length: 8}\n" + rest);
  auto a = run_command(mm + " train " + dir + "/features.yaml training.metrics_file=" + dir + "/a.jsonl");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b = run_command(mm + " train " + dir + "/online.yaml training.metrics_file=" + dir + "/b.jsonl training.save_dir=" + dir +
                       "/b tools.profile.start_step=2 tools.profile.steps=1");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // The frozen encoders' forward FLOPs count in the step's (2 clips of 5 x 32 x 32 through the
  // VAE's encoder, 2 captions of 8 tokens through umT5) and are parts of the profile summary.
  auto step_flops = [](const std::string& metrics) {
    std::map<int64_t, double> out;
    std::istringstream in(mm::test::read_file(metrics));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("tflops")) out[j["iter"].get<int64_t>()] = j["tflops"].get<double>() * j["step_time_s"].get<double>() * 1e12;
    }
    return out;
  };
  const double encoders = 2 * (mm::models::load_wan_vae(dir + "/pipe/vae")->encode_flops(5, 32, 32) +
                               mm::models::umt5_forward_flops(mm::models::load_umt5_encoder(dir + "/pipe/text_encoder")->config, 8));
  const auto fa = step_flops(dir + "/a.jsonl"), fb = step_flops(dir + "/b.jsonl");
  ASSERT_EQ(fa.size(), 4u);
  for (const auto& [it, f] : fa) EXPECT_NEAR(fb.at(it) - f, encoders, 1e-6 * fb.at(it)) << "iteration " << it;
  const auto summary = nlohmann::json::parse(mm::test::read_file(dir + "/b/profile/profile_summary_rank0.json"));
  std::set<std::string> parts;
  for (const auto& p : summary["parts"]) parts.insert(p["name"].get<std::string>());
  EXPECT_EQ(parts, (std::set<std::string>{"transformer", "vae (frozen)", "text encoder (frozen)"})) << summary.dump();
  EXPECT_NE(b.output.find("encoders: wan from " + dir + "/pipe"), std::string::npos) << b.output;
  const auto la = mm::test::metrics_losses(dir + "/a.jsonl"), lb = mm::test::metrics_losses(dir + "/b.jsonl");
  ASSERT_EQ(la.size(), 4u);
  ASSERT_EQ(lb.size(), 4u);
  for (const auto& [it, loss] : la) EXPECT_NEAR(lb.at(it), loss, 1e-5 * std::fabs(loss)) << "iteration " << it;
  const auto va = mm::test::metrics_val_losses(dir + "/a.jsonl"), vb = mm::test::metrics_val_losses(dir + "/b.jsonl");
  ASSERT_GE(va.size(), 2u);
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(vb[i], va[i], 1e-5 * std::fabs(va[i])) << "validation " << i;

  // Captions missing from the data: one line naming the field at start.
  std::string nocap;
  for (int i = 0; i < 6; ++i) nocap += "{\"path\": \"clips/c" + std::to_string(i) + ".mp4\"}\n";
  mm::test::write_file(dir + "/nocap.jsonl", nocap);
  auto c = run_command(mm + " train " + dir + "/online.yaml data.paths=[" + dir + "/nocap.jsonl]");
  EXPECT_NE(c.exit_code, 0);
  EXPECT_NE(c.output.find("data.dataset videos produces no captions (model wan_dit with objective flow_matching and encoders wan needs it)"),
            std::string::npos) << c.output;
  // A transformer whose text width is not the text encoder's.
  auto d = run_command(mm + " train " + dir + "/online.yaml model.pretrained= model.config.text_dim=24 model.config.num_layers=1 "
                       "model.config.num_attention_heads=2 model.config.attention_head_dim=8 model.config.in_channels=4 "
                       "model.config.out_channels=4");
  EXPECT_NE(d.exit_code, 0);
  EXPECT_NE(d.output.find("is not the transformer's text_dim 24"), std::string::npos) << d.output;
}
