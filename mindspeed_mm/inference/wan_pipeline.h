// Wan2.1 text-to-video sampling, as diffusers' WanPipeline does it: a diffusers pipeline
// directory (transformer/, vae/, text_encoder/, tokenizer/) loaded into mm's models; prompts
// cleaned (HTML entities, whitespace), tokenized to max_sequence_length with padding and EOS,
// encoded by umT5 and cut to each prompt's real length, zero-padded; latents drawn
// N(0, 1) from the seed on the CPU (the same numbers as torch.Generator().manual_seed(seed));
// classifier-free guidance with the conditional and unconditional predictions in one batched
// forward; the scheduler's steps; the VAE decoding one latent frame at a time.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"
#include "mindspeed_mm/models/umt5/umt5.h"
#include "mindspeed_mm/models/wan/wan_dit.h"
#include "mindspeed_mm/models/wan/wan_vae.h"

namespace mm::inference {

struct WanPipeline {
  std::shared_ptr<models::WanTransformer3DModel> transformer;
  std::shared_ptr<models::AutoencoderKLWan> vae;
  std::shared_ptr<models::UMT5EncoderModel> text_encoder;
  std::shared_ptr<data::PretrainedTokenizer> tokenizer;
};

// DIR/{transformer,vae,text_encoder,tokenizer}; each part's weights checked by name and shape.
// mm::Error naming the part and path when one is missing or does not fit. Without
// `with_transformer` (feature extraction before any transformer is trained) transformer/ is
// neither needed nor read and `transformer` stays empty.
WanPipeline load_wan_pipeline(const std::string& dir, at::Device device = at::kCPU, bool with_transformer = true);

// diffusers' prompt_clean without ftfy: HTML entities unescaped twice, whitespace runs collapsed, trimmed.
std::string clean_prompt(const std::string& text);

// [B, max_sequence_length, text_dim]: each prompt's features, zero after its last token.
at::Tensor encode_prompts(const WanPipeline& pipe, const std::vector<std::string>& prompts, int64_t max_sequence_length);

struct WanSampleOptions {
  int64_t steps = 50;
  double guidance_scale = 5.0;
  double shift = 0;              // 0: 5.0 from 720p up, else 3.0 (Wan's defaults)
  uint64_t seed = 0;
  int64_t frames = 81, height = 480, width = 832;
  std::string scheduler = "unipc";
  std::string negative_prompt;
  int64_t max_sequence_length = 512;
};

// The shift an option set means (resolving 0).
double resolve_shift(const WanSampleOptions& o);

// Denoised latents [B, z, 1 + (frames - 1) / 4, height / 8, width / 8] as the transformer works
// on them (normalised: vae->denormalize before decoding), for the prompts, from the seed's noise
// for the whole batch (as WanPipeline with one generator). `progress(step, steps)` after each
// step. ConfigError for frames not 1 + 4k, or sides not multiples of 16.
at::Tensor sample_latents(const WanPipeline& pipe, const std::vector<std::string>& prompts, const WanSampleOptions& o,
                          const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace mm::inference
