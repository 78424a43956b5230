// Wan2.1's causal 3-D VAE (diffusers' AutoencoderKLWan), parameter names as in a diffusers vae/
// directory. Videos [B, 3, 1 + 4k, H, W] in [-1, 1] become latents [B, z, 1 + k, H / 8, W / 8]
// (with the default three downsamplings: spatial, then spatial + temporal twice).
//
// Every convolution is causal in time: a 3x3x3 convolution sees the frame and the two before it
// (zeros before the first). The first frame is special: the temporal downsampling passes it
// through and halves the frames after it; the temporal upsampling passes it through and doubles
// the frames after it (so 1 + k latent frames decode to 1 + 4k frames). Because of that, a clip
// can be run whole or in chunks (diffusers: the first frame, then 4 frames at a time to encode;
// one latent frame at a time to decode) with a cache of the last two input frames of every
// causal convolution (VaeCache): the results are the same, and chunked decoding holds only one
// latent frame's activations, so a long video decodes in bounded memory.
//
// Names: encoder.conv_in, encoder.down_blocks.N (residual blocks: norm1.gamma, conv1, norm2.gamma,
// conv2, conv_shortcut; resamplers: resample.1, time_conv), encoder.mid_block.{resnets.N,
// attentions.0.{norm.gamma, to_qkv, proj}}, encoder.norm_out.gamma, encoder.conv_out,
// quant_conv, post_quant_conv, decoder.conv_in, decoder.mid_block, decoder.up_blocks.N.{resnets.M,
// upsamplers.0.{resample.1, time_conv}}, decoder.norm_out.gamma, decoder.conv_out.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/models/common/hf_config.h"
#include "mindspeed_mm/models/model.h"

namespace mm::models {

// diffusers' config.json for AutoencoderKLWan (Wan2.1's values by default).
struct WanVAEConfig {
  int64_t base_dim = 96, z_dim = 16, num_res_blocks = 2;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  std::vector<bool> temperal_downsample = {false, true, true};  // diffusers' spelling
  std::vector<double> latents_mean, latents_std;                // z_dim each
  int64_t in_channels = 3, out_channels = 3;

  // Frames of the latents of `frames` video frames, and the other way.
  int64_t temporal_factor() const;
  int64_t spatial_factor() const { return int64_t{1} << (dim_mult.size() - 1); }

  static WanVAEConfig from_json(const nlohmann::json& j, const std::string& source);
  nlohmann::json to_json() const;
  // The released Wan2.1 VAE (Wan2.1_VAE.pth): the defaults with its latent statistics.
  static WanVAEConfig wan2_1();
};

// The state chunked encoding and decoding carry from one chunk to the next: per causal
// convolution its last input frames, per temporal resampler whether the first frame has passed.
struct VaeCache {
  std::map<const void*, at::Tensor> frames;
  std::map<const void*, bool> started;
};

// A convolution causal in time: kernel (kt, kh, kw), spatial padding kh / 2, kw / 2 and kt - 1
// zero frames in front (none when front_pad is false: the temporal downsampling's).
class WanCausalConv3d : public mm::nn::Module {
 public:
  WanCausalConv3d(int64_t in, int64_t out, std::array<int64_t, 3> kernel, std::array<int64_t, 3> stride = {1, 1, 1},
                  bool pad = true);
  at::Tensor forward(const at::Tensor& x, VaeCache& cache) const;
  std::string type_name() const override { return "WanCausalConv3d"; }

  std::array<int64_t, 3> kernel, stride;
  bool pad;
  at::Tensor weight, bias;
};

// x / max(||x||, 1e-12) over the channels, times sqrt(channels) and gamma.
class WanRMSNorm : public mm::nn::Module {
 public:
  WanRMSNorm(int64_t dim, bool images);
  at::Tensor forward(const at::Tensor& x) const;
  std::string type_name() const override { return "WanRMS_norm"; }
  at::Tensor gamma;
};

class WanResidualBlock : public mm::nn::Module {
 public:
  WanResidualBlock(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x, VaeCache& cache) const;
  std::string type_name() const override { return "WanResidualBlock"; }
  std::shared_ptr<WanRMSNorm> norm1, norm2;
  std::shared_ptr<WanCausalConv3d> conv1, conv2, shortcut;  // shortcut null when in == out
};

// Single-head spatial self-attention within each frame.
class WanAttentionBlock : public mm::nn::Module {
 public:
  explicit WanAttentionBlock(int64_t dim);
  at::Tensor forward(const at::Tensor& x) const;
  std::string type_name() const override { return "WanAttentionBlock"; }
  std::shared_ptr<WanRMSNorm> norm;
  at::Tensor qkv_weight, qkv_bias, proj_weight, proj_bias;  // 1x1 Conv2d
};

// mode: downsample2d, downsample3d, upsample2d, upsample3d.
class WanResample : public mm::nn::Module {
 public:
  WanResample(int64_t dim, std::string mode);
  at::Tensor forward(const at::Tensor& x, VaeCache& cache) const;
  std::string type_name() const override { return "WanResample"; }
  std::string mode;
  at::Tensor conv_weight, conv_bias;       // resample.1: Conv2d
  std::shared_ptr<WanCausalConv3d> time_conv;  // 3d modes
};

class WanMidBlock : public mm::nn::Module {
 public:
  explicit WanMidBlock(int64_t dim);
  at::Tensor forward(const at::Tensor& x, VaeCache& cache) const;
  std::shared_ptr<WanResidualBlock> res0, res1;
  std::shared_ptr<WanAttentionBlock> attn;
};

class WanEncoder3d : public mm::nn::Module {
 public:
  explicit WanEncoder3d(const WanVAEConfig& c);
  at::Tensor forward(const at::Tensor& x, VaeCache& cache) const;
  std::shared_ptr<WanCausalConv3d> conv_in, conv_out;
  std::vector<std::shared_ptr<mm::nn::Module>> down;  // WanResidualBlock or WanResample
  std::shared_ptr<WanMidBlock> mid;
  std::shared_ptr<WanRMSNorm> norm_out;
};

class WanDecoder3d : public mm::nn::Module {
 public:
  explicit WanDecoder3d(const WanVAEConfig& c);
  at::Tensor forward(const at::Tensor& x, VaeCache& cache) const;
  std::shared_ptr<WanCausalConv3d> conv_in, conv_out;
  std::shared_ptr<WanMidBlock> mid;
  std::vector<std::vector<std::shared_ptr<WanResidualBlock>>> up_res;
  std::vector<std::shared_ptr<WanResample>> up_sample;  // null where a level does not upsample
  std::shared_ptr<WanRMSNorm> norm_out;
};

// Outputs of the VAE as a trainable model (model.id: wan_vae, objective vae).
inline constexpr std::string_view kReconstruction = "reconstruction";  // [B, 3, F, H, W], not clamped
inline constexpr std::string_view kPosteriorMean = "posterior_mean";   // [B, z, f, h, w]
inline constexpr std::string_view kPosteriorLogvar = "posterior_logvar";

class AutoencoderKLWan : public Model {
 public:
  explicit AutoencoderKLWan(const WanVAEConfig& c);

  // The Model interface (training the VAE): the batch's video through the encoder whole, a
  // latent drawn from the posterior (its mean without grad mode), the decoder whole; outputs
  // reconstruction and the posterior's mean and log-variance (clamped to [-30, 20] as diffusers).
  Outputs forward(const data::Batch& batch) override;
  std::vector<std::string> required_fields() const override { return {std::string(data::kVideo)}; }
  std::vector<std::string> optional_fields() const override { return {std::string(data::kNoiseSeeds)}; }
  std::string default_objective() const override { return "vae"; }
  // PyTorch's default convolution init (uniform within 1 / sqrt(fan_in)); norm gammas 1.
  void init_weights(uint64_t seed) override;
  nlohmann::json hf_config() const override { return config.to_json(); }
  std::vector<std::shared_ptr<mm::nn::Block>> blocks() override { return {}; }
  std::vector<ModelPart> parts() const override { return {{"vae", ""}}; }
  // The original Wan2.1 VAE's names load too (wan_vae_diffusers_name).
  std::string parameter_name(const std::string& checkpoint_name) const override;
  double input_tokens(const data::Batch& host) const override;  // pixels x frames
  // wan_vae_flops.cpp: convolutions' and the mid blocks' attention's multiply-adds, as PyTorch's
  // FlopCounterMode counts them (2 per MAC; norms and activations not counted).
  double training_flops(const data::Batch& host) const override;  // 3 x (encode + decode) per clip
  std::string cost_summary(int64_t) const override;
  // Forward FLOPs of one clip of `frames` x height x width pixels through the encoder (with
  // quant_conv), and of its latents [f, h, w] through the decoder (with post_quant_conv).
  double encode_flops(int64_t frames, int64_t height, int64_t width) const;
  double decode_flops(int64_t frames, int64_t height, int64_t width) const;

  // video [B, in_channels, 1 + 4k, H, W] -> the posterior's moments [B, 2 z, 1 + k, H/8, W/8]
  // (mean, then log-variance). chunked: the first frame, then 4 frames at a time.
  at::Tensor encode_moments(const at::Tensor& video, bool chunked = true) const;
  // The posterior's mean, normalised by latents_mean / latents_std ((mean - m) / s): what the DiT
  // is trained on.
  at::Tensor encode(const at::Tensor& video, bool chunked = true) const;
  // latents [B, z, n, h, w] (not normalised) -> video [B, out_channels, 1 + 4 (n - 1), 8h, 8w]
  // clamped to [-1, 1]. chunked: one latent frame at a time.
  at::Tensor decode(const at::Tensor& latents, bool chunked = true) const;
  // Chunked decoding that hands each chunk's frames to `sink` instead of keeping them: memory
  // stays that of one latent frame whatever the length.
  void decode_frames(const at::Tensor& latents, const std::function<void(const at::Tensor& frames)>& sink) const;
  // normalised latents (encode's) -> the VAE's latent space.
  at::Tensor denormalize(const at::Tensor& latents) const;
  std::string type_name() const override { return "AutoencoderKLWan"; }

  WanVAEConfig config;
  std::shared_ptr<WanEncoder3d> encoder;
  std::shared_ptr<WanDecoder3d> decoder;
  std::shared_ptr<WanCausalConv3d> quant_conv, post_quant_conv;
};

// A vae/ directory (config.json with _class_name AutoencoderKLWan + safetensors), fp32.
// dir: a diffusers vae/ directory (config.json + safetensors), or one whose weights are the
// original Wan2.1_VAE.pth (torch.save'd, original names), or that .pth file itself (Wan2.1's
// configuration: AutoencoderKLWan's defaults).
std::shared_ptr<AutoencoderKLWan> load_wan_vae(const std::string& dir);

// Names of the original Wan2.1 VAE checkpoint (Wan2.1_VAE.pth, Wan's wan/modules/vae.py) and
// diffusers' AutoencoderKLWan, both ways, for a VAE with `num_res_blocks` (the original numbers
// the decoder's upsamples through every level's resnets and its upsampler):
//   conv1 / conv2                       quant_conv / post_quant_conv
//   X.conv1, X.head.0.gamma, X.head.2   X.conv_in, X.norm_out.gamma, X.conv_out
//   X.middle.{0,1,2}                    X.mid_block.{resnets.0, attentions.0, resnets.1}
//   encoder.downsamples.N               encoder.down_blocks.N
//   decoder.upsamples.N                 decoder.up_blocks.I.resnets.R, or .upsamplers.0 after
//                                       the level's num_res_blocks + 1 resnets
//   residual.{0.gamma,2,3.gamma,6}      norm1.gamma, conv1, norm2.gamma, conv2; shortcut: conv_shortcut
// A name already in the target layout (or unknown) comes back unchanged.
std::string wan_vae_diffusers_name(const std::string& original, int64_t num_res_blocks);
std::string wan_vae_original_name(const std::string& diffusers, int64_t num_res_blocks);

}  // namespace mm::models
