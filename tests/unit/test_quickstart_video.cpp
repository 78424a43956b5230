// `make quickstart-video`'s script, every stage, with tiny counts from its environment variables:
// moving Fashion-MNIST, the VAE trained and its latent statistics measured, the tokenizer and
// text encoder made, features extracted, the DiT trained, the 80 class x direction prompts (each twice)
// sampled into MP4s and one contact sheet, and the judge's report on them and on real clips.
// It checks the plumbing (a few steps learn nothing); the quickstart's scores are in
// examples/wan2.1/README.md, from the full run.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/data/media/video.h"
#include "run_command.h"

namespace {
using mm::test::run_command;
namespace fs = std::filesystem;
}

TEST(QuickstartVideo, ScriptRunsEveryStage) {
  const std::string dir = mm::test::fresh_dir("quickstart_video");
  const std::string env = "QV_DATA=" + dir + "/data QV_OUT=" + dir + "/out QV_TRAIN_CLIPS=48 QV_TEST_CLIPS=8 "
                          "QV_VAE_ITERS=4 QV_DIT_ITERS=4 QV_STEPS=2 QV_JUDGE_EPOCHS=1 QV_THREADS=1 ";
  auto r = run_command(env + "bash " + mm::test::source_dir() + "/examples/wan2.1/quickstart.sh " + mm::test::mm_binary());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string out = dir + "/out";
  // The pipeline the stages assembled, in diffusers' layout, with the VAE's measured statistics.
  for (const char* f : {"vae/config.json", "vae/diffusion_pytorch_model.safetensors", "transformer/config.json",
                        "transformer/diffusion_pytorch_model.safetensors", "text_encoder/config.json",
                        "tokenizer/tokenizer.json"})
    EXPECT_TRUE(fs::exists(out + "/pipe/" + f)) << f;
  const nlohmann::json vae = nlohmann::json::parse(mm::test::read_file(out + "/pipe/vae/config.json"));
  EXPECT_EQ(vae.at("latents_mean").size(), 16u);
  EXPECT_EQ(vae.at("latents_std").size(), 16u);
  // 80 videos of 5 frames at 48x48, and one sheet of them four to a row (20 rows of 20 frames).
  EXPECT_EQ(mm::data::probe_video(out + "/samples/clip_79.mp4").num_frames, 5);
  const mm::data::Image sheet = mm::data::load_image(out + "/samples/clip.png");
  EXPECT_EQ(sheet.width, 20 * 48 + 19 * 2);
  EXPECT_EQ(sheet.height, 20 * 48 + 19 * 2);
  // The judge read every generated clip (each class eight times, each direction 20) and the real ones.
  const nlohmann::json j = nlohmann::json::parse(mm::test::read_file(out + "/judge.json"));
  ASSERT_EQ(j.at("files").size(), 2u);
  EXPECT_EQ(j["files"][0].at("clips"), 80);
  EXPECT_EQ(j["files"][1].at("clips"), 8);
  EXPECT_EQ(j["files"][0]["verdicts"][77].at("want"), "an ankle boot moving right");
  EXPECT_NE(r.output.find("quickstart-video: "), std::string::npos) << r.output;
}
