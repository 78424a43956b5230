// Optimizers. Parameters come in groups (a learning-rate multiplier and a weight-decay switch
// each); state is exposed as named tensors so checkpoints save and reload it bit for bit.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/registry.h"

namespace mm::training {

struct ParamGroup {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  double lr_scale = 1.0;
  bool weight_decay = true;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update at learning rate `lr` (before each group's lr_scale).
  virtual void step(double lr) = 0;
  // State as (name, tensor) pairs, e.g. "exp_avg.model.norm.weight"; scalars as 0-dim tensors.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() const = 0;
  // Restores state saved by state(); a missing or mis-shaped entry is an mm::Error naming it.
  virtual void load_state(const std::function<at::Tensor(const std::string&)>& get) = 0;
  void zero_grad();
  const std::vector<ParamGroup>& groups() const { return groups_; }

 protected:
  std::vector<ParamGroup> groups_;
};

// AdamW exactly as torch.optim.AdamW (decoupled weight decay, bias correction, eps outside
// the square root), updating in place.
class AdamW : public Optimizer {
 public:
  // fused: fp32 parameters are updated by ATen's _fused_adamw_ (one multi-tensor kernel per
  // group on CUDA, a vectorised loop on the CPU); the same update as the for-loop path up to
  // floating-point rounding. Other parameters always take the for-loop path.
  AdamW(std::vector<ParamGroup> groups, double beta1, double beta2, double eps, double weight_decay, bool fused = false);
  void step(double lr) override;
  std::vector<std::pair<std::string, at::Tensor>> state() const override;
  void load_state(const std::function<at::Tensor(const std::string&)>& get) override;
  int64_t step_count() const { return step_; }
  bool fused() const { return fused_; }

 private:
  double beta1_, beta2_, eps_, weight_decay_;
  bool fused_;
  int64_t step_ = 0;
  std::vector<std::vector<at::Tensor>> exp_avg_, exp_avg_sq_;
};

using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>, const config::OptimizerConfig&)>;
Registry<OptimizerFactory>& optimizer_registry();

// training.optimizer.implementation for parameters on `device`: fused for "fused", and for "auto"
// on CUDA; the for-loop path otherwise.
bool use_fused_optimizer(const std::string& implementation, const at::Device& device);

// Splits trainable parameters into the usual two groups: weight decay for matrices, none for
// biases, norms and other 1-D tensors; with lr_multipliers ("PATTERN=MULT", e.g.
// "visual.merger=10": a module-path pattern, see core/pattern.h, matched against the parameter's
// name and every module path above it; the first rule that matches wins), each (multiplier,
// decay) pair gets its own group. ConfigError for a malformed rule, a multiplier < 0, or a
// pattern that matches no trainable parameter.
std::vector<ParamGroup> default_param_groups(const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                                             const std::vector<std::string>& lr_multipliers = {});

// Global L2 norm of all gradients (fp32 accumulation); scales them so the norm is <= max_norm
// when max_norm > 0. Returns the norm before clipping.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace mm::training
