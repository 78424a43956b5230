// Images (mindspeed_mm/data/media/): our decoders and PIL-exact bicubic resize against
// Pillow itself (Debian's python3-pil, tests/media/pil_reference.py) on real photos and PNG
// variants from pinned Debian packages (tests/media/fetch_media.sh: opencv-doc's samples,
// libjxl-testdata's pngsuite and 16-bit / grayscale / alpha PNGs); Qwen2-VL's smart_resize on
// a table of sizes, its pixel_values and grid against transformers' own Qwen2-VL image processor
// (its Pillow backend, tests/conformance/hf_image_processor.py: bit-identical), and an exact patch
// reassembly.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/data/media/image_resize.h"
#include "mindspeed_mm/data/media/qwen2vl_image_processor.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace mm::data;
using mm::test::run_command;

namespace {

std::string media_dir() { return std::string(MM_BUILD_DIR) + "/test_media"; }

void fetch_media() {
  std::string cmd = "bash " + mm::test::source_dir() + "/tests/media/fetch_media.sh " + media_dir();
  auto r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << "`" << cmd << "` failed:\n" << r.output;
}

std::vector<std::string> images() {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(media_dir() + "/images")) v.push_back(e.path().string());
  std::sort(v.begin(), v.end());
  return v;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Mean and max absolute difference in 0..255 units.
std::pair<double, int> diff(const std::vector<uint8_t>& a, const std::string& b) {
  if (a.size() != b.size()) return {1e9, 255};
  double sum = 0;
  int mx = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    int d = std::abs(int(a[i]) - int(uint8_t(b[i])));
    sum += d;
    mx = std::max(mx, d);
  }
  return {a.empty() ? 0.0 : sum / a.size(), mx};
}

const char* kSizes[] = {"224x224", "97x53", "1000x700", "28x392", "7x5", "640x480"};

std::string pil_reference() {
  std::string out = media_dir() + "/pil";
  std::string cmd = "/usr/bin/python3 " + mm::test::source_dir() + "/tests/media/pil_reference.py " + out;
  auto list = images();
  // The first image also gets lossless WebP and BMP copies: a photo.
  std::rotate(list.begin(), std::find_if(list.begin(), list.end(), [](const std::string& p) {
                return p.find("baboon") != std::string::npos; }), list.end());
  for (const auto& p : list) cmd += " " + p;
  cmd += " --";
  for (const char* s : kSizes) cmd += std::string(" ") + s;
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << "`" << cmd << "` failed (needs python3-pil):\n" << r.output;
  return out;
}

}  // namespace

TEST(Image, DecodeAndBicubicResizeMatchPillow) {
  fetch_media();
  if (HasFatalFailure()) return;
  std::string ref = pil_reference();
  size_t compared = 0;
  double worst_mae = 0;
  int worst_max = 0;
  for (const auto& path : images()) {
    std::string name = fs::path(path).filename().string();
    Image img = load_image(path);
    auto [mae, mx] = diff(img.rgb, read_bytes(ref + "/" + name + ".rgb"));
    EXPECT_EQ(mx, 0) << name << ": decode differs from Pillow's (mean " << mae << ")";
    for (const char* s : kSizes) {
      int w = 0, h = 0;
      std::sscanf(s, "%dx%d", &w, &h);
      Image r = resize_bicubic(img, w, h);
      auto [rmae, rmx] = diff(r.rgb, read_bytes(ref + "/" + name + "." + s + ".rgb"));
      EXPECT_LE(rmae, 1.0) << name << " -> " << s << ": mean abs diff " << rmae << " (max " << rmx << ")";
      worst_mae = std::max(worst_mae, rmae);
      worst_max = std::max(worst_max, rmx);
      ++compared;
    }
  }
  std::cout << "[image] " << compared << " resizes compared with Pillow: worst mean abs diff " << worst_mae
            << ", worst max " << worst_max << " (0..255)\n";
  EXPECT_GE(compared, 18u * 6u);
  // WebP (lossless) and BMP written by Pillow decode to the same pixels.
  std::string base = ref + "/baboon.jpg";
  for (const char* ext : {".webp", ".bmp"}) {
    auto [mae, mx] = diff(load_image(base + ext).rgb, read_bytes(base + ".rgb"));
    EXPECT_EQ(mx, 0) << ext;
  }
}

TEST(Image, CorruptFilesAreClearErrors) {
  fetch_media();
  if (HasFatalFailure()) return;
  auto error_of = [](const std::string& bytes) -> std::string {
    try {
      decode_image(bytes, "sample 7 (x.img)");
    } catch (const mm::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string jpg = read_bytes(media_dir() + "/images/baboon.jpg");
  std::string png = read_bytes(media_dir() + "/images/graf1.png");
  EXPECT_NE(error_of(png.substr(0, png.size() / 2)).find("sample 7 (x.img): corrupt PNG"), std::string::npos);
  EXPECT_NE(error_of("").find("empty file"), std::string::npos);
  EXPECT_NE(error_of("GIF89a....").find("not a JPEG, PNG, WebP or BMP image"), std::string::npos);
  EXPECT_NE(error_of(jpg.substr(0, 300)).find("corrupt JPEG"), std::string::npos);
  EXPECT_NE(error_of(std::string("RIFF\x10\0\0\0WEBPVP8 garbage", 23)).find("corrupt WebP"), std::string::npos);
  EXPECT_NE(error_of("BM\x36\0\0\0\0\0\0\0\x36\0\0\0\x28\0\0\0").find("truncated BMP"), std::string::npos);
  // A truncated JPEG whose header survives decodes what is there (as PIL with
  // LOAD_TRUNCATED_IMAGES), or errors: never a crash.
  try {
    decode_image(jpg.substr(0, jpg.size() * 2 / 3), "half.jpg");
  } catch (const mm::Error&) {
  }
  try {
    decode_image(png, "big.png", /*max_pixels=*/1000);
    FAIL() << "no error";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than the 1000-pixel limit"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_image(media_dir() + "/images/no_such.png"), mm::Error);
}

TEST(Image, SmartResizeTable) {
  struct Row {
    int h, w, want_h, want_w;
  };
  // Worked through transformers' smart_resize (factor 28, min 56*56, max 28*28*1280):
  // rounding to the nearest multiple with Python's half-even rule, the pixel-budget branches,
  // tiny and extreme shapes.
  const Row rows[] = {
      {224, 224, 224, 224},       // already a multiple
      {480, 640, 476, 644},       // round(17.14)=17, round(22.86)=23
      {1080, 1920, 728, 1316},    // over 1003520 pixels: floor after scaling by beta
      {4000, 3000, 1148, 840},    // huge photo
      {10, 10, 56, 56},           // tiny: up to min_pixels
      {28, 5600, 28, 5600},       // 1:200, exactly the limit; 156800 pixels fit
      {14, 14, 56, 56},           // round(0.5) = 0 (half-even), then min_pixels
      {42, 42, 56, 56},           // round(1.5) = 2
      {70, 70, 56, 56},           // round(2.5) = 2
      {32, 10, 112, 56},          // tall and tiny: round(10/28) = 0, then min_pixels
  };
  for (const auto& r : rows) {
    auto [h, w] = smart_resize(r.h, r.w, 28, 56 * 56, 28 * 28 * 1280);
    EXPECT_EQ(h, r.want_h) << r.h << "x" << r.w;
    EXPECT_EQ(w, r.want_w) << r.h << "x" << r.w;
    EXPECT_EQ(h % 28, 0);
    EXPECT_EQ(w % 28, 0);
  }
  EXPECT_THROW(smart_resize(10, 2100, 28, 56 * 56, 28 * 28 * 1280), mm::Error);  // 1:210
}

TEST(Image, Qwen2VLPixelValuesMatchTransformersRecipe) {
  fetch_media();
  if (HasFatalFailure()) return;
  struct Case {
    const char* image;
    int64_t min_pixels, max_pixels;
  };
  const Case cases[] = {{"baboon.jpg", 56 * 56, 28 * 28 * 1280},
                        {"tmshre_riaphotographs_alpha.png", 56 * 56, 28 * 28 * 256},
                        {"ct1n0g04.png", 56 * 56, 28 * 28 * 1280},
                        {"graf1.png", 256 * 28 * 28, 28 * 28 * 64}};
  for (const auto& c : cases) {
    std::string path = media_dir() + "/images/" + c.image;
    std::string prefix = media_dir() + "/qwen2vl_" + c.image;
    auto r = run_command(std::string(MM_PYTHON) + " " + mm::test::source_dir() + "/tests/conformance/hf_image_processor.py " +
                         prefix + " " + path + " " + std::to_string(c.min_pixels) + " " + std::to_string(c.max_pixels));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    Qwen2VLImageConfig cfg;
    cfg.min_pixels = c.min_pixels;
    cfg.max_pixels = c.max_pixels;
    VisionPatches p = process_image(load_image(path), cfg);
    int64_t t = 0, h = 0, w = 0;
    std::istringstream(mm::test::read_file(prefix + ".txt")) >> t >> h >> w;
    EXPECT_EQ(p.grid_t, t) << c.image;
    EXPECT_EQ(p.grid_h, h) << c.image;
    EXPECT_EQ(p.grid_w, w) << c.image;
    std::string ref = read_bytes(prefix + ".f32");
    ASSERT_EQ(ref.size(), p.values.size() * 4) << c.image;
    float max_err = 0;
    for (size_t i = 0; i < p.values.size(); ++i) {
      float v;
      std::memcpy(&v, ref.data() + 4 * i, 4);
      max_err = std::max(max_err, std::abs(v - p.values[i]));
    }
    std::cout << "[qwen2vl] " << c.image << ": grid " << t << "x" << h << "x" << w << ", max abs diff " << max_err << "\n";
    EXPECT_EQ(max_err, 0.0f) << c.image;
  }
}

TEST(Image, PatchesReassembleExactly) {
  // A synthetic image with every pixel distinct: unpatchify(patchify(x)) must give back the
  // normalized planes exactly, for a still image and a 3-frame video (padded to 4 frames).
  Image img(56 * 3, 28 * 5);
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = static_cast<uint8_t>((i * 7919) % 251);
  Qwen2VLImageConfig cfg;
  cfg.min_pixels = 1;
  VisionPatches p = process_image(img, cfg);
  EXPECT_EQ(p.grid_t, 1);
  EXPECT_EQ(p.grid_h, 10);
  EXPECT_EQ(p.grid_w, 12);
  EXPECT_EQ(p.row_size, 3 * 2 * 14 * 14);
  EXPECT_EQ(p.merged_tokens(2), 30);
  auto planes = unpatchify(p, cfg);
  size_t hw = size_t(img.width) * img.height;
  ASSERT_EQ(planes.size(), 2 * 3 * hw);
  for (size_t i = 0; i < hw; ++i)
    for (int c = 0; c < 3; ++c) {
      float want = (static_cast<float>(img.rgb[i * 3 + c] * (1.0 / 255.0)) - cfg.mean[c]) / cfg.std[c];
      ASSERT_EQ(planes[c * hw + i], want);
      ASSERT_EQ(planes[(3 + c) * hw + i], want);  // the temporal copy
    }
  std::vector<Image> frames(3, img);
  for (int f = 0; f < 3; ++f) frames[f].rgb[0] = static_cast<uint8_t>(f * 50);
  VisionPatches v = process_video(frames, cfg);
  EXPECT_EQ(v.grid_t, 2);
  auto vp = unpatchify(v, cfg);
  EXPECT_EQ(vp[3 * 3 * hw], vp[2 * 3 * hw]);  // frame 3 repeats frame 2
  EXPECT_NE(vp[0], vp[3 * hw]);
}
