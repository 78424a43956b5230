// model.encoders {id: wan, path: PIPE}: Wan2.1's frozen VAE and umT5 from a pipeline directory
// (vae/, text_encoder/, tokenizer/; transformer/ not read), turning a videos dataset's clips and
// captions into exactly what `mm data extract-features` writes: the VAE's normalised posterior
// mean of each clip, each caption's umT5 features (cleaned, padded to max_sequence_length, zero
// after its last token), and the empty prompt's features for text dropout.
#include <ATen/core/grad_mode.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/inference/wan_pipeline.h"
#include "mindspeed_mm/training/encoders/input_encoder.h"

namespace mm::training {
namespace {

class WanEncoders : public InputEncoder {
 public:
  WanEncoders(const config::Config& cfg, at::Device device) : max_len_(cfg.model.encoders.max_sequence_length) {
    const std::string& dir = cfg.model.encoders.path;
    if (dir.empty()) throw ConfigError("config: model.encoders.path must name a Wan pipeline directory (vae/, text_encoder/, tokenizer/)");
    pipe_ = inference::load_wan_pipeline(dir, device, /*with_transformer=*/false);
    for (mm::nn::Module* m : {static_cast<mm::nn::Module*>(pipe_.vae.get()), static_cast<mm::nn::Module*>(pipe_.text_encoder.get())})
      for (auto& p : m->parameters()) p.set_requires_grad(false);
    const models::WanVAEConfig& v = pipe_.vae->config;
    if (cfg.data.dataset == "videos") {
      const config::VideoClipConfig& c = cfg.data.video;
      const int64_t tf = v.temporal_factor(), sf = v.spatial_factor();
      if ((c.frames - 1) % tf != 0 || c.height % sf != 0 || c.width % sf != 0)
        throw ConfigError(cat("config: data.video ", c.height, "x", c.width, "x", c.frames, " does not fit the VAE of ", dir,
                              "/vae: frames must be 1 + ", tf, "k and sides multiples of ", sf));
    }
    null_ = inference::encode_prompts(pipe_, {""}, max_len_);
  }

  std::vector<std::string> required_fields() const override { return {std::string(data::kVideo), std::string(data::kCaptions)}; }
  std::vector<std::string> provided_fields() const override {
    return {std::string(data::kLatents), std::string(data::kPromptEmbeds), std::string(data::kNullPromptEmbeds)};
  }

  void check(const models::Model& model) const override {
    const auto* dit = dynamic_cast<const models::WanTransformer3DModel*>(&model);
    if (!dit) return;
    if (dit->config.text_dim != pipe_.text_encoder->config.d_model)
      throw ConfigError(cat("config: model.encoders: the text encoder's width ", pipe_.text_encoder->config.d_model,
                            " is not the transformer's text_dim ", dit->config.text_dim));
    if (dit->config.in_channels != pipe_.vae->config.z_dim)
      throw ConfigError(cat("config: model.encoders: the VAE's z_dim ", pipe_.vae->config.z_dim,
                            " is not the transformer's in_channels ", dit->config.in_channels));
  }

  void encode(data::Batch& device, data::Batch& host) const override {
    at::NoGradGuard no_grad;
    const at::Tensor& video = device.require(data::kVideo);
    MM_CHECK(static_cast<int64_t>(device.captions.size()) == video.size(0), "encoders: ", device.captions.size(),
             " captions for ", video.size(0), " clips");
    const at::Tensor latents = pipe_.vae->encode(video.to(at::kFloat));
    const at::Tensor text = inference::encode_prompts(pipe_, device.captions, max_len_);
    device.set(data::kLatents, latents);
    device.set(data::kPromptEmbeds, text);
    device.set(data::kNullPromptEmbeds, null_);
    device.set(data::kVideo, {});  // consumed: the clip's memory goes back before the forward
    if (&host != &device) {
      host.set(data::kLatents, latents.cpu());
      host.set(data::kPromptEmbeds, text.cpu());
      host.set(data::kNullPromptEmbeds, null_.cpu());
    }
  }

  std::vector<std::pair<std::string, double>> flops_by_part(const data::Batch& host) const override {
    const at::Tensor& video = host[data::kVideo];
    if (!video.defined() || video.dim() != 5) return {};
    const double clips = static_cast<double>(video.size(0));
    return {{"vae (frozen)", clips * pipe_.vae->encode_flops(video.size(2), video.size(3), video.size(4))},
            {"text encoder (frozen)", clips * models::umt5_forward_flops(pipe_.text_encoder->config, max_len_)}};
  }

  std::string describe() const override {
    return cat("VAE ", pipe_.vae->num_parameters(), " + umT5 ", pipe_.text_encoder->num_parameters(),
               " parameters, frozen; captions to ", max_len_, " tokens");
  }

 private:
  int64_t max_len_;
  inference::WanPipeline pipe_;
  at::Tensor null_;
};

Registrar wan_encoders(input_encoder_registry(), "wan", [](const config::Config& cfg, at::Device device) -> std::unique_ptr<InputEncoder> {
  return std::make_unique<WanEncoders>(cfg, device);
});

}  // namespace
}  // namespace mm::training
