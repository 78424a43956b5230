// The Wan VAE's FLOPs: the clip's shape walked through the encoder and the decoder as
// wan_vae.cpp runs them, counting each convolution's 2 x C_out x C_in x kernel per output voxel
// and the mid blocks' per-frame attention (q k^T and probs v: 4 x (hw)^2 x C), the convention of
// PyTorch's FlopCounterMode (tests/unit/test_wan_vae.cpp compares with it on diffusers' model).
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/wan/wan_vae.h"

namespace mm::models {

namespace {

struct Shape {
  int64_t c, t, h, w;
  double voxels() const { return static_cast<double>(t) * static_cast<double>(h) * static_cast<double>(w); }
};

// A causal convolution keeps frames (stride 1, the front padding) and pixels (padding k / 2).
double conv(const WanCausalConv3d& m, Shape& s) {
  const auto& k = m.kernel;
  const int64_t out = m.weight.size(0);
  if (m.stride[0] > 1) s.t = (s.t - k[0]) / m.stride[0] + 1;  // the temporal downsampling: no padding
  const double f = 2.0 * static_cast<double>(out * s.c * k[0] * k[1] * k[2]) * s.voxels();
  s.c = out;
  return f;
}

double residual(const WanResidualBlock& b, Shape& s) {
  double f = 0;
  if (b.shortcut) {
    Shape x = s;
    f += conv(*b.shortcut, x);
  }
  f += conv(*b.conv1, s);
  return f + conv(*b.conv2, s);
}

double attention(const Shape& s) {
  const double hw = static_cast<double>(s.h * s.w), c = static_cast<double>(s.c), t = static_cast<double>(s.t);
  return t * (2 * hw * 3 * c * c + 4 * hw * hw * c + 2 * hw * c * c);  // qkv, attention, proj
}

double mid(const WanMidBlock& m, Shape& s) {
  double f = residual(*m.res0, s);
  f += attention(s);
  return f + residual(*m.res1, s);
}

double resample(const WanResample& r, Shape& s) {
  double f = 0;
  const int64_t out = r.conv_weight.size(0), in = r.conv_weight.size(1);
  if (r.mode == "upsample3d") {
    // The frames after the first go through time_conv (C -> 2C), each then two frames.
    Shape rest{s.c, s.t - 1, s.h, s.w};
    if (rest.t > 0) f += conv(*r.time_conv, rest);
    s.t = 1 + 2 * (s.t - 1);
  }
  if (r.mode.rfind("upsample", 0) == 0) {
    s.h *= 2;
    s.w *= 2;
    f += 2.0 * static_cast<double>(out * in * 9) * s.voxels();
  } else {
    s.h /= 2;
    s.w /= 2;
    f += 2.0 * static_cast<double>(out * in * 9) * s.voxels();
  }
  s.c = out;
  if (r.mode == "downsample3d" && s.t > 1) {
    // The first frame passes; the rest, behind the previous chunk's last frame, at stride 2.
    Shape rest{s.c, s.t, s.h, s.w};
    f += conv(*r.time_conv, rest);
    s.t = 1 + rest.t;
  }
  return f;
}

}  // namespace

double AutoencoderKLWan::encode_flops(int64_t frames, int64_t height, int64_t width) const {
  Shape s{config.in_channels, frames, height, width};
  double f = conv(*encoder->conv_in, s);
  for (const auto& m : encoder->down) {
    if (auto* r = dynamic_cast<const WanResidualBlock*>(m.get())) f += residual(*r, s);
    else f += resample(*static_cast<const WanResample*>(m.get()), s);
  }
  f += mid(*encoder->mid, s);
  f += conv(*encoder->conv_out, s);
  return f + conv(*quant_conv, s);
}

double AutoencoderKLWan::decode_flops(int64_t frames, int64_t height, int64_t width) const {
  Shape s{config.z_dim, frames, height, width};
  double f = conv(*post_quant_conv, s);
  f += conv(*decoder->conv_in, s);
  f += mid(*decoder->mid, s);
  for (size_t i = 0; i < decoder->up_res.size(); ++i) {
    for (const auto& r : decoder->up_res[i]) f += residual(*r, s);
    if (decoder->up_sample[i]) f += resample(*decoder->up_sample[i], s);
  }
  return f + conv(*decoder->conv_out, s);
}

double AutoencoderKLWan::training_flops(const data::Batch& host) const {
  const at::Tensor& v = host[data::kVideo];
  if (!v.defined() || v.dim() != 5) return 0;
  const int64_t T = v.size(2), H = v.size(3), W = v.size(4), tf = config.temporal_factor(), sf = config.spatial_factor();
  const double per_clip = encode_flops(T, H, W) + decode_flops(1 + (T - 1) / tf, H / sf, W / sf);
  return 3.0 * per_clip * static_cast<double>(v.size(0));
}

std::string AutoencoderKLWan::cost_summary(int64_t) const {
  const double f = 3.0 * (encode_flops(17, 256, 256) + decode_flops(1 + 16 / config.temporal_factor(),
                                                                   256 / config.spatial_factor(),
                                                                   256 / config.spatial_factor()));
  return cat(log::fixed(f / 1e9, 1), " GFLOP per 17-frame 256x256 clip (encode + decode, forward and backward)");
}

}  // namespace mm::models
