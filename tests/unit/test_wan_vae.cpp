// Wan2.1's causal 3-D VAE (mindspeed_mm/models/wan/wan_vae.h) against PyPI's diffusers
// (tests/conformance/diffusers_reference.py wan_vae): a tiny random AutoencoderKLWan saved by
// diffusers loads into mm by its names; the encoder's moments and the chunked decode equal
// diffusers' in fp32 (1e-4 relative, printed); running a clip whole equals running it in chunks
// with the feature cache; decode_frames streams 1 then 4 frames per latent frame; latent
// normalisation; bad clips and configs are clear errors; and `mm train` of a tiny VAE (model.id
// wan_vae, objective vae) on moving Fashion-MNIST clips (data.dataset videos) lowers the
// reconstruction error and exports a directory that loads back.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "hf_reference.h"
#include "metrics_file.h"
#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/wan/wan_vae.h"
#include "mindspeed_mm/data/media/image.h"
#include "run_command.h"

using namespace mm::models;

namespace {

const nlohmann::json kTiny = {{"base_dim", 8},
                              {"z_dim", 4},
                              {"dim_mult", {1, 2, 2, 2}},
                              {"num_res_blocks", 1},
                              {"temperal_downsample", {false, true, true}},
                              {"latents_mean", {0.1, -0.2, 0.3, 0.0}},
                              {"latents_std", {1.5, 0.5, 2.0, 1.0}}};

std::string python(const std::string& args) {
  const std::string cmd =
      std::string(MM_PYTHON) + " " + mm::test::source_dir() + "/tests/conformance/diffusers_reference.py " + args;
  auto r = mm::test::run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  return r.output;
}

}  // namespace

TEST(WanVAE, EncodeAndDecodeEqualDiffusers) {
  const std::string dir = mm::test::fresh_dir("wan_vae_conformance");
  mm::test::write_file(dir + "/wanted.json", kTiny.dump());
  python("wan_vae create " + dir + "/vae " + dir + "/wanted.json --seed 3");
  auto vae = load_wan_vae(dir + "/vae");  // every tensor by its diffusers name and shape
  at::manual_seed(4);
  const at::Tensor video = at::rand({1, 3, 9, 16, 16}) * 2 - 1;
  const at::Tensor latents = at::randn({1, 4, 3, 2, 2});
  mm::st::save_safetensors(dir + "/vae/inputs.safetensors", {{"video", video}, {"latents", latents}});
  python("wan_vae run " + dir + "/vae");
  mm::st::HFWeights want(dir + "/vae/outputs.safetensors");

  at::NoGradGuard no_grad;
  const at::Tensor moments = vae->encode_moments(video);
  ASSERT_EQ(moments.sizes(), want.get("moments").sizes());
  const double enc = mm::test::rel_err(moments, want.get("moments"));
  const at::Tensor decoded = vae->decode(latents);
  ASSERT_EQ(decoded.sizes(), (std::vector<int64_t>{1, 3, 9, 16, 16}));
  const double dec = mm::test::rel_err(decoded, want.get("decoded"));
  EXPECT_GT(decoded.abs().lt(0.99).to(at::kFloat).mean().item<double>(), 0.9);  // not all clamped: a real comparison
  EXPECT_LT(enc, 1e-4);
  EXPECT_LT(dec, 1e-4);
  std::printf("wan vae: max relative difference from diffusers: encoder moments %.2e, decoded video %.2e\n", enc, dec);

  // The whole clip at once equals the chunks with the feature cache.
  const double enc_whole = mm::test::rel_err(vae->encode_moments(video, /*chunked=*/false), moments);
  const double dec_whole = mm::test::rel_err(vae->decode(latents, /*chunked=*/false), decoded);
  EXPECT_LT(enc_whole, 1e-5);
  EXPECT_LT(dec_whole, 1e-5);
  std::printf("wan vae: whole clip against chunks with the cache: encode %.2e, decode %.2e\n", enc_whole, dec_whole);

  // Streaming: the first latent frame gives one frame, each later one four.
  std::vector<int64_t> counts;
  vae->decode_frames(latents, [&](const at::Tensor& f) { counts.push_back(f.size(2)); });
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 4, 4}));

  // Normalised latents: (mean - latents_mean) / latents_std, and back.
  const at::Tensor z = vae->encode(video);
  const at::Tensor mean = moments.narrow(1, 0, 4);
  EXPECT_TRUE(at::allclose(z[0][1], (mean[0][1] + 0.2) / 0.5, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(vae->denormalize(z), mean, 1e-5, 1e-5));
}

// FLOPs (training_flops, MFU) as PyTorch's FlopCounterMode counts them on diffusers' model: every
// convolution of the encoder and the decoder exactly, and the mid blocks' attention.
TEST(WanVAE, FlopsEqualPyTorchFlopCounter) {
  const std::string dir = mm::test::fresh_dir("wan_vae_flops");
  mm::test::write_file(dir + "/wanted.json", kTiny.dump());
  python("wan_vae create " + dir + "/vae " + dir + "/wanted.json --seed 3");
  auto vae = load_wan_vae(dir + "/vae");
  const std::vector<std::pair<std::string, std::string>> shapes = {{"9,16,16", "3,2,2"}, {"1,32,48", "1,4,6"}};
  std::string args;
  for (const auto& [video, latent] : shapes) args += " " + video + " " + latent;
  const std::string out = python("wan_vae flops " + dir + "/vae" + args);
  const nlohmann::json counted = nlohmann::json::parse(out.substr(out.rfind('[')));
  ASSERT_EQ(counted.size(), shapes.size()) << out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [video, latent] = shapes[i];
    const nlohmann::json& want = counted[i];
    int64_t t, h, w, lt, lh, lw;
    std::sscanf(video.c_str(), "%ld,%ld,%ld", &t, &h, &w);
    std::sscanf(latent.c_str(), "%ld,%ld,%ld", &lt, &lh, &lw);
    // FlopCounterMode has no formula for the CPU's flash attention kernel, so the mid blocks'
    // q k^T and probs v (4 (hw)^2 C per latent frame, C = 16 here) are added to its figures.
    const double attention = 4.0 * static_cast<double>(lh * lw) * static_cast<double>(lh * lw) * 16 * static_cast<double>(lt);
    EXPECT_DOUBLE_EQ(vae->encode_flops(t, h, w), want["encode"].get<double>() + attention) << video;
    EXPECT_DOUBLE_EQ(vae->decode_flops(lt, lh, lw), want["decode"].get<double>() + attention) << latent;
    std::printf("wan vae flops of a %s clip: encode %.0f, decode %.0f (FlopCounterMode: %.0f, %.0f)\n", video.c_str(),
                vae->encode_flops(t, h, w), vae->decode_flops(lt, lh, lw), want["encode"].get<double>(),
                want["decode"].get<double>());
  }
  // A training step's: three times the forward (encode, then decode of its latents) per clip.
  mm::data::Batch b;
  b.set(mm::data::kVideo, at::zeros({2, 3, 9, 16, 16}));
  EXPECT_DOUBLE_EQ(vae->training_flops(b), 3 * 2 * (vae->encode_flops(9, 16, 16) + vae->decode_flops(3, 2, 2)));
}

// The original Wan2.1_VAE.pth names: mm writes a torch.save state dict under them, diffusers' own
// converter (convert_wan_vae_to_diffusers, which hard-codes Wan2.1's 4 levels of 2 resnets) turns
// it back into exactly the diffusers tensors, and mm loads the .pth to the same decode.
TEST(WanVAE, OriginalCheckpointNamesMatchDiffusersConverter) {
  const std::string dir = mm::test::fresh_dir("wan_vae_original");
  nlohmann::json cfg = {{"base_dim", 8},
                        {"z_dim", 4},
                        {"dim_mult", {1, 2, 4, 4}},
                        {"num_res_blocks", 2},
                        {"temperal_downsample", {false, true, true}},
                        {"latents_mean", {0.0, 0.0, 0.0, 0.0}},
                        {"latents_std", {1.0, 1.0, 1.0, 1.0}}};
  mm::test::write_file(dir + "/wanted.json", cfg.dump());
  python("wan_vae create " + dir + "/vae " + dir + "/wanted.json --seed 5");
  auto vae = load_wan_vae(dir + "/vae");
  std::vector<std::pair<std::string, at::Tensor>> original;
  for (auto& [name, p] : vae->named_parameters()) {
    original.emplace_back(wan_vae_original_name(name, 2), p);
    EXPECT_EQ(wan_vae_diffusers_name(original.back().first, 2), name);
    EXPECT_EQ(wan_vae_diffusers_name(name, 2), name);  // diffusers names pass through
  }
  std::filesystem::create_directories(dir + "/orig");
  mm::st::save_torch_state_dict(dir + "/orig/Wan2.1_VAE.pth", original);
  std::filesystem::copy_file(dir + "/vae/config.json", dir + "/orig/config.json");
  python("wan_vae from_original " + dir + "/orig/Wan2.1_VAE.pth " + dir + "/converted.safetensors");
  const mm::st::HFWeights want(dir + "/vae"), got(dir + "/converted.safetensors");
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  ASSERT_EQ(sorted(got.keys()), sorted(want.keys()));
  for (const auto& k : want.keys()) EXPECT_TRUE(got.get(k).equal(want.get(k))) << k;
  std::printf("wan vae: %zu original names convert to diffusers' by diffusers' converter\n", original.size());

  auto from_pth = load_wan_vae(dir + "/orig");
  at::NoGradGuard no_grad;
  at::manual_seed(6);
  const at::Tensor z = at::randn({1, 4, 2, 2, 2});
  EXPECT_TRUE(from_pth->decode(z).equal(vae->decode(z)));
  // The bare .pth gets Wan2.1's full-size configuration: these tiny tensors do not fit it.
  try {
    load_wan_vae(dir + "/orig/Wan2.1_VAE.pth");
    ADD_FAILURE() << "a tiny .pth loaded as Wan2.1's VAE";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Wan2.1_VAE.pth' does not fit the model: shape mismatch"), std::string::npos)
        << e.what();
  }
  std::filesystem::create_directories(dir + "/junk");
  mm::test::write_file(dir + "/junk/Wan2.1_VAE.pth", "not a checkpoint");
  std::filesystem::copy_file(dir + "/vae/config.json", dir + "/junk/config.json");
  try {
    load_wan_vae(dir + "/junk");
    ADD_FAILURE() << "junk loaded";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("junk/Wan2.1_VAE.pth: not a PyTorch checkpoint libtorch can read"),
              std::string::npos) << e.what();
  }
}

TEST(WanVAE, BadClipsAndConfigsAreClearErrors) {
  WanVAEConfig c = WanVAEConfig::from_json(kTiny, "tiny");
  EXPECT_EQ(c.temporal_factor(), 4);
  EXPECT_EQ(c.spatial_factor(), 8);
  AutoencoderKLWan vae(c);
  at::NoGradGuard no_grad;
  auto expect_error = [](const std::function<void()>& f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no error, wanted: " << want;
    } catch (const mm::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error([&] { vae.encode(at::zeros({1, 3, 8, 16, 16})); }, "8 frames: a clip must have 1 + 4k frames");
  expect_error([&] { vae.encode(at::zeros({1, 3, 5, 12, 16})); }, "12x16 pixels do not divide by the spatial compression 8");
  expect_error([&] { vae.encode(at::zeros({1, 4, 5, 16, 16})); }, "a video must be [B, 3, frames, height, width]");
  expect_error([&] { vae.decode(at::zeros({1, 3, 2, 2, 2})); }, "latents must be [B, 4, frames, height, width]");
  nlohmann::json j = kTiny;
  j["is_residual"] = true;
  expect_error([&] { WanVAEConfig::from_json(j, "wan22/config.json"); }, "is_residual is set: only Wan2.1's VAE");
  j = kTiny;
  j["latents_std"] = {1.0, 2.0};
  expect_error([&] { WanVAEConfig::from_json(j, "vae/config.json"); }, "latents_std must hold z_dim = 4 values (got 2)");
}

TEST(WanVAETrain, TinyVaeLearnsMovingFashionMnistClips) {
  const std::string dir = mm::test::fresh_dir("wan_vae_train");
  const std::string mm = mm::test::mm_binary();
  auto g = mm::test::run_command(mm + " data moving-fashion-mnist --out " + dir + "/data --train 48 --test 8 --size 32 "
                                 "--frames 5 --speed 1");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  // One record that is not a video: skipped, named and counted.
  std::string jsonl = mm::test::read_file(dir + "/data/train.jsonl");
  mm::test::write_file(dir + "/data/clips/broken.mp4", "not a video");
  mm::test::write_file(dir + "/data/train.jsonl", "{\"path\": \"clips/broken.mp4\"}\n" + jsonl);
  mm::test::write_file(dir + "/vae.yaml",
                       "data:\n  dataset: videos\n  paths: [" + dir + "/data/train.jsonl]\n  val_fraction: 0.15\n"
                       "  video: {height: 32, width: 32, frames: 5, fps: 16}\n  max_bad_fraction: 0.2\n"
                       "model:\n  id: wan_vae\n  config:\n    base_dim: 8\n    z_dim: 4\n    dim_mult: [1, 2, 2, 2]\n"
                       "    num_res_blocks: 1\n    temperal_downsample: [false, true, true]\n"
                       "training:\n  train_iters: 40\n  micro_batch_size: 4\n  optimizer: {lr: 0.002}\n"
                       "  lr_schedule: {id: constant}\n  eval_interval: 20\n  eval_iters: 0\n  vae: {kl_weight: 1.0e-6}\n"
                       "  export_dir: " + dir + "/vae\n  metrics_file: " + dir + "/m.jsonl\n"
                       "tools:\n  progress: lines\n  tensorboard_dir: " + dir + "/tb\n");
  auto t = mm::test::run_command(mm + " train " + dir + "/vae.yaml");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("skipped " + dir + "/data/train.jsonl:1: video:"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("PSNR"), std::string::npos) << t.output;
  const auto val = mm::test::metrics_val_losses(dir + "/m.jsonl");
  ASSERT_GE(val.size(), 2u);
  EXPECT_LT(val.back(), 0.6 * val.front()) << t.output;  // reconstruction error falls
  std::printf("tiny wan vae: validation reconstruction L1 %.4f -> %.4f\n", val.front(), val.back());
  // TensorBoard: at each validation, the first clip's 5 frames over their reconstruction, which
  // comes closer to them as training goes (read back by PyPI's tensorboard).
  {
    const std::string cmd = std::string(MM_PYTHON) + " " + mm::test::source_dir() +
                            "/tests/conformance/tensorboard_reference.py read " + dir + "/tb " + dir + "/tb.json";
    auto r = mm::test::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto tb = nlohmann::json::parse(mm::test::read_file(dir + "/tb.json"));
    const auto& sheets = tb["images"]["samples/reconstruction"];
    ASSERT_EQ(sheets.size(), 3u) << tb.dump().substr(0, 500);  // before training, at 20, at 40
    EXPECT_EQ(tb["scalars"]["validation/psnr"].size(), 3u);
    std::vector<double> errors;
    for (const auto& s : sheets) {
      EXPECT_EQ(s[1], 5 * 32 + 4 * 2);
      EXPECT_EQ(s[2], 2 * 32 + 2);
      const mm::data::Image im = mm::data::load_image(s[3].get<std::string>());
      double e = 0;
      for (int y = 0; y < 32; ++y)
        for (int x = 0; x < im.width * 3; ++x) e += std::abs(int(im.row(y)[x]) - int(im.row(y + 34)[x]));
      errors.push_back(e / (32.0 * im.width * 3));
    }
    EXPECT_LT(errors.back(), 0.6 * errors.front()) << "mean pixel error " << errors.front() << " -> " << errors.back();
    std::printf("tiny wan vae: TensorBoard reconstruction sheets, mean pixel error %.1f -> %.1f\n", errors.front(),
                errors.back());
  }
  // The export is a diffusers-style vae/ directory that loads back.
  auto vae = load_wan_vae(dir + "/vae");
  EXPECT_EQ(vae->config.z_dim, 4);
  // data.val_paths: validation clips from their own file, every data.paths record trains.
  auto v = mm::test::run_command(mm + " train " + dir + "/vae.yaml training.train_iters=2 training.export_dir= "
                                 "training.metrics_file= data.val_paths=[" + dir + "/data/test.jsonl]");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("data: 49 training and 8 validation clips"), std::string::npos) << v.output;
}
