// Qwen2-VL vision tower (mindspeed_mm/models/qwen2vl/vision.h): HF parameter names and count,
// features against tests/conformance/qwen2vl_vision_reference.py (an independent transcription of
// transformers' modules, run by Debian's python3-torch) in float64 and float32 (max error printed), attention that
// never crosses an image or frame boundary, and the 2-D rotary layout.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/qwen2vl/vision.h"
#include "run_command.h"

using namespace mm::models;

namespace {

Qwen2VLVisionConfig tiny() {
  Qwen2VLVisionConfig c;
  c.depth = 2;
  c.embed_dim = 32;
  c.num_heads = 4;  // head_dim 8: rotary halves of 2 row + 2 column frequencies
  c.hidden_size = 24;
  c.mlp_ratio = 2.0;
  c.patch_size = 4;
  return c;
}

// Random weights away from init: norm weights around 1, biases and matrices non-zero.
void randomize(Qwen2VisionTransformer& v, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& [name, p] : v.named_parameters()) {
    at::Tensor noise = at::empty(p.sizes(), at::TensorOptions().dtype(at::kDouble)).normal_(0.0, 0.2, gen);
    const bool norm = name.find("norm") != std::string::npos || name.find("ln_q") != std::string::npos;
    p.copy_(norm && name.find("weight") != std::string::npos ? 1.0 + noise : noise);
  }
}

at::Tensor grids(std::vector<std::array<int64_t, 3>> g) {
  at::Tensor t = at::empty({static_cast<int64_t>(g.size()), 3}, at::kLong);
  for (size_t i = 0; i < g.size(); ++i)
    for (int k = 0; k < 3; ++k) t[i][k] = g[i][k];
  return t;
}

}  // namespace

TEST(Qwen2VLVision, ParameterNamesAndCount) {
  Qwen2VisionTransformer v(tiny());
  std::set<std::string> names;
  for (auto& [n, p] : v.named_parameters()) names.insert(n);
  for (const char* n : {"patch_embed.proj.weight", "blocks.0.norm1.weight", "blocks.1.attn.qkv.bias", "blocks.1.attn.proj.weight",
                        "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.bias", "blocks.1.norm2.bias", "merger.ln_q.weight",
                        "merger.mlp.0.weight", "merger.mlp.2.bias"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_EQ(names.size(), 2u * 12 + 1 + 6);
  EXPECT_EQ(v.num_parameters(), tiny().num_parameters());
  // Qwen2-VL-2B's tower (embed 1280, depth 32, 16 heads, merger to 1536), closed form: 665,271,296.
  Qwen2VLVisionConfig full;
  full.hidden_size = 1536;
  EXPECT_EQ(full.num_parameters(), 665271296);
}

TEST(Qwen2VLVision, MatchesIndependentReference) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    Qwen2VisionTransformer v(tiny(), dtype);
    randomize(v, 11);
    at::Tensor g = grids({{1, 4, 4}, {2, 2, 6}});  // an image and a two-frame video
    const int64_t n = 16 + 24;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
    at::Tensor px = at::empty({n, tiny().patch_dim()}, at::TensorOptions().dtype(at::kDouble)).normal_(0, 1, gen).to(dtype);
    at::Tensor ours = v.forward(px, g);
    ASSERT_EQ(ours.sizes(), (at::IntArrayRef{n / 4, 24}));

    const std::string dir = mm::test::fresh_dir(dtype == at::kDouble ? "qwen2vl_vision64" : "qwen2vl_vision32");
    std::ofstream(dir + "/vision_config.json") << tiny().to_json().dump();
    mm::st::save_safetensors(dir + "/weights.safetensors", v.named_parameters());
    mm::st::save_safetensors(dir + "/inputs.safetensors", {{"pixel_values", px}, {"grid_thw", g}});
    auto r = mm::test::run_command("/usr/bin/python3 " + mm::test::source_dir() +
                                   "/tests/conformance/qwen2vl_vision_reference.py " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    at::Tensor ref = mm::st::SafetensorsReader(dir + "/features.safetensors").get_copy("features");
    const double err = (ours.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
    const double scale = ref.to(at::kDouble).abs().max().item<double>();
    std::printf("qwen2vl vision vs reference (%s): max abs error %.3g (features up to %.3g)\n",
                dtype == at::kDouble ? "float64" : "float32", err, scale);
    // HF rotates q and k in float32 whatever the model dtype, so even a float64 tower carries
    // float32 rounding of the rotary step (measured 4.9e-7 on features of size ~10): 1e-6 there,
    // 1e-4 relative in float32.
    EXPECT_LT(err, dtype == at::kDouble ? 1e-6 * std::max(1.0, scale / 10) : 1e-4 * scale);
  }
}

TEST(Qwen2VLVision, AttentionNeverCrossesImagesOrFrames) {
  Qwen2VisionTransformer v(tiny());
  randomize(v, 3);
  at::Tensor g = grids({{1, 4, 4}, {1, 2, 4}, {2, 2, 2}});  // two images, a two-frame video
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
  at::Tensor px = at::empty({16 + 8 + 8, tiny().patch_dim()}).normal_(0, 1, gen);
  at::NoGradGuard no_grad;
  at::Tensor base = v.forward(px, g);
  // Perturb the second image: the first image's and the video's features stay bit-identical.
  at::Tensor p2 = px.clone();
  p2.narrow(0, 16, 8).add_(0.5);
  at::Tensor out2 = v.forward(p2, g);
  EXPECT_TRUE(at::equal(out2.narrow(0, 0, 4), base.narrow(0, 0, 4)));
  EXPECT_TRUE(at::equal(out2.narrow(0, 6, 2), base.narrow(0, 6, 2)));
  EXPECT_FALSE(at::equal(out2.narrow(0, 4, 2), base.narrow(0, 4, 2)));
  // Perturb the video's second frame: its first frame is untouched.
  at::Tensor p3 = px.clone();
  p3.narrow(0, 28, 4).add_(0.5);
  at::Tensor out3 = v.forward(p3, g);
  EXPECT_TRUE(at::equal(out3.narrow(0, 0, 7), base.narrow(0, 0, 7)));
  EXPECT_FALSE(at::equal(out3.narrow(0, 7, 1), base.narrow(0, 7, 1)));
  EXPECT_THROW(v.forward(px.narrow(0, 0, 30), g), mm::Error);
}

TEST(Qwen2VLVision, RotaryAnglesFollowTheMergeWindowOrder) {
  Qwen2VisionTransformer v(tiny());
  at::Tensor a = v.rotary_angles(grids({{1, 4, 4}}));  // [16, head_dim / 2 = 4]: 2 row, 2 column angles
  ASSERT_EQ(a.sizes(), (at::IntArrayRef{16, 4}));
  // Patch 5 is the second window's (row 0, column 3) patch; patch 10 is the third window's (3, 0).
  const int64_t rows[16] = {0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3};
  const int64_t cols[16] = {0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3};
  for (int i = 0; i < 16; ++i) {
    EXPECT_FLOAT_EQ(a[i][0].item<float>(), static_cast<float>(rows[i])) << i;  // frequency 1
    EXPECT_FLOAT_EQ(a[i][2].item<float>(), static_cast<float>(cols[i])) << i;
  }
}
