// flow_matching: rectified-flow training of a diffusion transformer, as Wan2.1 and MindSpeed-MM
// define it (training.flow_matching). For each sample, a training noise level
//   sigma_k = shift(1 - k / T),  k uniform in [0, T),  T = num_train_timesteps,
// the model's input x_t = (1 - sigma) x0 + sigma noise at timestep T sigma_k, and the target
// velocity noise - x0; the loss is each sample's mean squared error (times MindSpeed-MM's
// Gaussian timestep weight under weighting: gaussian), normalised by the step's samples.
// Text dropout swaps a sample's text features for the empty prompt's. Draws come from a
// generator seeded by (training.seed, step, sample id), so any layout draws the same.
// Validation puts every sample at the midpoints of 4 timestep buckets with fixed noise and
// reports the plain MSE overall and per bucket.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <cmath>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/models/wan/wan_dit.h"
#include "mindspeed_mm/training/objectives/objective.h"

namespace mm::training {
namespace {

using log::fixed;

constexpr int64_t kBuckets = 4;
constexpr std::string_view kWeights = "flow_weights";  // per-sample loss weights [B]

class FlowMatchingObjective : public Objective {
 public:
  explicit FlowMatchingObjective(const config::Config& cfg)
      : o_(cfg.training.flow_matching), seed_(static_cast<uint64_t>(cfg.training.seed)) {
    const int64_t T = o_.num_train_timesteps;
    std::vector<double> y(static_cast<size_t>(T));
    for (int64_t k = 0; k < T; ++k) {
      const double sigma = shift(1.0 - static_cast<double>(k) / static_cast<double>(T));
      sigmas_.push_back(sigma);
      const double t = sigma * static_cast<double>(T);
      y[static_cast<size_t>(k)] = std::exp(-2 * std::pow((t - static_cast<double>(T) / 2) / static_cast<double>(T), 2));
    }
    // MindSpeed-MM's weights: shifted to 0 at their minimum, scaled to mean 1.
    const double lo = *std::min_element(y.begin(), y.end());
    double sum = 0;
    for (double& v : y) sum += (v -= lo);
    for (double v : y) weights_.push_back(o_.weighting == "gaussian" ? v * static_cast<double>(T) / sum : 1.0);
  }

  std::vector<std::string> required_fields() const override {
    return {std::string(data::kLatents), std::string(data::kSampleIds)};
  }
  std::vector<std::string> optional_fields() const override { return {std::string(data::kNullPromptEmbeds)}; }
  std::vector<std::string> provided_fields() const override {
    return {std::string(data::kNoisyLatents), std::string(data::kTimesteps), std::string(data::kFlowTarget)};
  }
  std::string normalised_by() const override { return "samples"; }
  double count(const data::Batch& host) const override {
    return static_cast<double>(host.require(data::kLatents).size(0));
  }

  void prepare(data::Batch& b, int64_t step) const override {
    const at::Tensor x0 = b.require(data::kLatents);
    const at::Tensor ids = b.require(data::kSampleIds).to(at::kCPU).to(at::kLong).contiguous();
    MM_CHECK(ids.numel() == x0.size(0), "flow_matching: ", ids.numel(), " sample ids for ", x0.size(0), " latents");
    const bool validation = step == kValidationStep;
    const int64_t repeats = validation ? kBuckets : 1;
    const int64_t n = x0.size(0) * repeats;
    std::vector<int64_t> shape = x0.sizes().vec();
    shape[0] = 1;
    std::vector<at::Tensor> noise;
    std::vector<double> sigma(static_cast<size_t>(n)), weight(static_cast<size_t>(n), 1.0);
    std::vector<bool> drop(static_cast<size_t>(x0.size(0)), false);
    for (int64_t i = 0; i < x0.size(0); ++i) {
      const uint64_t id = static_cast<uint64_t>(ids[i].item<int64_t>());
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(draw_seed(seed_, step, id));
      if (validation) {
        const at::Tensor z = at::randn(shape, gen);
        for (int64_t j = 0; j < kBuckets; ++j) {
          noise.push_back(z);
          sigma[static_cast<size_t>(i * kBuckets + j)] = (static_cast<double>(j) + 0.5) / kBuckets;
        }
      } else {
        const int64_t k = at::randint(o_.num_train_timesteps, {1}, gen).item<int64_t>();
        sigma[static_cast<size_t>(i)] = sigmas_[static_cast<size_t>(k)];
        weight[static_cast<size_t>(i)] = weights_[static_cast<size_t>(k)];
        noise.push_back(at::randn(shape, gen));
        if (o_.text_dropout > 0) drop[static_cast<size_t>(i)] = at::rand({1}, gen).item<double>() < o_.text_dropout;
      }
    }
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const at::Tensor s = at::tensor(sigma, f32).to(x0.device());
    const at::Tensor z = at::cat(noise, 0).to(x0.device());
    at::Tensor clean = x0.to(at::kFloat);
    if (repeats > 1) {
      clean = clean.repeat_interleave(repeats, 0);
      for (std::string_view f : {data::kPromptEmbeds, data::kSampleIds})
        if (b.has(f)) b.set(f, b[f].repeat_interleave(repeats, 0), f == data::kSampleIds);
    }
    std::vector<int64_t> bshape(static_cast<size_t>(clean.dim()), 1);
    bshape[0] = n;
    const at::Tensor sv = s.view(bshape);
    b.set(data::kNoisyLatents, ((1 - sv) * clean + sv * z).to(x0.scalar_type()));
    b.set(data::kTimesteps, s * static_cast<float>(o_.num_train_timesteps));
    b.set(data::kFlowTarget, z - clean);
    b.set(kWeights, at::tensor(weight, f32).to(x0.device()));
    if (std::find(drop.begin(), drop.end(), true) != drop.end()) {
      at::Tensor text = b.require(data::kPromptEmbeds).clone();
      const at::Tensor& null = b[data::kNullPromptEmbeds];
      for (size_t i = 0; i < drop.size(); ++i)
        if (drop[i]) {
          if (null.defined()) text[static_cast<int64_t>(i)].copy_(null.reshape(text[0].sizes()));
          else text[static_cast<int64_t>(i)].zero_();
        }
      b.set(data::kPromptEmbeds, text);
    }
  }

  at::Tensor loss_sum(const models::Outputs& out, const data::Batch& b) const override {
    return (per_sample_mse(out, b) * b.require(kWeights)).sum();
  }

  EvalSums eval_sums(const models::Outputs& out, const data::Batch& b) const override {
    const at::Tensor mse = per_sample_mse(out, b).to(at::kDouble);
    const int64_t n = mse.size(0);
    // Sample-major, bucket-minor (prepare's order): [n / 4, 4] summed over samples.
    const at::Tensor by_bucket = mse.view({n / kBuckets, kBuckets}).sum(0);
    const at::Tensor counts = at::full({kBuckets}, static_cast<double>(n / kBuckets), mse.options());
    return {mse.sum(), at::scalar_tensor(static_cast<double>(n), mse.options()), at::cat({by_bucket, counts})};
  }

  int64_t eval_parts_size() const override { return 2 * kBuckets; }

  Report eval_parts(const std::vector<double>& parts) const override {
    Report r;
    std::string text = "by timestep";
    const int64_t width = o_.num_train_timesteps / kBuckets;
    for (int64_t j = 0; j < kBuckets; ++j) {
      const double count = parts[static_cast<size_t>(kBuckets + j)];
      if (count <= 0) continue;
      const double loss = parts[static_cast<size_t>(j)] / count;
      const std::string name = cat("[", j * width, ",", (j + 1) * width, ")");
      text += cat(j == 0 ? " " : ", ", name, " ", fixed(loss, 4));
      r.record[cat("val_loss_t", j * width, "_", (j + 1) * width)] = loss;
    }
    r.text = text;
    return r;
  }

  std::string describe(double loss) const override { return cat("loss ", fixed(loss, 4)); }

 private:
  double shift(double sigma) const { return o_.shift * sigma / (1 + (o_.shift - 1) * sigma); }

  // Each sample's mean squared error of the prediction against noise - x0, fp32 [B].
  static at::Tensor per_sample_mse(const models::Outputs& out, const data::Batch& b) {
    const at::Tensor pred = out[models::kPrediction].to(at::kFloat);
    const at::Tensor& target = b.require(data::kFlowTarget);
    MM_CHECK(pred.sizes() == target.sizes(), "flow_matching: the model predicted ", pred.sizes(), " for targets ",
             target.sizes());
    return (pred - target).pow(2).flatten(1).mean(1);
  }

  config::FlowMatchingConfig o_;
  uint64_t seed_;
  std::vector<double> sigmas_, weights_;
};

Registrar flow_matching(objective_registry(), "flow_matching",
                        [](const config::Config& cfg) -> std::unique_ptr<Objective> {
                          return std::make_unique<FlowMatchingObjective>(cfg);
                        });

}  // namespace
}  // namespace mm::training
