// Samplers of flow-matching models (Wan2.1): the model predicts the velocity v = noise - x0 at
// noise level sigma (x_sigma = (1 - sigma) x0 + sigma noise), and a scheduler walks sigma from 1
// to 0. Schedulers register by name (`mm sample --scheduler`); each reproduces a diffusers
// scheduler exactly, as Wan's diffusers pipelines configure it:
//   euler  FlowMatchEulerDiscreteScheduler(shift): timesteps linspace(1000 sigma_max, 1000 sigma_min,
//          n) of the shifted training schedule, shifted again; x <- x + (sigma_next - sigma) v.
//   unipc  UniPCMultistepScheduler(prediction_type flow_prediction, use_flow_sigmas, flow_shift,
//          solver_order 2, solver_type bh2, predict_x0, lower_order_final, final_sigmas_type zero):
//          sigmas linspace(1, 1/1000, n + 1)[:-1] shifted, integer timesteps 1000 sigma, a
//          UniPC predictor on the x0 predictions x - sigma v and a corrector after every step
//          but the first.
// The shift: sigma' = s sigma / (1 + (s - 1) sigma).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/core/registry.h"

namespace mm::inference {

// The shifted noise level.
double shift_sigma(double sigma, double shift);

struct FlowSchedulerOptions {
  int64_t steps = 50;
  double shift = 5.0;
  int64_t num_train_timesteps = 1000;
};

class FlowScheduler {
 public:
  virtual ~FlowScheduler() = default;
  // The timesteps the model sees, one per step, and the noise levels: steps + 1 values ending in 0.
  const std::vector<double>& timesteps() const { return timesteps_; }
  const std::vector<double>& sigmas() const { return sigmas_; }
  int64_t steps() const { return static_cast<int64_t>(timesteps_.size()); }
  int64_t step_index() const { return index_; }
  // The sample after step step_index() given the model's velocity at it (fp32 arithmetic, the
  // sample's dtype out), and advances.
  virtual at::Tensor step(const at::Tensor& velocity, const at::Tensor& sample) = 0;

 protected:
  std::vector<double> timesteps_, sigmas_;
  int64_t index_ = 0;
};

using FlowSchedulerFactory = std::function<std::unique_ptr<FlowScheduler>(const FlowSchedulerOptions&)>;
Registry<FlowSchedulerFactory>& flow_scheduler_registry();

// By name, or ConfigError naming `what` (the option) with the names there are.
std::unique_ptr<FlowScheduler> make_flow_scheduler(const std::string& name, const FlowSchedulerOptions& options,
                                                   const std::string& what = "--scheduler");

}  // namespace mm::inference
