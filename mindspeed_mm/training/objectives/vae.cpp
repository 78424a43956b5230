// vae: training a video autoencoder (training.vae). Each sample's loss is its mean absolute
// reconstruction error over pixels plus kl_weight times the mean KL divergence of its posterior
// N(mean, exp(logvar)) from N(0, 1) per latent element; normalised by the step's samples.
// Validation reports the reconstruction error alone (the decoder fed the posterior's mean) and,
// beside it, the PSNR of the clips in [-1, 1].
#include <algorithm>
#include <cmath>
#include <cstring>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/models/wan/wan_vae.h"
#include "mindspeed_mm/training/objectives/objective.h"

namespace mm::training {
namespace {

using log::fixed;

class VaeObjective : public Objective {
 public:
  explicit VaeObjective(const config::Config& cfg)
      : kl_weight_(cfg.training.vae.kl_weight), l1_weight_(cfg.training.vae.l1_weight), mse_weight_(cfg.training.vae.mse_weight),
        sample_(cfg.training.vae.sample_posterior), seed_(static_cast<uint64_t>(cfg.training.seed)) {
    if (l1_weight_ == 0 && mse_weight_ == 0)
      throw ConfigError("config: training.vae: l1_weight and mse_weight are both 0: nothing to reconstruct by");
  }

  std::vector<std::string> required_fields() const override { return {std::string(data::kVideo)}; }
  std::vector<std::string> optional_fields() const override { return {std::string(data::kSampleIds)}; }
  std::vector<std::string> provided_fields() const override { return {std::string(data::kNoiseSeeds)}; }

  // Training steps get a seed per sample for the posterior's noise (validation decodes the mean).
  void prepare(data::Batch& b, int64_t step) const override {
    if (!sample_ || step == kValidationStep || !b.has(data::kSampleIds)) return;
    const at::Tensor ids = b.require(data::kSampleIds).to(at::kCPU).to(at::kLong).contiguous();
    at::Tensor seeds = at::empty({ids.numel()}, at::kLong);
    for (int64_t i = 0; i < ids.numel(); ++i)
      seeds[i] = static_cast<int64_t>(draw_seed(seed_, step, static_cast<uint64_t>(ids[i].item<int64_t>())) >> 1);
    b.set(data::kNoiseSeeds, seeds);
  }
  std::string normalised_by() const override { return "samples"; }
  double count(const data::Batch& host) const override { return static_cast<double>(host.require(data::kVideo).size(0)); }

  at::Tensor loss_sum(const models::Outputs& out, const data::Batch& b) const override {
    const at::Tensor diff = out[models::kReconstruction].to(at::kFloat) - b.require(data::kVideo).to(at::kFloat);
    at::Tensor recon = at::zeros({diff.size(0)}, diff.options());
    if (l1_weight_ > 0) recon = recon + l1_weight_ * diff.abs().flatten(1).mean(1);
    if (mse_weight_ > 0) recon = recon + mse_weight_ * diff.square().flatten(1).mean(1);
    const at::Tensor mean = out[models::kPosteriorMean].to(at::kFloat), logvar = out[models::kPosteriorLogvar].to(at::kFloat);
    const at::Tensor kl = (0.5 * (mean.pow(2) + logvar.exp() - 1 - logvar)).flatten(1).mean(1);
    return (recon + kl_weight_ * kl).sum();
  }

  EvalSums eval_sums(const models::Outputs& out, const data::Batch& b) const override {
    const at::Tensor l1 = reconstruction_l1(out, b).to(at::kDouble);
    const at::Tensor recon = out[models::kReconstruction].to(at::kFloat).clamp(-1, 1);
    const at::Tensor mse = (recon - b.require(data::kVideo).to(at::kFloat)).pow(2).flatten(1).mean(1).to(at::kDouble);
    return {l1.sum(), at::scalar_tensor(static_cast<double>(l1.size(0)), l1.options()),
            at::stack({mse.sum(), at::scalar_tensor(static_cast<double>(mse.size(0)), mse.options())})};
  }
  int64_t eval_parts_size() const override { return 2; }
  Report eval_parts(const std::vector<double>& parts) const override {
    if (parts[1] <= 0) return {};
    // Peak-to-peak 2 in [-1, 1]: PSNR = 10 log10(4 / MSE).
    const double psnr = 10 * std::log10(4.0 / std::max(1e-12, parts[0] / parts[1]));
    return {cat("PSNR ", fixed(psnr, 2), " dB"), {{"val_psnr", psnr}}};
  }

  std::string describe(double loss) const override { return cat("loss ", fixed(loss, 4)); }

  // The first clip's frames (up to 8, evenly spaced) over its reconstruction's: one sheet.
  std::vector<std::pair<std::string, data::Image>> eval_images(const models::Outputs& out,
                                                               const data::Batch& b) const override {
    const at::Tensor video = b.require(data::kVideo)[0].to(at::kCPU).to(at::kFloat);       // [C, T, H, W]
    const at::Tensor recon = out[models::kReconstruction][0].to(at::kCPU).to(at::kFloat);  // the same
    if (video.dim() != 4 || video.size(0) != 3 || recon.sizes() != video.sizes()) return {};
    const int64_t t = video.size(1), h = video.size(2), w = video.size(3);
    const int64_t shown = std::min<int64_t>(t, 8), gap = 2;
    data::Image sheet(static_cast<int>(shown * w + (shown - 1) * gap), static_cast<int>(2 * h + gap));
    auto to_u8 = [](const at::Tensor& x) {  // [C, H, W] in [-1, 1] -> [H, W, C] bytes
      return ((x.clamp(-1, 1) + 1) * 127.5).round().to(at::kByte).permute({1, 2, 0}).contiguous();
    };
    for (int64_t k = 0; k < shown; ++k) {
      const int64_t f = shown > 1 ? k * (t - 1) / (shown - 1) : 0;
      for (int row = 0; row < 2; ++row) {
        const at::Tensor px = to_u8((row == 0 ? video : recon).select(1, f));
        const uint8_t* src = px.data_ptr<uint8_t>();
        for (int64_t y = 0; y < h; ++y)
          std::memcpy(sheet.row(static_cast<int>(row * (h + gap) + y)) + 3 * k * (w + gap), src + y * w * 3,
                      static_cast<size_t>(w * 3));
      }
    }
    return {{"samples/reconstruction", std::move(sheet)}};
  }

 private:
  // Each sample's mean absolute error of the reconstruction [B].
  static at::Tensor reconstruction_l1(const models::Outputs& out, const data::Batch& b) {
    const at::Tensor recon = out[models::kReconstruction].to(at::kFloat);
    const at::Tensor video = b.require(data::kVideo).to(at::kFloat);
    MM_CHECK(recon.sizes() == video.sizes(), "vae: reconstruction ", recon.sizes(), " for videos ", video.sizes());
    return (recon - video).abs().flatten(1).mean(1);
  }

  double kl_weight_, l1_weight_, mse_weight_;
  bool sample_;
  uint64_t seed_;
};

Registrar vae(objective_registry(), "vae", [](const config::Config& cfg) -> std::unique_ptr<Objective> {
  return std::make_unique<VaeObjective>(cfg);
});

}  // namespace
}  // namespace mm::training
