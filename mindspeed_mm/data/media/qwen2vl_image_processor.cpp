#include "mindspeed_mm/data/media/qwen2vl_image_processor.h"

#include <algorithm>
#include <cmath>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/image_resize.h"

namespace mm::data {

std::pair<int, int> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
  if (height <= 0 || width <= 0) throw Error(cat("smart_resize: image size ", width, "x", height, " is empty"));
  if (static_cast<double>(std::max(height, width)) / std::min(height, width) > 200)
    throw Error(cat("smart_resize: aspect ratio of ", width, "x", height, " is above 200"));
  auto round_by = [&](double v) { return static_cast<int64_t>(std::nearbyint(v / factor)) * factor; };  // half-even
  int64_t h = round_by(height), w = round_by(width);
  if (h * w > max_pixels) {
    double beta = std::sqrt(static_cast<double>(height) * width / static_cast<double>(max_pixels));
    h = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(height / beta / factor)) * factor);
    w = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(width / beta / factor)) * factor);
  } else if (h * w < min_pixels) {
    double beta = std::sqrt(static_cast<double>(min_pixels) / (static_cast<double>(height) * width));
    h = static_cast<int64_t>(std::ceil(height * beta / factor)) * factor;
    w = static_cast<int64_t>(std::ceil(width * beta / factor)) * factor;
  }
  return {static_cast<int>(h), static_cast<int>(w)};
}

namespace {

// Rescale (float64 product, stored as float32) then normalize in float32, as numpy does.
void normalize_into(const Image& img, const Qwen2VLImageConfig& c, float* planes /* [3][H][W] */) {
  size_t hw = static_cast<size_t>(img.width) * img.height;
  for (size_t i = 0; i < hw; ++i)
    for (int ch = 0; ch < 3; ++ch) {
      float v = static_cast<float>(static_cast<double>(img.rgb[i * 3 + ch]) * (1.0 / 255.0));
      planes[ch * hw + i] = (v - c.mean[ch]) / c.std[ch];
    }
}

// Calls f(offset) for each run of patch_size floats in the model's patch order, where offset
// is the run's start in the [frames][3][H][W] planes: rows (t, h/m, w/m, m, m), each row
// (channel, temporal, patch_y) runs of patch_x values.
template <class F>
void for_each_patch_run(int64_t grid_t, int64_t grid_h, int64_t grid_w, const Qwen2VLImageConfig& c, F f) {
  const int T = c.temporal_patch_size, P = c.patch_size, M = c.merge_size;
  const int64_t rw = grid_w * P;
  const size_t hw = static_cast<size_t>(grid_h * P * rw);
  for (int64_t t = 0; t < grid_t; ++t)
    for (int64_t bh = 0; bh < grid_h / M; ++bh)
      for (int64_t bw = 0; bw < grid_w / M; ++bw)
        for (int mh = 0; mh < M; ++mh)
          for (int mw = 0; mw < M; ++mw) {
            int64_t y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
            for (int ch = 0; ch < 3; ++ch)
              for (int tp = 0; tp < T; ++tp)
                for (int py = 0; py < P; ++py) f(((t * T + tp) * 3 + ch) * hw + (y0 + py) * rw + x0);
          }
}

VisionPatches patchify(const std::vector<Image>& frames, const Qwen2VLImageConfig& c) {
  if (frames.empty()) throw Error("qwen2vl image processor: no frames");
  const int factor = c.patch_size * c.merge_size;
  auto [rh, rw] = smart_resize(frames[0].height, frames[0].width, factor, c.min_pixels, c.max_pixels);
  const int T = c.temporal_patch_size, P = c.patch_size;
  size_t n = frames.size();
  size_t padded = (n + T - 1) / T * T;
  size_t hw = static_cast<size_t>(rh) * rw;
  std::vector<float> planes(padded * 3 * hw);
  for (size_t f = 0; f < n; ++f) {
    Image resized = resize_bicubic(frames[f], rw, rh);
    normalize_into(resized, c, &planes[f * 3 * hw]);
  }
  for (size_t f = n; f < padded; ++f)
    std::copy(planes.begin() + (n - 1) * 3 * hw, planes.begin() + n * 3 * hw, planes.begin() + f * 3 * hw);

  VisionPatches out;
  out.grid_t = static_cast<int64_t>(padded / T);
  out.grid_h = rh / P;
  out.grid_w = rw / P;
  out.row_size = 3 * T * P * P;
  out.values.resize(static_cast<size_t>(out.rows() * out.row_size));
  float* dst = out.values.data();
  for_each_patch_run(out.grid_t, out.grid_h, out.grid_w, c, [&](size_t off) {
    dst = std::copy(planes.begin() + off, planes.begin() + off + P, dst);
  });
  return out;
}

}  // namespace

VisionPatches process_image(const Image& image, const Qwen2VLImageConfig& config) {
  return patchify(std::vector<Image>(config.temporal_patch_size, image), config);
}

VisionPatches process_video(const std::vector<Image>& frames, const Qwen2VLImageConfig& config) {
  return patchify(frames, config);
}

std::vector<float> unpatchify(const VisionPatches& p, const Qwen2VLImageConfig& c) {
  const int P = c.patch_size;
  size_t hw = static_cast<size_t>(p.grid_h * P * p.grid_w * P);
  std::vector<float> planes(static_cast<size_t>(p.grid_t * c.temporal_patch_size) * 3 * hw);
  const float* src = p.values.data();
  for_each_patch_run(p.grid_t, p.grid_h, p.grid_w, c, [&](size_t off) {
    std::copy(src, src + P, planes.begin() + off);
    src += P;
  });
  return planes;
}

}  // namespace mm::data
