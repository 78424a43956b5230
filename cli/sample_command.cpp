// `mm sample`: text-to-video with a Wan2.1 pipeline directory (diffusers' layout).
//   mm sample --model DIR --prompt TEXT [--negative-prompt TEXT] [--steps 50] [--guidance-scale 5]
//             [--shift S] [--seed 0] [--frames 81] [--height 480] [--width 832]
//             [--scheduler unipc|euler] [--fps 16] --out video.mp4
//   mm sample --model DIR --prompts prompts.txt --out videos/clip.mp4   (clip_0.mp4, clip_1.mp4, ...)
// Each video is an H.264 MP4 plus a PNG contact sheet of its frames beside it (same name, .png);
// prompt k of a file uses seed + k, and a JSONL beside the videos (videos/clip.jsonl) lists each
// one as {"path", "cap", "seed"}, the records `mm data extract-features` and `mm judge` read, and
// videos/clip.png is a sheet of every video (up to 8 of its frames, at most 128 pixels a side),
// four videos to a row.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/video_writer.h"
#include "mindspeed_mm/inference/wan_pipeline.h"
#include "mindspeed_mm/training/lora.h"
#include "mindspeed_mm/core/file_io.h"

namespace fs = std::filesystem;

namespace mm::cli {
namespace {

struct SampleArgs {
  std::string model, prompt, prompts_file, out, device = "auto", adapter;
  inference::WanSampleOptions o;
  double fps = 16.0;
  int sheet_columns = 8;
} args;

std::vector<std::string> read_prompts(const std::string& path) {
  if (const std::string why = file_problem(path); !why.empty()) throw Error(cat("sample: ", path, ": ", why));
  std::ifstream in(path);
  if (!in) throw Error(cat("sample: ", path, ": cannot open the prompt file"));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const std::string p = inference::clean_prompt(line);
    if (!p.empty()) out.push_back(p);
  }
  if (out.empty()) throw Error(cat("sample: ", path, ": the prompt file has no prompt (one per line)"));
  return out;
}

// out.mp4 for one prompt; out_K.mp4 for prompt K of several.
std::string output_path(const std::string& out, size_t k, size_t n) {
  if (n == 1) return out;
  const fs::path p(out);
  return (p.parent_path() / (p.stem().string() + "_" + std::to_string(k) + p.extension().string())).string();
}

// What the all-videos sheet keeps of one video: at most 8 frames, evenly spaced, each scaled
// down to at most 128 pixels on its longer side ([n, h, w, 3] uint8), so the sheet of many long
// 480p videos holds kilobytes per video, not the ~100 MB of its frames.
at::Tensor sheet_thumbnails(const std::vector<at::Tensor>& frames) {
  constexpr int64_t kFrames = 8, kSide = 128;
  const int64_t n = std::min<int64_t>(kFrames, static_cast<int64_t>(frames.size()));
  std::vector<at::Tensor> picked;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = n == 1 ? 0 : i * (static_cast<int64_t>(frames.size()) - 1) / (n - 1);
    picked.push_back(frames[static_cast<size_t>(t)]);
  }
  at::Tensor f = at::stack(picked);  // [n, H, W, 3]
  const int64_t h = f.size(1), w = f.size(2), longer = std::max(h, w);
  if (longer <= kSide) return f;
  const int64_t nh = std::max<int64_t>(1, h * kSide / longer), nw = std::max<int64_t>(1, w * kSide / longer);
  const at::Tensor x = f.permute({0, 3, 1, 2}).to(at::kFloat);
  return at::upsample_bilinear2d(x, {nh, nw}, false).round().clamp(0, 255).to(at::kByte).permute({0, 2, 3, 1}).contiguous();
}

int run_sample() {
  if (args.prompt.empty() == args.prompts_file.empty())
    throw ConfigError("config: give exactly one of --prompt TEXT and --prompts FILE");
  if (fs::path(args.out).extension() != ".mp4") throw ConfigError(cat("config: --out ", args.out, " must end in .mp4"));
  const std::vector<std::string> prompts = args.prompts_file.empty() ? std::vector<std::string>{args.prompt}
                                                                     : read_prompts(args.prompts_file);
  const at::Device device = resolve_device(args.device, 0, "--device");
  std::printf("sample: loading %s on %s\n", args.model.c_str(), describe_device(device).c_str());
  const inference::WanPipeline pipe = inference::load_wan_pipeline(args.model, device);
  if (!args.adapter.empty()) {
    const auto lora = training::attach_peft_adapter(*pipe.transformer, args.adapter);
    std::printf("sample: adapter %s (LoRA rank %lld on %zu transformer layers)\n", args.adapter.c_str(),
                static_cast<long long>(lora.config.rank), lora.targets.size());
  }
  std::string manifest;
  std::vector<at::Tensor> all_frames;  // per video: sheet_thumbnails
  for (size_t k = 0; k < prompts.size(); ++k) {
    inference::WanSampleOptions o = args.o;
    o.seed = args.o.seed + k;
    std::printf("sample: %zu/%zu \"%s\": %lld frames %lldx%lld, %lld %s steps, guidance %.1f, shift %.1f, seed %llu\n", k + 1,
                prompts.size(), prompts[k].c_str(), static_cast<long long>(o.frames), static_cast<long long>(o.width),
                static_cast<long long>(o.height), static_cast<long long>(o.steps), o.scheduler.c_str(), o.guidance_scale,
                inference::resolve_shift(o), static_cast<unsigned long long>(o.seed));
    std::fflush(stdout);
    const at::Tensor latents = inference::sample_latents(pipe, {prompts[k]}, o);
    const std::string path = output_path(args.out, k, prompts.size());
    data::Mp4Writer writer(path, static_cast<int>(o.width), static_cast<int>(o.height), args.fps);
    std::vector<at::Tensor> frames;
    at::NoGradGuard no_grad;
    pipe.vae->decode_frames(pipe.vae->denormalize(latents), [&](const at::Tensor& chunk) {
      const at::Tensor f = data::video_to_uint8_frames(chunk[0].cpu());
      for (int64_t t = 0; t < f.size(0); ++t) {
        writer.add(f[t]);
        frames.push_back(f[t]);
      }
    });
    writer.close();
    const std::string sheet = fs::path(path).replace_extension(".png").string();
    data::write_contact_sheet(sheet, at::stack(frames), args.sheet_columns);
    if (prompts.size() > 1) all_frames.push_back(sheet_thumbnails(frames));
    std::printf("sample: wrote %s (%lld frames at %.0f fps) and %s\n", path.c_str(), static_cast<long long>(writer.frames()),
                args.fps, sheet.c_str());
    manifest += nlohmann::json({{"path", fs::path(path).filename().string()}, {"cap", prompts[k]}, {"seed", o.seed}}).dump() + "\n";
    if (prompts.size() > 1) st::write_file_atomic(fs::path(args.out).replace_extension(".jsonl").string(), manifest);
  }
  if (prompts.size() > 1) {
    // One sheet of every video, four to a row, each video's frames left to right.
    const std::string sheet = fs::path(args.out).replace_extension(".png").string();
    const int per_video = static_cast<int>(all_frames.front().size(0));
    data::write_contact_sheet(sheet, at::cat(all_frames), per_video * static_cast<int>(std::min<size_t>(4, prompts.size())));
    std::printf("sample: listed the videos in %s; all of them in %s (four to a row)\n",
                fs::path(args.out).replace_extension(".jsonl").string().c_str(), sheet.c_str());
  }
  return 0;
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto* c = app.add_subcommand("sample", "Text-to-video with a Wan2.1 pipeline directory: H.264 MP4 and a PNG contact sheet");
  c->add_option("--model", args.model, "Wan pipeline directory (diffusers layout: transformer/, vae/, text_encoder/, tokenizer/)")
      ->required();
  c->add_option("--adapter", args.adapter, "a PEFT LoRA adapter of the transformer, run without merging");
  c->add_option("--prompt", args.prompt, "the text to render");
  c->add_option("--prompts", args.prompts_file, "a file of prompts, one per line (prompt k uses seed + k)");
  c->add_option("--negative-prompt", args.o.negative_prompt, "what guidance steers away from (default: empty)");
  c->add_option("--steps", args.o.steps, "denoising steps (50)");
  c->add_option("--guidance-scale", args.o.guidance_scale, "classifier-free guidance (5.0; <= 1 turns it off)");
  c->add_option("--shift", args.o.shift, "noise schedule shift (default 5.0 from 720p up, 3.0 below)");
  c->add_option("--seed", args.o.seed, "noise seed (0)");
  c->add_option("--frames", args.o.frames, "frames, 1 + 4k (81)");
  c->add_option("--height", args.o.height, "height in pixels, a multiple of 16 (480)");
  c->add_option("--width", args.o.width, "width in pixels, a multiple of 16 (832)");
  c->add_option("--scheduler", args.o.scheduler, "unipc (diffusers' for Wan) or euler");
  c->add_option("--max-sequence-length", args.o.max_sequence_length, "text tokens (512)");
  c->add_option("--fps", args.fps, "frame rate of the MP4 (16)");
  c->add_option("--device", args.device, "auto (a GPU when there is one), cpu, cuda or cuda:N");
  c->add_option("--out", args.out, "the MP4 to write (several prompts: name_K.mp4)")->required();
  register_action(c, run_sample);
}

}  // namespace mm::cli
