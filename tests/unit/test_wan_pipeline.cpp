// Wan2.1 text-to-video sampling (mindspeed_mm/inference/wan_pipeline.h, `mm sample`) against
// diffusers' own WanPipeline (tests/conformance/diffusers_reference.py wan_pipeline): a whole tiny
// random pipeline (Unigram tokenizer, umT5, DiT, VAE, UniPC) saved by WanPipeline.save_pretrained
// loads into mm; the prompt features and the denoised latents of a guided 4-step sample from
// the same seed equal diffusers' (fp32, 1e-4 relative, printed); `mm sample` writes the MP4 and
// the contact sheet; bad requests are one-line errors.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "hf_reference.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/data/media/video.h"
#include "mindspeed_mm/inference/wan_pipeline.h"
#include "mindspeed_mm/training/lora.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace mm;
using mm::test::run_command;

TEST(WanPipeline, PromptsAndSamplesEqualDiffusers) {
  const std::string dir = mm::test::fresh_dir("wan_pipeline");
  const nlohmann::json spec = {{"prompt", "a  sandal moving left"}, {"negative_prompt", "a shirt"}, {"height", 32},
                               {"width", 32}, {"frames", 5}, {"steps", 4}, {"guidance_scale", 5.0}, {"seed", 7},
                               {"shift", 3.0}, {"max_sequence_length", 12}};
  mm::test::write_file(dir + "/spec.json", spec.dump());
  const std::string cmd = std::string(MM_PYTHON) + " " + mm::test::source_dir() +
                          "/tests/conformance/diffusers_reference.py wan_pipeline " + dir + "/pipe " + dir + "/spec.json";
  auto r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  st::HFWeights want(dir + "/pipe/outputs.safetensors");

  const inference::WanPipeline pipe = inference::load_wan_pipeline(dir + "/pipe");
  const at::Tensor cond = inference::encode_prompts(pipe, {spec["prompt"]}, 12);
  const at::Tensor neg = inference::encode_prompts(pipe, {spec["negative_prompt"]}, 12);
  EXPECT_LT(mm::test::rel_err(cond, want.get("prompt_embeds")), 1e-5);
  EXPECT_LT(mm::test::rel_err(neg, want.get("negative_prompt_embeds")), 1e-5);
  EXPECT_EQ(cond[0][11].abs().sum().item<double>(), 0.0);  // zeros after the prompt's tokens

  inference::WanSampleOptions o;
  o.steps = 4;
  o.guidance_scale = 5.0;
  o.shift = 3.0;
  o.seed = 7;
  o.frames = 5;
  o.height = o.width = 32;
  o.negative_prompt = "a shirt";
  o.max_sequence_length = 12;
  const at::Tensor latents = inference::sample_latents(pipe, {spec["prompt"]}, o);
  ASSERT_EQ(latents.sizes(), want.get("latents").sizes());
  const double err = mm::test::rel_err(latents, want.get("latents"));
  EXPECT_LT(err, 1e-4);
  std::printf("wan pipeline: denoised latents differ from diffusers' WanPipeline by %.2e relative\n", err);

  // mm sample: an H.264 MP4 of 5 frames and its contact sheet.
  const std::string mm = mm::test::mm_binary() + " sample --model " + dir + "/pipe --height 32 --width 32 "
                         "--steps 4 --max-sequence-length 12 --seed 7 --shift 3 --negative-prompt 'a shirt' ";
  auto s = run_command(mm + "--frames 5 --prompt 'a sandal moving left' --out " + dir + "/out/clip.mp4");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  const data::VideoInfo info = data::probe_video(dir + "/out/clip.mp4");
  EXPECT_EQ(info.codec, "h264");
  EXPECT_EQ(info.num_frames, 5);
  EXPECT_EQ(info.width, 32);
  EXPECT_DOUBLE_EQ(info.fps, 16.0);
  EXPECT_EQ(data::load_image(dir + "/out/clip.png").width, 5 * 32 + 4 * 2);
  mm::test::write_file(dir + "/prompts.txt", "a sandal moving left\n\n  a bag moving up  \n");
  s = run_command(mm + "--frames 5 --prompts " + dir + "/prompts.txt --out " + dir + "/out/many.mp4");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("2/2 \"a bag moving up\""), std::string::npos) << s.output;
  EXPECT_EQ(data::probe_video(dir + "/out/many_1.mp4").num_frames, 5);
  // The sheet of every video: both on one row (up to four to a row), each with its 5 frames.
  const data::Image all = data::load_image(dir + "/out/many.png");
  EXPECT_EQ(all.width, 10 * 32 + 9 * 2);
  EXPECT_EQ(all.height, 32);
  // Long, larger videos: the sheet of all of them keeps 8 evenly spaced frames of each, scaled
  // to 128 pixels on the longer side (144x256 -> 72x128); each video's own sheet has every frame.
  s = run_command(mm::test::mm_binary() + " sample --model " + dir + "/pipe --height 144 --width 256 --frames 13 --steps 1 "
                  "--max-sequence-length 12 --prompts " + dir + "/prompts.txt --out " + dir + "/out/big.mp4");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(data::load_image(dir + "/out/big_1.png").height, 2 * 144 + 2);  // 13 frames, 8 to a row
  const data::Image big = data::load_image(dir + "/out/big.png");
  EXPECT_EQ(big.width, 16 * 128 + 15 * 2);
  EXPECT_EQ(big.height, 72);

  struct Bad {
    std::string args, want;
  };
  mm::test::write_file(dir + "/empty.txt", "\n  \n");
  const Bad bad[] = {
      {"--prompt x --frames 6 --out " + dir + "/x.mp4", "--frames 6: Wan samples 1 + 4k frames"},
      {"--prompts " + dir + "/empty.txt --out " + dir + "/x.mp4", "the prompt file has no prompt"},
      {"--prompt x --out " + dir + "/x.avi", "must end in .mp4"},
  };
  for (const Bad& b : bad) {
    auto e = run_command(mm + b.args);
    EXPECT_NE(e.exit_code, 0) << b.args;
    EXPECT_NE(e.output.find(b.want), std::string::npos) << e.output;
  }
  auto e = run_command(mm::test::mm_binary() + " sample --model " + dir + " --prompt x --out " + dir + "/x.mp4");
  EXPECT_NE(e.output.find("has no transformer/ directory: not a Wan pipeline"), std::string::npos) << e.output;

  // A PEFT LoRA adapter of the transformer (random A and B on to_q and to_v of both attentions and the FFN's first
  // projection): sampling with it attached (no merge) gives the latents of the pipeline whose
  // transformer `mm convert merge-lora` merged, and `mm sample --adapter` runs it.
  {
    inference::WanPipeline adapted = inference::load_wan_pipeline(dir + "/pipe");
    mm::config::LoraConfig lc;
    lc.target = {"to_q", "to_v", "ffn.net.0.proj"};
    lc.rank = 4;
    lc.alpha = 8;
    const auto layout = mm::training::apply_lora_plan(*adapted.transformer, lc);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    std::vector<std::pair<std::string, at::Tensor>> adapters;
    {
      at::NoGradGuard no_grad;
      for (auto& [name, p] : adapted.transformer->named_parameters())
        if (mm::training::LoraLayout::is_adapter(name)) {
          p.copy_(at::randn(p.sizes(), gen) * 0.2);
          adapters.emplace_back(name, p);
        }
    }
    mm::training::save_peft_adapter(dir + "/adapter", mm::training::peft_adapter_config(*adapted.transformer, layout),
                                    *adapted.transformer, adapters);
    auto m = run_command(mm::test::mm_binary() + " convert merge-lora --quiet --base " + dir + "/pipe/transformer --adapter " +
                         dir + "/adapter --out " + dir + "/merged/transformer");
    ASSERT_EQ(m.exit_code, 0) << m.output;
    for (const char* part : {"vae", "text_encoder", "tokenizer", "scheduler", "model_index.json"})
      if (fs::exists(dir + "/pipe/" + part)) fs::create_symlink(fs::absolute(dir + "/pipe/" + part), dir + "/merged/" + part);

    inference::WanPipeline attached = inference::load_wan_pipeline(dir + "/pipe");
    mm::training::attach_peft_adapter(*attached.transformer, dir + "/adapter");
    const inference::WanPipeline merged = inference::load_wan_pipeline(dir + "/merged");
    o.steps = 2;
    const at::Tensor with_adapter = inference::sample_latents(attached, {spec["prompt"]}, o);
    const at::Tensor with_merged = inference::sample_latents(merged, {spec["prompt"]}, o);
    const at::Tensor without = inference::sample_latents(pipe, {spec["prompt"]}, o);
    const double adapter_err = mm::test::rel_err(with_adapter, with_merged), change = mm::test::rel_err(without, with_merged);
    EXPECT_LT(adapter_err, 1e-5);
    EXPECT_GT(change, 1e-3) << "the adapter changed nothing";
    std::printf("wan LoRA: adapter attached vs merged %.2e relative (the adapter moves the latents by %.2e)\n",
                adapter_err, change);

    auto a = run_command(mm + "--frames 5 --prompt 'a sandal moving left' --adapter " + dir + "/adapter --out " + dir +
                         "/out/adapter.mp4");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find("sample: adapter " + dir + "/adapter (LoRA rank 4 on 10 transformer layers)"), std::string::npos)
        << a.output;
    EXPECT_EQ(data::probe_video(dir + "/out/adapter.mp4").num_frames, 5);
  }
}
