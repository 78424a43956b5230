#include "mindspeed_mm/models/wan/wan_vae.h"

#include <tuple>
#include <filesystem>
#include <optional>

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/models/common/attention.h"

namespace mm::models {

// ---------------------------------------------------------------------------------------------
// Config

int64_t WanVAEConfig::temporal_factor() const {
  int64_t f = 1;
  for (bool t : temperal_downsample) f *= t ? 2 : 1;
  return f;
}

WanVAEConfig WanVAEConfig::from_json(const nlohmann::json& j, const std::string& source) {
  WanVAEConfig c;
  auto fail = [&](const std::string& key, const std::string& what) {
    throw ConfigError(cat("config: ", key, " ", what, " in ", source));
  };
  auto integer = [&](const char* key, int64_t& v) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0) fail(key, cat("must be a positive integer (got ", j[key].dump(), ")"));
    v = j[key].get<int64_t>();
  };
  integer("base_dim", c.base_dim);
  integer("z_dim", c.z_dim);
  integer("num_res_blocks", c.num_res_blocks);
  integer("in_channels", c.in_channels);
  integer("out_channels", c.out_channels);
  if (j.contains("dim_mult")) {
    c.dim_mult.clear();
    for (const auto& v : j["dim_mult"]) {
      if (!v.is_number_integer() || v.get<int64_t>() <= 0) fail("dim_mult", "must list positive integers");
      c.dim_mult.push_back(v.get<int64_t>());
    }
  }
  if (j.contains("temperal_downsample")) {
    c.temperal_downsample.clear();
    for (const auto& v : j["temperal_downsample"]) {
      if (!v.is_boolean()) fail("temperal_downsample", "must list booleans");
      c.temperal_downsample.push_back(v.get<bool>());
    }
  }
  for (const char* key : {"latents_mean", "latents_std"}) {
    auto& out = std::string(key) == "latents_mean" ? c.latents_mean : c.latents_std;
    if (!j.contains(key)) continue;
    for (const auto& v : j[key]) {
      if (!v.is_number()) fail(key, "must list numbers");
      out.push_back(v.get<double>());
    }
    // Empty: no normalisation (a VAE trained here has no statistics until they are measured).
    if (!out.empty() && static_cast<int64_t>(out.size()) != c.z_dim)
      fail(key, cat("must hold z_dim = ", c.z_dim, " values (got ", out.size(), ")"));
  }
  if (c.latents_mean.empty() != c.latents_std.empty()) fail("latents_std", "and latents_mean must be given together");
  if (c.dim_mult.size() < 2 || c.temperal_downsample.size() != c.dim_mult.size() - 1)
    fail("temperal_downsample", cat("must hold one flag per downsampling, len(dim_mult) - 1 = ", c.dim_mult.size() - 1));
  if (j.contains("attn_scales") && !j["attn_scales"].empty()) fail("attn_scales", "must be empty (Wan2.1's VAE has no attention in its levels)");
  for (const char* key : {"is_residual", "patch_size", "decoder_base_dim"})
    if (j.contains(key) && !j[key].is_null() && j[key] != false)
      fail(key, "is set: only Wan2.1's VAE is implemented (Wan2.2's residual, patchified variant is not)");
  if (j.contains("dropout") && j["dropout"].is_number() && j["dropout"].get<double>() != 0.0) fail("dropout", "must be 0");
  return c;
}

WanVAEConfig WanVAEConfig::wan2_1() {
  WanVAEConfig c;
  // Wan's per-channel latent mean and standard deviation (wan/modules/vae.py, diffusers' defaults).
  c.latents_mean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                    0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
  c.latents_std = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                   3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};
  return c;
}

nlohmann::json WanVAEConfig::to_json() const {
  return {{"_class_name", "AutoencoderKLWan"}, {"_diffusers_version", "0.42.1"}, {"base_dim", base_dim},
          {"z_dim", z_dim}, {"dim_mult", dim_mult}, {"num_res_blocks", num_res_blocks},
          {"attn_scales", nlohmann::json::array()}, {"temperal_downsample", temperal_downsample}, {"dropout", 0.0},
          {"latents_mean", latents_mean}, {"latents_std", latents_std}, {"is_residual", false},
          {"in_channels", in_channels}, {"out_channels", out_channels}};
}

// ---------------------------------------------------------------------------------------------
// Layers

namespace {

at::Tensor zeros_param(std::initializer_list<int64_t> shape) { return at::zeros(shape, at::TensorOptions().dtype(at::kFloat)); }

// [B, C, T, H, W] -> [B * T, C, H, W] and back.
at::Tensor frames_to_batch(const at::Tensor& x) {
  return x.permute({0, 2, 1, 3, 4}).reshape({x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
at::Tensor batch_to_frames(const at::Tensor& y, int64_t b) {
  return y.view({b, y.size(0) / b, y.size(1), y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4});
}

}  // namespace

WanCausalConv3d::WanCausalConv3d(int64_t in, int64_t out, std::array<int64_t, 3> k, std::array<int64_t, 3> s, bool p)
    : kernel(k), stride(s), pad(p) {
  weight = register_parameter("weight", zeros_param({out, in, k[0], k[1], k[2]}));
  bias = register_parameter("bias", zeros_param({out}));
}

at::Tensor WanCausalConv3d::forward(const at::Tensor& x, VaeCache& cache) const {
  at::Tensor in = x;
  int64_t front = pad ? kernel[0] - 1 : 0;
  if (front > 0) {
    // The last input frames of earlier chunks stand in for the zero frames in front.
    at::Tensor& prev = cache.frames[this];
    if (prev.defined()) {
      in = at::cat({prev, x}, 2);
      front -= prev.size(2);
    }
    prev = in.narrow(2, std::max<int64_t>(0, in.size(2) - (kernel[0] - 1)), std::min(kernel[0] - 1, in.size(2))).clone();
  }
  const int64_t ph = pad ? kernel[1] / 2 : 0, pw = pad ? kernel[2] / 2 : 0;
  if (front > 0 || ph > 0 || pw > 0) in = at::constant_pad_nd(in, {pw, pw, ph, ph, front, 0});
  return at::conv3d(in, weight, bias, {stride[0], stride[1], stride[2]});
}

WanRMSNorm::WanRMSNorm(int64_t dim, bool images) {
  gamma = register_parameter("gamma", images ? at::ones({dim, 1, 1}) : at::ones({dim, 1, 1, 1}));
}

at::Tensor WanRMSNorm::forward(const at::Tensor& x) const {
  const at::Tensor xf = x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  const at::Tensor n = (xf / xf.norm(2, {1}, /*keepdim=*/true).clamp_min(1e-12)).to(x.scalar_type());
  return n * std::sqrt(static_cast<double>(gamma.size(0))) * gamma;
}

WanResidualBlock::WanResidualBlock(int64_t in, int64_t out) {
  norm1 = register_module("norm1", std::make_shared<WanRMSNorm>(in, false));
  conv1 = register_module("conv1", std::make_shared<WanCausalConv3d>(in, out, std::array<int64_t, 3>{3, 3, 3}));
  norm2 = register_module("norm2", std::make_shared<WanRMSNorm>(out, false));
  conv2 = register_module("conv2", std::make_shared<WanCausalConv3d>(out, out, std::array<int64_t, 3>{3, 3, 3}));
  if (in != out) shortcut = register_module("conv_shortcut", std::make_shared<WanCausalConv3d>(in, out, std::array<int64_t, 3>{1, 1, 1}));
}

at::Tensor WanResidualBlock::forward(const at::Tensor& x, VaeCache& cache) const {
  const at::Tensor h = shortcut ? shortcut->forward(x, cache) : x;
  at::Tensor y = conv1->forward(at::silu(norm1->forward(x)), cache);
  y = conv2->forward(at::silu(norm2->forward(y)), cache);
  return y + h;
}

WanAttentionBlock::WanAttentionBlock(int64_t dim) {
  norm = register_module("norm", std::make_shared<WanRMSNorm>(dim, true));
  auto qkv = register_module("to_qkv", std::make_shared<mm::nn::Module>());
  qkv_weight = qkv->register_parameter("weight", zeros_param({3 * dim, dim, 1, 1}));
  qkv_bias = qkv->register_parameter("bias", zeros_param({3 * dim}));
  auto proj = register_module("proj", std::make_shared<mm::nn::Module>());
  proj_weight = proj->register_parameter("weight", zeros_param({dim, dim, 1, 1}));
  proj_bias = proj->register_parameter("bias", zeros_param({dim}));
}

at::Tensor WanAttentionBlock::forward(const at::Tensor& x) const {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(3), w = x.size(4);
  at::Tensor f = norm->forward(frames_to_batch(x));
  const at::Tensor qkv = at::conv2d(f, qkv_weight, qkv_bias).reshape({f.size(0), 1, 3 * c, h * w}).permute({0, 1, 3, 2});
  const std::vector<at::Tensor> parts = qkv.chunk(3, -1);  // [bt, 1, hw, c] each
  at::Tensor o = models::scaled_dot_product_attention(parts[0].contiguous(), parts[1].contiguous(), parts[2].contiguous());
  o = o.squeeze(1).permute({0, 2, 1}).reshape({f.size(0), c, h, w});
  return batch_to_frames(at::conv2d(o, proj_weight, proj_bias), b) + x;
}

WanResample::WanResample(int64_t dim, std::string m) : mode(std::move(m)) {
  const bool up = mode.rfind("upsample", 0) == 0;
  auto seq = register_module("resample", std::make_shared<mm::nn::Module>());
  auto conv = seq->register_module("1", std::make_shared<mm::nn::Module>());
  const int64_t out = up ? dim / 2 : dim;
  conv_weight = conv->register_parameter("weight", zeros_param({out, dim, 3, 3}));
  conv_bias = conv->register_parameter("bias", zeros_param({out}));
  if (mode == "upsample3d")
    time_conv = register_module("time_conv", std::make_shared<WanCausalConv3d>(dim, 2 * dim, std::array<int64_t, 3>{3, 1, 1}));
  if (mode == "downsample3d")
    time_conv = register_module("time_conv", std::make_shared<WanCausalConv3d>(dim, dim, std::array<int64_t, 3>{3, 1, 1},
                                                                               std::array<int64_t, 3>{2, 1, 1}, /*pad=*/false));
}

at::Tensor WanResample::forward(const at::Tensor& x_in, VaeCache& cache) const {
  at::Tensor x = x_in;
  const int64_t b = x.size(0);
  // The first frame of a clip passes the temporal resampling untouched.
  auto split_first = [&](const at::Tensor& t, at::Tensor* first, at::Tensor* rest) {
    bool& started = cache.started[this];
    if (!started && t.size(2) > 0) {
      *first = t.narrow(2, 0, 1);
      *rest = t.narrow(2, 1, t.size(2) - 1);
      started = true;
    } else {
      *rest = t;
    }
  };
  if (mode == "upsample3d") {
    at::Tensor first, rest;
    split_first(x, &first, &rest);
    std::vector<at::Tensor> parts;
    if (first.defined()) parts.push_back(first);
    if (rest.size(2) > 0) {
      const at::Tensor y = time_conv->forward(rest, cache);  // [b, 2c, t, h, w]: even frames, then odd
      const int64_t c = rest.size(1), t = rest.size(2);
      const at::Tensor v = y.view({b, 2, c, t, y.size(3), y.size(4)});
      parts.push_back(at::stack({v.select(1, 0), v.select(1, 1)}, 3).reshape({b, c, 2 * t, y.size(3), y.size(4)}));
    }
    x = parts.size() == 1 ? parts[0] : at::cat(parts, 2);
  }
  at::Tensor f = frames_to_batch(x);
  if (mode.rfind("upsample", 0) == 0) {
    f = f.repeat_interleave(2, 2).repeat_interleave(2, 3);  // nearest, x2 (nearest-exact at this scale)
    f = at::conv2d(f, conv_weight, conv_bias, 1, 1);
  } else {
    f = at::conv2d(at::constant_pad_nd(f, {0, 1, 0, 1}), conv_weight, conv_bias, 2);
  }
  x = batch_to_frames(f, b);
  if (mode == "downsample3d") {
    at::Tensor first, rest;
    split_first(x, &first, &rest);
    at::Tensor& last = cache.frames[this];
    std::vector<at::Tensor> parts;
    if (first.defined()) {
      parts.push_back(first);
      last = first;
    }
    if (rest.size(2) > 0) {
      MM_CHECK(rest.size(2) % 2 == 0, "wan vae: ", rest.size(2), " frames after the first reach a temporal downsampling; "
               "a clip must have 1 + 4k frames (chunks of 4 after the first)");
      parts.push_back(time_conv->forward(at::cat({last, rest}, 2), cache));
      last = rest.narrow(2, rest.size(2) - 1, 1).clone();
    }
    x = parts.size() == 1 ? parts[0] : at::cat(parts, 2);
  }
  return x;
}

WanMidBlock::WanMidBlock(int64_t dim) {
  auto resnets = register_module("resnets", std::make_shared<mm::nn::Module>());
  res0 = resnets->register_module("0", std::make_shared<WanResidualBlock>(dim, dim));
  res1 = resnets->register_module("1", std::make_shared<WanResidualBlock>(dim, dim));
  auto attentions = register_module("attentions", std::make_shared<mm::nn::Module>());
  attn = attentions->register_module("0", std::make_shared<WanAttentionBlock>(dim));
}

at::Tensor WanMidBlock::forward(const at::Tensor& x, VaeCache& cache) const {
  return res1->forward(attn->forward(res0->forward(x, cache)), cache);
}

WanEncoder3d::WanEncoder3d(const WanVAEConfig& c) {
  std::vector<int64_t> dims = {c.base_dim};
  for (int64_t m : c.dim_mult) dims.push_back(c.base_dim * m);
  conv_in = register_module("conv_in", std::make_shared<WanCausalConv3d>(c.in_channels, dims[0], std::array<int64_t, 3>{3, 3, 3}));
  auto list = register_module("down_blocks", std::make_shared<mm::nn::Module>());
  int64_t k = 0;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    int64_t in = dims[i];
    for (int64_t r = 0; r < c.num_res_blocks; ++r) {
      down.push_back(list->register_module(std::to_string(k++), std::make_shared<WanResidualBlock>(in, dims[i + 1])));
      in = dims[i + 1];
    }
    if (i + 1 < c.dim_mult.size())
      down.push_back(list->register_module(
          std::to_string(k++), std::make_shared<WanResample>(dims[i + 1], c.temperal_downsample[i] ? "downsample3d" : "downsample2d")));
  }
  mid = register_module("mid_block", std::make_shared<WanMidBlock>(dims.back()));
  norm_out = register_module("norm_out", std::make_shared<WanRMSNorm>(dims.back(), false));
  conv_out = register_module("conv_out", std::make_shared<WanCausalConv3d>(dims.back(), 2 * c.z_dim, std::array<int64_t, 3>{3, 3, 3}));
}

at::Tensor WanEncoder3d::forward(const at::Tensor& x_in, VaeCache& cache) const {
  at::Tensor x = conv_in->forward(x_in, cache);
  for (const auto& m : down) {
    if (auto* r = dynamic_cast<WanResidualBlock*>(m.get())) x = r->forward(x, cache);
    else x = static_cast<WanResample*>(m.get())->forward(x, cache);
  }
  x = mid->forward(x, cache);
  return conv_out->forward(at::silu(norm_out->forward(x)), cache);
}

WanDecoder3d::WanDecoder3d(const WanVAEConfig& c) {
  std::vector<int64_t> dims = {c.base_dim * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) dims.push_back(c.base_dim * *it);
  conv_in = register_module("conv_in", std::make_shared<WanCausalConv3d>(c.z_dim, dims[0], std::array<int64_t, 3>{3, 3, 3}));
  mid = register_module("mid_block", std::make_shared<WanMidBlock>(dims[0]));
  auto list = register_module("up_blocks", std::make_shared<mm::nn::Module>());
  const size_t levels = c.dim_mult.size();
  for (size_t i = 0; i < levels; ++i) {
    auto block = list->register_module(std::to_string(i), std::make_shared<mm::nn::Module>());
    auto resnets = block->register_module("resnets", std::make_shared<mm::nn::Module>());
    int64_t in = i > 0 ? dims[i] / 2 : dims[i];
    up_res.emplace_back();
    for (int64_t r = 0; r <= c.num_res_blocks; ++r) {
      up_res.back().push_back(resnets->register_module(std::to_string(r), std::make_shared<WanResidualBlock>(in, dims[i + 1])));
      in = dims[i + 1];
    }
    std::shared_ptr<WanResample> up;
    if (i + 1 < levels) {
      // Temporal upsampling mirrors the encoder's downsampling, deepest level first.
      const bool temporal = c.temperal_downsample[levels - 2 - i];
      auto ups = block->register_module("upsamplers", std::make_shared<mm::nn::Module>());
      up = ups->register_module("0", std::make_shared<WanResample>(dims[i + 1], temporal ? "upsample3d" : "upsample2d"));
    }
    up_sample.push_back(up);
  }
  norm_out = register_module("norm_out", std::make_shared<WanRMSNorm>(dims.back(), false));
  conv_out = register_module("conv_out", std::make_shared<WanCausalConv3d>(dims.back(), c.out_channels, std::array<int64_t, 3>{3, 3, 3}));
}

at::Tensor WanDecoder3d::forward(const at::Tensor& x_in, VaeCache& cache) const {
  at::Tensor x = mid->forward(conv_in->forward(x_in, cache), cache);
  for (size_t i = 0; i < up_res.size(); ++i) {
    for (const auto& r : up_res[i]) x = r->forward(x, cache);
    if (up_sample[i]) x = up_sample[i]->forward(x, cache);
  }
  return conv_out->forward(at::silu(norm_out->forward(x)), cache);
}

// ---------------------------------------------------------------------------------------------
// The autoencoder

AutoencoderKLWan::AutoencoderKLWan(const WanVAEConfig& c) : config(c) {
  encoder = register_module("encoder", std::make_shared<WanEncoder3d>(c));
  quant_conv = register_module("quant_conv", std::make_shared<WanCausalConv3d>(2 * c.z_dim, 2 * c.z_dim, std::array<int64_t, 3>{1, 1, 1}));
  post_quant_conv = register_module("post_quant_conv", std::make_shared<WanCausalConv3d>(c.z_dim, c.z_dim, std::array<int64_t, 3>{1, 1, 1}));
  decoder = register_module("decoder", std::make_shared<WanDecoder3d>(c));
}

at::Tensor AutoencoderKLWan::encode_moments(const at::Tensor& video, bool chunked) const {
  const int64_t tf = config.temporal_factor(), sf = config.spatial_factor();
  MM_CHECK(video.dim() == 5 && video.size(1) == config.in_channels, "wan vae: a video must be [B, ", config.in_channels,
           ", frames, height, width], got ", video.sizes());
  MM_CHECK((video.size(2) - 1) % tf == 0, "wan vae: ", video.size(2), " frames: a clip must have 1 + ", tf, "k frames");
  MM_CHECK(video.size(3) % sf == 0 && video.size(4) % sf == 0, "wan vae: ", video.size(3), "x", video.size(4),
           " pixels do not divide by the spatial compression ", sf);
  VaeCache cache;
  at::Tensor out;
  if (!chunked) {
    out = encoder->forward(video, cache);
  } else {
    std::vector<at::Tensor> parts = {encoder->forward(video.narrow(2, 0, 1), cache)};
    for (int64_t s = 1; s < video.size(2); s += tf) parts.push_back(encoder->forward(video.narrow(2, s, tf), cache));
    out = at::cat(parts, 2);
  }
  VaeCache none;
  return quant_conv->forward(out, none);
}

at::Tensor AutoencoderKLWan::encode(const at::Tensor& video, bool chunked) const {
  const at::Tensor mean = encode_moments(video, chunked).narrow(1, 0, config.z_dim);
  if (config.latents_mean.empty()) return mean;
  const auto opts = mean.options();
  const at::Tensor m = at::tensor(config.latents_mean, opts.dtype(at::kDouble)).to(opts).view({1, -1, 1, 1, 1});
  const at::Tensor s = at::tensor(config.latents_std, opts.dtype(at::kDouble)).to(opts).view({1, -1, 1, 1, 1});
  return (mean - m) / s;
}

at::Tensor AutoencoderKLWan::denormalize(const at::Tensor& latents) const {
  if (config.latents_mean.empty()) return latents;
  const auto opts = latents.options();
  const at::Tensor m = at::tensor(config.latents_mean, opts.dtype(at::kDouble)).to(opts).view({1, -1, 1, 1, 1});
  const at::Tensor s = at::tensor(config.latents_std, opts.dtype(at::kDouble)).to(opts).view({1, -1, 1, 1, 1});
  return latents * s + m;
}

void AutoencoderKLWan::decode_frames(const at::Tensor& latents, const std::function<void(const at::Tensor&)>& sink) const {
  MM_CHECK(latents.dim() == 5 && latents.size(1) == config.z_dim, "wan vae: latents must be [B, ", config.z_dim,
           ", frames, height, width], got ", latents.sizes());
  VaeCache none, cache;
  const at::Tensor x = post_quant_conv->forward(latents, none);
  for (int64_t i = 0; i < x.size(2); ++i) sink(decoder->forward(x.narrow(2, i, 1), cache).clamp(-1.0, 1.0));
}

at::Tensor AutoencoderKLWan::decode(const at::Tensor& latents, bool chunked) const {
  if (!chunked) {
    MM_CHECK(latents.dim() == 5 && latents.size(1) == config.z_dim, "wan vae: latents must be [B, ", config.z_dim,
             ", frames, height, width], got ", latents.sizes());
    VaeCache none, cache;
    return decoder->forward(post_quant_conv->forward(latents, none), cache).clamp(-1.0, 1.0);
  }
  std::vector<at::Tensor> parts;
  decode_frames(latents, [&](const at::Tensor& f) { parts.push_back(f); });
  return at::cat(parts, 2);
}

Outputs AutoencoderKLWan::forward(const data::Batch& batch) {
  const at::Tensor moments = encode_moments(batch.require_tensor(data::kVideo), /*chunked=*/false);
  const at::Tensor mean = moments.narrow(1, 0, config.z_dim);
  const at::Tensor logvar = moments.narrow(1, config.z_dim, config.z_dim).clamp(-30.0, 20.0);
  // A posterior sample when the batch carries a noise seed per sample (the vae objective's
  // training steps), else the mean.
  at::Tensor z = mean;
  if (batch.has(data::kNoiseSeeds)) {
    const at::Tensor seeds = batch.require(data::kNoiseSeeds).to(at::kCPU).to(at::kLong).contiguous();
    std::vector<at::Tensor> noise;
    for (int64_t i = 0; i < mean.size(0); ++i) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seeds[i].item<int64_t>()));
      noise.push_back(at::randn(mean[i].sizes(), gen).to(mean.dtype()));
    }
    z = mean + at::exp(0.5 * logvar) * at::stack(noise).to(mean.device());
  }
  VaeCache none, cache;
  Outputs out;
  out.set(kReconstruction, decoder->forward(post_quant_conv->forward(z, none), cache));
  out.set(kPosteriorMean, mean);
  out.set(kPosteriorLogvar, logvar);
  return out;
}

void AutoencoderKLWan::init_weights(uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t last_fan_in = 1;
  for (auto& [name, p] : named_parameters()) {
    at::Tensor t = p;
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, "gamma") == 0) {
      mm::nn::init_param_fill(t, 1.0);
      continue;
    }
    // The bias's fan-in is its weight's: the weight is registered just before it.
    const auto shape = mm::nn::full_shape(t);
    if (shape.size() > 1) {
      int64_t fan_in = 1;
      for (size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
      last_fan_in = fan_in;
    }
    mm::nn::init_param_uniform(t, 1.0 / std::sqrt(static_cast<double>(last_fan_in)), gen);
  }
}

double AutoencoderKLWan::input_tokens(const data::Batch& host) const {
  const at::Tensor& v = host[data::kVideo];
  return v.defined() ? static_cast<double>(v.numel() / std::max<int64_t>(1, v.size(1))) : 0.0;
}

std::shared_ptr<AutoencoderKLWan> load_wan_vae(const std::string& dir) {
  std::shared_ptr<AutoencoderKLWan> m;
  if (std::filesystem::is_regular_file(dir)) {
    m = std::make_shared<AutoencoderKLWan>(WanVAEConfig{});  // the original checkpoint: Wan2.1's VAE
  } else {
    const nlohmann::json hf = checkpoint::read_hf_config(dir);
    if (hf_string(hf, "_class_name", "") != "AutoencoderKLWan")
      throw ConfigError(cat("config: ", dir, "/config.json has _class_name ", hf_string(hf, "_class_name", "(none)"),
                            ", not AutoencoderKLWan: not a Wan VAE"));
    m = std::make_shared<AutoencoderKLWan>(WanVAEConfig::from_json(hf, dir + "/config.json"));
  }
  checkpoint::load_model_weights(*m, dir, {}, [&](const std::string& k) { return m->parameter_name(k); });
  return m;
}

std::string AutoencoderKLWan::parameter_name(const std::string& checkpoint_name) const {
  return wan_vae_diffusers_name(checkpoint_name, config.num_res_blocks);
}

namespace {

bool starts(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// A residual block's parameter suffix, original <-> diffusers.
const std::vector<std::pair<std::string, std::string>> kResidualNames = {
    {"residual.0.gamma", "norm1.gamma"}, {"residual.2.", "conv1."},   {"residual.3.gamma", "norm2.gamma"},
    {"residual.6.", "conv2."},           {"shortcut.", "conv_shortcut."}};
const std::vector<std::pair<std::string, std::string>> kHeadNames = {
    {"conv1.", "conv_in."}, {"head.0.gamma", "norm_out.gamma"}, {"head.2.", "conv_out."}};

// `rest` renamed by the first (from, to) pair whose `from` starts it; nullopt when none does.
std::optional<std::string> swap_prefix(const std::string& rest, const std::vector<std::pair<std::string, std::string>>& table,
                                       bool forward) {
  for (const auto& [a, b] : table) {
    const std::string& from = forward ? a : b;
    const std::string& to = forward ? b : a;
    if (starts(rest, from)) return to + rest.substr(from.size());
  }
  return std::nullopt;
}

// "12.rest" -> (12, "rest"); nullopt when `s` does not start with a number and a dot.
std::optional<std::pair<int64_t, std::string>> split_index(const std::string& s) {
  const size_t dot = s.find('.');
  if (dot == 0 || dot == std::string::npos || s.find_first_not_of("0123456789") != dot) return std::nullopt;
  return std::make_pair(std::stoll(s.substr(0, dot)), s.substr(dot + 1));
}

std::string residual(const std::string& rest, bool forward) { return swap_prefix(rest, kResidualNames, forward).value_or(rest); }

}  // namespace

std::string wan_vae_diffusers_name(const std::string& name, int64_t num_res_blocks) {
  if (starts(name, "conv1.")) return "quant_conv." + name.substr(6);
  if (starts(name, "conv2.")) return "post_quant_conv." + name.substr(6);
  for (const std::string part : {"encoder.", "decoder."}) {
    if (!starts(name, part)) continue;
    const std::string rest = name.substr(part.size());
    if (auto r = swap_prefix(rest, kHeadNames, true)) return part + *r;
    if (starts(rest, "middle."))
      if (auto ix = split_index(rest.substr(7))) {
        if (ix->first == 1) return part + "mid_block.attentions.0." + ix->second;
        return part + cat("mid_block.resnets.", ix->first / 2, ".") + residual(ix->second, true);
      }
    if (part == "encoder." && starts(rest, "downsamples."))
      if (auto ix = split_index(rest.substr(12))) return cat(part, "down_blocks.", ix->first, ".", residual(ix->second, true));
    if (part == "decoder." && starts(rest, "upsamples."))
      if (auto ix = split_index(rest.substr(10))) {
        const int64_t per_level = num_res_blocks + 2, level = ix->first / per_level, k = ix->first % per_level;
        if (k <= num_res_blocks) return cat(part, "up_blocks.", level, ".resnets.", k, ".", residual(ix->second, true));
        return cat(part, "up_blocks.", level, ".upsamplers.0.", ix->second);
      }
  }
  return name;
}

std::string wan_vae_original_name(const std::string& name, int64_t num_res_blocks) {
  if (starts(name, "quant_conv.")) return "conv1." + name.substr(11);
  if (starts(name, "post_quant_conv.")) return "conv2." + name.substr(16);
  for (const std::string part : {"encoder.", "decoder."}) {
    if (!starts(name, part)) continue;
    const std::string rest = name.substr(part.size());
    if (auto r = swap_prefix(rest, kHeadNames, false)) return part + *r;
    if (starts(rest, "mid_block.attentions.0.")) return part + "middle.1." + rest.substr(23);
    if (starts(rest, "mid_block.resnets."))
      if (auto ix = split_index(rest.substr(18))) return cat(part, "middle.", 2 * ix->first, ".", residual(ix->second, false));
    if (part == "encoder." && starts(rest, "down_blocks."))
      if (auto ix = split_index(rest.substr(12))) return cat(part, "downsamples.", ix->first, ".", residual(ix->second, false));
    if (part == "decoder." && starts(rest, "up_blocks."))
      if (auto ix = split_index(rest.substr(10))) {
        const int64_t base = ix->first * (num_res_blocks + 2);
        if (starts(ix->second, "resnets."))
          if (auto r = split_index(ix->second.substr(8)))
            return cat(part, "upsamples.", base + r->first, ".", residual(r->second, false));
        if (starts(ix->second, "upsamplers.0."))
          return cat(part, "upsamples.", base + num_res_blocks + 1, ".", ix->second.substr(13));
      }
  }
  return name;
}

namespace {
const mm::Registrar kRegisterWanVAE(model_registry(), "wan_vae", [](const nlohmann::json& hf, const std::string& source, bool) {
  return std::static_pointer_cast<Model>(std::make_shared<AutoencoderKLWan>(WanVAEConfig::from_json(hf, source)));
});
const mm::Registrar kSizeWanVAE(model_size_registry(), "wan_vae", [](const nlohmann::json& hf, const std::string& source, bool) {
  // Built without storage (deferred) just to count: the VAE has no closed form worth keeping.
  mm::nn::DeferredInitGuard deferred;
  AutoencoderKLWan m(WanVAEConfig::from_json(hf, source));
  ModelSize size{{{"vae", m.num_parameters()}}};
  const int64_t tf = m.config.temporal_factor(), sf = m.config.spatial_factor();
  for (const auto& [name, f, h, w] : {std::tuple<const char*, int64_t, int64_t, int64_t>{"480p 81-frame clip", 81, 480, 832},
                                      {"720p 81-frame clip", 81, 720, 1280}})
    size.sample_flops.emplace_back(
        cat(name, " (encode + decode)"),
        3.0 * (m.encode_flops(f, h, w) + m.decode_flops(1 + (f - 1) / tf, h / sf, w / sf)));
  return size;
});
}  // namespace

}  // namespace mm::models
