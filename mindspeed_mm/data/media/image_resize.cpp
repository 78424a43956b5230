// Ported from Pillow's libImaging/Resample.c (precompute_coeffs, normalize_coeffs_8bpc,
// ImagingResampleHorizontal_8bpc / Vertical_8bpc, ImagingResampleInner).
#include "mindspeed_mm/data/media/image_resize.h"

#include <cmath>
#include <vector>

#include "mindspeed_mm/core/errors.h"

namespace mm::data {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // per output: xmin, count
  std::vector<int32_t> k;   // per output: ksize fixed-point weights
};

Coeffs precompute(int in_size, int out_size) {
  constexpr double support_base = 2.0;
  double in0 = 0.0, in1 = in_size;
  double scale = (in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  double support = support_base * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(out_size * 2);
  std::vector<double> pre(static_cast<size_t>(out_size) * c.ksize, 0.0);
  for (int xx = 0; xx < out_size; ++xx) {
    double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0, ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double* k = &pre[static_cast<size_t>(xx) * c.ksize];
    for (int x = 0; x < xmax; ++x) {
      double w = bicubic((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x)
      if (ww != 0.0) k[x] /= ww;
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
  c.k.resize(pre.size());
  for (size_t i = 0; i < pre.size(); ++i)
    c.k[i] = pre[i] < 0 ? static_cast<int32_t>(-0.5 + pre[i] * (1 << kPrecisionBits))
                        : static_cast<int32_t>(0.5 + pre[i] * (1 << kPrecisionBits));
  return c;
}

uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

// Rows [y0, y0 + out.height) of `in`, resampled horizontally into `out`.
void horizontal(const Image& in, int y0, const Coeffs& c, Image& out) {
  for (int y = 0; y < out.height; ++y) {
    const uint8_t* src = in.row(y + y0);
    uint8_t* dst = out.row(y);
    for (int xx = 0; xx < out.width; ++xx) {
      int xmin = c.bounds[xx * 2], xmax = c.bounds[xx * 2 + 1];
      const int32_t* k = &c.k[static_cast<size_t>(xx) * c.ksize];
      for (int ch = 0; ch < 3; ++ch) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < xmax; ++x) ss += src[(x + xmin) * 3 + ch] * k[x];
        dst[xx * 3 + ch] = clip8(ss);
      }
    }
  }
}

void vertical(const Image& in, const Coeffs& c, int shift, Image& out) {
  for (int yy = 0; yy < out.height; ++yy) {
    int ymin = c.bounds[yy * 2] - shift, ymax = c.bounds[yy * 2 + 1];
    const int32_t* k = &c.k[static_cast<size_t>(yy) * c.ksize];
    uint8_t* dst = out.row(yy);
    for (int xx = 0; xx < out.width * 3; ++xx) {
      int32_t ss = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < ymax; ++y) ss += in.row(y + ymin)[xx] * k[y];
      dst[xx] = clip8(ss);
    }
  }
}

}  // namespace

Image resize_bicubic(const Image& in, int out_w, int out_h) {
  if (out_w <= 0 || out_h <= 0) throw Error(cat("resize: target size ", out_w, "x", out_h, " must be positive"));
  if (in.width <= 0 || in.height <= 0) throw Error("resize: empty input image");
  if (out_w == in.width && out_h == in.height) return in;
  bool need_h = out_w != in.width, need_v = out_h != in.height;
  Coeffs cv = precompute(in.height, out_h);
  int ybox_first = cv.bounds[0];
  int ybox_last = cv.bounds[out_h * 2 - 2] + cv.bounds[out_h * 2 - 1];
  Image cur;
  const Image* src = &in;
  int shift = 0;
  if (need_h) {
    Coeffs ch = precompute(in.width, out_w);
    // Only the rows the vertical pass reads (all of them when it does not run).
    int y0 = need_v ? ybox_first : 0, rows = need_v ? ybox_last - ybox_first : in.height;
    cur = Image(out_w, rows);
    horizontal(in, y0, ch, cur);
    src = &cur;
    shift = need_v ? ybox_first : 0;
  }
  if (!need_v) return need_h ? cur : in;
  Image out(out_w, out_h);
  vertical(*src, cv, shift, out);
  return out;
}

Image center_crop(const Image& in, int width, int height) {
  if (width <= 0 || height <= 0 || width > in.width || height > in.height)
    throw Error(cat("center_crop: ", width, "x", height, " does not fit in ", in.width, "x", in.height));
  // transformers' center_crop: top = (h - crop_h) // 2, left = (w - crop_w) // 2.
  int top = (in.height - height) / 2, left = (in.width - width) / 2;
  Image out(width, height);
  for (int y = 0; y < height; ++y)
    std::copy(in.row(y + top) + left * 3, in.row(y + top) + (left + width) * 3, out.row(y));
  return out;
}

}  // namespace mm::data
