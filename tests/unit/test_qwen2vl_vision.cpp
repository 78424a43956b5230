// Qwen2-VL vision tower (mindspeed_mm/models/qwen2vl/vision.h): HF parameter names and count,
// features against transformers' own Qwen2VisionTransformerPretrainedModel and Qwen2.5-VL's tower
// (tests/conformance/hf_reference.py vision) in float64 and float32 (max error printed), attention that
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

// Writes the tower, its config and the inputs to a fresh DIR, runs transformers' tower of `kind`
// on it and returns DIR (the script leaves features.safetensors there).
std::string run_reference(const char* kind, const std::string& name, Qwen2VisionTransformer& v, const at::Tensor& px,
                          const at::Tensor& g) {
  const std::string dir = mm::test::fresh_dir(name);
  std::ofstream(dir + "/vision_config.json") << v.config.to_json().dump();
  mm::st::save_safetensors(dir + "/weights.safetensors", v.named_parameters());
  mm::st::save_safetensors(dir + "/inputs.safetensors", {{"pixel_values", px}, {"grid_thw", g}});
  auto r = mm::test::run_command(std::string(MM_PYTHON) + " " + mm::test::source_dir() +
                                 "/tests/conformance/hf_reference.py vision " + dir + " " + kind);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir;
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

TEST(Qwen2VLVision, MatchesTransformers) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    Qwen2VisionTransformer v(tiny(), dtype);
    randomize(v, 11);
    at::Tensor g = grids({{1, 4, 4}, {2, 2, 6}});  // an image and a two-frame video
    const int64_t n = 16 + 24;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
    at::Tensor px = at::empty({n, tiny().patch_dim()}, at::TensorOptions().dtype(at::kDouble)).normal_(0, 1, gen).to(dtype);
    at::Tensor ours = v.forward(px, g);
    ASSERT_EQ(ours.sizes(), (at::IntArrayRef{n / 4, 24}));

    const std::string dir = run_reference("qwen2_vl",
                                          dtype == at::kDouble ? "qwen2vl_vision64" : "qwen2vl_vision32", v, px, g);
    if (HasFailure()) return;
    at::Tensor ref = mm::st::SafetensorsReader(dir + "/features.safetensors").get_copy("features");
    const double err = (ours.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
    const double scale = ref.to(at::kDouble).abs().max().item<double>();
    std::printf("qwen2vl vision vs transformers (%s): max abs error %.3g (features up to %.3g)\n",
                dtype == at::kDouble ? "float64" : "float32", err, scale);
    // HF rotates q and k in float32 and takes eager attention's softmax in float32 whatever the
    // model dtype, so even a float64 tower carries float32 rounding (measured ~1e-6 on features of
    // size ~10): 1e-6 relative there, 1e-4 relative in float32.
    EXPECT_LT(err, dtype == at::kDouble ? 1e-6 * std::max(1.0, scale) : 1e-4 * scale);
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

// ---- Qwen2.5-VL: RMSNorm, SwiGLU with biases, window attention ----

namespace {

Qwen2VLVisionConfig tiny25(std::vector<int64_t> fullatt = {1}) {
  Qwen2VLVisionConfig c;
  c.qwen2_5 = true;
  c.hidden_act = "silu";
  c.depth = 3;
  c.embed_dim = 32;
  c.num_heads = 4;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.patch_size = 4;
  c.window_size = 16;  // 16 / 4 / 2 = windows of 2 x 2 merged units
  c.fullatt_block_indexes = fullatt;
  return c;
}

}  // namespace

TEST(Qwen2_5VLVision, ParameterNamesCountAndConfigRoundTrip) {
  Qwen2VisionTransformer v(tiny25());
  std::set<std::string> names;
  for (auto& [n, p] : v.named_parameters()) names.insert(n);
  for (const char* n : {"patch_embed.proj.weight", "blocks.0.norm1.weight", "blocks.2.norm2.weight", "blocks.1.attn.qkv.bias",
                        "blocks.0.mlp.gate_proj.bias", "blocks.0.mlp.up_proj.weight", "blocks.2.mlp.down_proj.bias",
                        "merger.ln_q.weight", "merger.mlp.0.weight", "merger.mlp.2.bias"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("blocks.0.norm1.bias"));  // RMSNorm
  EXPECT_FALSE(names.count("merger.ln_q.bias"));
  EXPECT_EQ(names.size(), 3u * 12 + 1 + 5);
  EXPECT_EQ(v.num_parameters(), tiny25().num_parameters());
  // The JSON uses Qwen2_5_VLVisionConfig's names: hidden_size is the tower, out_hidden_size the merger.
  nlohmann::json j = tiny25().to_json();
  EXPECT_EQ(j.at("hidden_size"), 32);
  EXPECT_EQ(j.at("out_hidden_size"), 24);
  Qwen2VLVisionConfig back = Qwen2VLVisionConfig::from_json(j, "test", /*qwen2_5=*/true);
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.window_units(), 2);
  j["hidden_act"] = "quick_gelu";
  EXPECT_THROW(Qwen2VLVisionConfig::from_json(j, "test", true), mm::ConfigError);
  j["hidden_act"] = "silu";
  j["window_size"] = 4;  // smaller than one merged unit
  EXPECT_THROW(Qwen2VLVisionConfig::from_json(j, "test", true), mm::ConfigError);
}

TEST(Qwen2_5VLVision, WindowIndexHandComputedAndInverseIsIdentity) {
  // Image (1, 4, 6): 2 x 3 merged units, windows of 2 x 2 units -> a full window {0, 1, 3, 4}
  // and the cut-off right column {2, 5}. Video (2, 4, 4): 2 x 2 units per frame, one window each.
  WindowIndex wi = qwen2_5_vl_window_index(grids({{1, 4, 6}, {2, 4, 4}}), 2, 2);
  EXPECT_EQ(wi.index, (std::vector<int64_t>{0, 1, 3, 4, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(wi.cu_seqlens, (std::vector<int64_t>{0, 16, 24, 40, 56}));
  // Sides that divide into windows give no empty windows (transformers pads a whole extra
  // window there and drops it with unique_consecutive).
  WindowIndex exact = qwen2_5_vl_window_index(grids({{1, 8, 8}}), 2, 2);
  EXPECT_EQ(exact.cu_seqlens, (std::vector<int64_t>{0, 16, 32, 48, 64}));
  // Reorder followed by the inverse (as the tower applies them) is the identity.
  for (auto g : {grids({{1, 6, 8}, {2, 4, 4}, {1, 4, 6}}), grids({{3, 10, 14}})}) {
    WindowIndex w = qwen2_5_vl_window_index(g, 2, 2);
    at::Tensor order = at::tensor(w.index, at::kLong);
    const int64_t units = order.size(0);
    EXPECT_TRUE(at::equal(std::get<0>(order.sort()), at::arange(units, at::kLong)));  // a permutation
    at::Tensor inverse = at::empty_like(order);
    inverse.index_put_({order}, at::arange(units, at::kLong));
    at::Tensor x = at::randn({units, 5});
    EXPECT_TRUE(at::equal(x.index_select(0, order).index_select(0, inverse), x));
    EXPECT_EQ(w.cu_seqlens.back(), units * 4);
  }
}

TEST(Qwen2_5VLVision, MatchesTransformers) {
  for (auto dtype : {at::kDouble, at::kFloat}) {
    Qwen2VisionTransformer v(tiny25(), dtype);
    randomize(v, 21);
    at::Tensor g = grids({{1, 4, 6}, {2, 4, 4}, {1, 6, 8}});  // 2, 1 + 1 and 4 windows
    const int64_t n = 24 + 32 + 48;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(6);
    at::Tensor px = at::empty({n, tiny25().patch_dim()}, at::TensorOptions().dtype(at::kDouble)).normal_(0, 1, gen).to(dtype);
    at::Tensor ours = v.forward(px, g);
    ASSERT_EQ(ours.sizes(), (at::IntArrayRef{n / 4, 24}));

    const std::string dir = run_reference("qwen2_5_vl",
                                          dtype == at::kDouble ? "qwen2_5vl_vision64" : "qwen2_5vl_vision32", v, px, g);
    if (HasFailure()) return;
    mm::st::SafetensorsReader ref_file(dir + "/features.safetensors");
    WindowIndex wi = qwen2_5_vl_window_index(g, 2, 2);
    EXPECT_TRUE(at::equal(ref_file.get_copy("window_index"), at::tensor(wi.index, at::kLong)));
    EXPECT_TRUE(at::equal(ref_file.get_copy("cu_window_seqlens"), at::tensor(wi.cu_seqlens, at::kLong)));
    at::Tensor ref = ref_file.get_copy("features");
    const double err = (ours.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
    const double scale = ref.to(at::kDouble).abs().max().item<double>();
    std::printf("qwen2.5-vl vision vs transformers (%s): max abs error %.3g (features up to %.3g)\n",
                dtype == at::kDouble ? "float64" : "float32", err, scale);
    // Same bounds as Qwen2-VL (float32 rotary step in both).
    EXPECT_LT(err, dtype == at::kDouble ? 1e-6 * std::max(1.0, scale) : 1e-4 * scale);
  }
}

TEST(Qwen2_5VLVision, WindowAttentionStaysInsideWindowsAndFullBlocksInsideFrames) {
  at::Tensor g = grids({{1, 4, 6}, {1, 4, 4}});  // image 1: windows {0,1,3,4} and {2,5}; image 2: one window
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4);
  at::Tensor px = at::empty({24 + 16, tiny25().patch_dim()}).normal_(0, 1, gen);
  // Perturb merged unit 2 (patches 8..11 in processor order), in image 1's second window {2, 5}.
  at::Tensor moved = px.clone();
  moved.narrow(0, 8, 4).add_(0.5);
  at::NoGradGuard no_grad;
  {
    Qwen2VisionTransformer windows_only(tiny25({}));
    randomize(windows_only, 8);
    at::Tensor a = windows_only.forward(px, g), b = windows_only.forward(moved, g);
    for (int64_t u : {0, 1, 3, 4, 6, 7, 8, 9}) EXPECT_TRUE(at::equal(a[u], b[u])) << "unit " << u;
    EXPECT_FALSE(at::equal(a[2], b[2]));
  }
  {
    Qwen2VisionTransformer with_full(tiny25({1}));
    randomize(with_full, 8);
    at::Tensor a = with_full.forward(px, g), b = with_full.forward(moved, g);
    EXPECT_FALSE(at::equal(a[0], b[0]));  // a full-attention block mixes the whole frame
    for (int64_t u : {6, 7, 8, 9}) EXPECT_TRUE(at::equal(a[u], b[u])) << "unit " << u;  // never the next image
  }
}
