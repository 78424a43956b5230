// Train-step throughput of a Wan2.1 diffusion transformer in our engine: mm::training::train_step()
// itself (forward, summed per-sample mean squared error / samples, backward, grad-norm clip, AdamW
// step, zero_grad), the function `mm train` calls, on the model and inputs bench/dit_step_baseline.py
// --prepare wrote (a seeded diffusers WanTransformer3DModel and one batch of noisy latents,
// timesteps, text features and velocity targets per step). The baseline runs the same step in
// diffusers; bench/run_dit_step.sh runs both and prints the ratio. Their loss_first agree to
// rounding when both compute the same model.
//
// The flow-matching objective's own draws (noise, timesteps) are replaced here by the prepared
// ones (GivenTarget below), so both sides see the same numbers; the rest of the step is mm train's.
//
// Output: one line `RESULT impl=mm precision=... tokens_per_s=... step_ms=... loss_first=... loss_last=...`.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/core/device.h"
#include "mindspeed_mm/models/wan/wan_dit.h"
#include "mindspeed_mm/training/optimizer.h"
#include "mindspeed_mm/training/train_step.h"

namespace {

// Mean squared error of the prediction against the batch's "target", per sample, summed.
class GivenTarget : public mm::training::Objective {
 public:
  std::vector<std::string> required_fields() const override { return {"target"}; }
  std::string normalised_by() const override { return "samples"; }
  double count(const mm::data::Batch& host) const override { return static_cast<double>(host.num_samples); }
  at::Tensor loss_sum(const mm::models::Outputs& out, const mm::data::Batch& b) const override {
    const at::Tensor d = out.require_tensor(mm::models::kPrediction).to(at::kFloat) - b.require("target");
    return d.pow(2).flatten(1).mean(1).sum();
  }
  mm::training::EvalSums eval_sums(const mm::models::Outputs& out, const mm::data::Batch& b) const override {
    return {loss_sum(out, b).detach(), at::scalar_tensor(static_cast<double>(b.num_samples))};
  }
  std::string describe(double loss) const override { return std::to_string(loss); }
};

}  // namespace

int main(int argc, char** argv) {
  mm::configure_host_allocator();
  std::map<std::string, std::string> a = {{"--dir", ""},    {"--steps", "5"},          {"--warmup", "2"},
                                          {"--threads", "1"}, {"--precision", "fp32"}, {"--device", "cpu"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!a.count(argv[i])) {
      std::fprintf(stderr, "dit_step: unknown argument %s\n", argv[i]);
      return 2;
    }
    a[argv[i]] = argv[i + 1];
  }
  if (a["--dir"].empty()) {
    std::fprintf(stderr, "usage: dit_step --dir DIR [--steps 5 --warmup 2 --threads 1 --precision fp32|bf16 --device cpu]\n");
    return 2;
  }
  const int64_t steps = std::stoll(a["--steps"]), warmup = std::stoll(a["--warmup"]);
  const int threads = std::stoi(a["--threads"]);
  const bool bf16 = a["--precision"] == "bf16";
  at::set_num_threads(threads);
  try {
    const at::Device device = mm::resolve_device(a["--device"], 0, "--device");
    mm::set_current_device(device);
    const std::string tdir = a["--dir"] + "/transformer";
    auto model = std::make_shared<mm::models::WanTransformer3DModel>(
        mm::models::WanDiTConfig::from_json(mm::checkpoint::read_hf_config(tdir), tdir + "/config.json", false));
    mm::checkpoint::load_model_weights(*model, tdir, {}, [&](const std::string& k) { return model->parameter_name(k); });
    model->to(device);

    mm::config::Config cfg;
    cfg.training.precision = a["--precision"];
    mm::training::TrainParallel par(cfg.parallel, mm::parallel::DistEnv{}, device);
    mm::training::DataParallelModel dp(*model, par, cfg.parallel, device);
    GivenTarget objective;
    // torch.optim.AdamW's defaults but no weight decay, as the baseline.
    mm::training::AdamW optimizer(dp.param_groups({}), 0.9, 0.999, 1e-8, 0.0,
                                  mm::training::use_fused_optimizer("auto", device));
    mm::training::StepEnv env{*model, objective, dp, optimizer, par, bf16, 1.0};

    const mm::st::SafetensorsReader in(a["--dir"] + "/inputs.safetensors");
    std::vector<mm::training::MicroBatch> batches;
    const at::Tensor noisy = in.get_copy("noisy_latents"), t = in.get_copy("timesteps");
    const at::Tensor text = in.get_copy("prompt_embeds"), target = in.get_copy("target");
    if (noisy.size(0) < warmup + steps) throw mm::Error("dit_step: inputs.safetensors holds fewer batches than --warmup + --steps");
    for (int64_t i = 0; i < warmup + steps; ++i) {
      mm::data::Batch b;
      b.num_samples = noisy.size(1);
      b.set(mm::models::kNoisyLatents, noisy[i].contiguous());
      b.set(mm::models::kTimesteps, t[i].contiguous());
      b.set(mm::models::kPromptEmbeds, text[i].contiguous());
      b.set("target", target[i].contiguous());
      batches.push_back({b, mm::data::batch_to_device(b, device)});
    }
    double loss_first = 0, loss_last = 0;
    for (int64_t i = 0; i < warmup; ++i) {
      const double l = mm::training::train_step(env, {batches[static_cast<size_t>(i)]}, 1e-4, i).loss;
      if (i == 0) loss_first = l;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i)
      loss_last = mm::training::train_step(env, {batches[static_cast<size_t>(warmup + i)]}, 1e-4, warmup + i).loss;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens = static_cast<double>(steps) * model->input_tokens(batches.front().host);
    std::printf("RESULT impl=mm precision=%s threads=%d tokens_per_s=%.1f step_ms=%.2f loss_first=%.6f loss_last=%.6f "
                "params=%lld\n",
                a["--precision"].c_str(), threads, tokens / secs, 1e3 * secs / static_cast<double>(steps), loss_first, loss_last,
                static_cast<long long>(model->num_parameters()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dit_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
