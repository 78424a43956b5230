#include "mindspeed_mm/training/optimizer.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "mindspeed_mm/core/pattern.h"

namespace mm::training {

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params)
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

AdamW::AdamW(std::vector<ParamGroup> groups, double beta1, double beta2, double eps, double weight_decay, bool fused)
    : beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay), fused_(fused) {
  groups_ = std::move(groups);
  for (auto& g : groups_) {
    exp_avg_.emplace_back();
    exp_avg_sq_.emplace_back();
    for (auto& p : g.params) {
      exp_avg_.back().push_back(at::zeros_like(p, p.options().dtype(at::kFloat)));
      exp_avg_sq_.back().push_back(at::zeros_like(p, p.options().dtype(at::kFloat)));
    }
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_;
  const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(step_));
  const double bc2_sqrt = std::sqrt(bc2);
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& g = groups_[gi];
    const double glr = lr * g.lr_scale;
    const double wd = g.weight_decay ? weight_decay_ : 0.0;
    std::vector<bool> done(g.params.size(), false);
    if (fused_) {
      // Every fp32 parameter with an fp32 gradient, per device, in one call. The step count is
      // the optimizer's (as on the for-loop path), handed over as a float tensor per parameter.
      std::vector<std::pair<at::Device, std::vector<size_t>>> by_device;
      for (size_t i = 0; i < g.params.size(); ++i) {
        const at::Tensor& p = g.params[i];
        if (p.grad().defined() && p.scalar_type() == at::kFloat && p.grad().scalar_type() == at::kFloat &&
            p.grad().layout() == at::kStrided)
        {
          auto it = std::find_if(by_device.begin(), by_device.end(), [&](const auto& d) { return d.first == p.device(); });
          if (it == by_device.end()) by_device.push_back({p.device(), {i}});
          else it->second.push_back(i);
        }
      }
      for (auto& [device, idx] : by_device) {
        std::vector<at::Tensor> ps, gs, ms, vs, steps;
        at::Tensor step = at::full({}, static_cast<double>(step_), at::TensorOptions().dtype(at::kFloat).device(device));
        for (size_t i : idx) {
          ps.push_back(g.params[i]);
          gs.push_back(g.params[i].grad());
          ms.push_back(exp_avg_[gi][i]);
          vs.push_back(exp_avg_sq_[gi][i]);
          steps.push_back(step);
          done[i] = true;
        }
        at::_fused_adamw_(ps, gs, ms, vs, /*max_exp_avg_sqs=*/{}, steps, glr, beta1_, beta2_, wd, eps_,
                          /*amsgrad=*/false, /*maximize=*/false);
      }
    }
    for (size_t i = 0; i < g.params.size(); ++i) {
      at::Tensor p = g.params[i];
      if (done[i] || !p.grad().defined()) continue;
      at::Tensor grad = p.grad().to(at::kFloat);
      at::Tensor& m = exp_avg_[gi][i];
      at::Tensor& v = exp_avg_sq_[gi][i];
      // Same order of operations as torch.optim.AdamW's single-tensor path.
      if (wd != 0) p.mul_(1.0 - glr * wd);
      m.mul_(beta1_).add_(grad, 1.0 - beta1_);
      v.mul_(beta2_).addcmul_(grad, grad, 1.0 - beta2_);
      at::Tensor denom = (v.sqrt() / bc2_sqrt).add_(eps_);
      if (p.scalar_type() == at::kFloat) {
        p.addcdiv_(m, denom, -glr / bc1);
      } else {
        p.copy_(p.to(at::kFloat).addcdiv_(m, denom, -glr / bc1));
      }
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("step", at::scalar_tensor(step_, at::kLong));
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
      out.emplace_back("exp_avg." + groups_[gi].names[i], exp_avg_[gi][i]);
      out.emplace_back("exp_avg_sq." + groups_[gi].names[i], exp_avg_sq_[gi][i]);
    }
  return out;
}

void AdamW::load_state(const std::function<at::Tensor(const std::string&)>& get) {
  at::NoGradGuard no_grad;
  step_ = get("step").item<int64_t>();
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
      for (auto* store : {&exp_avg_, &exp_avg_sq_}) {
        std::string name = (store == &exp_avg_ ? "exp_avg." : "exp_avg_sq.") + groups_[gi].names[i];
        at::Tensor t = get(name);
        at::Tensor& dst = (*store)[gi][i];
        MM_CHECK(t.sizes() == dst.sizes(), "optimizer state '", name, "' has shape ", t.sizes(), ", expected ",
                 dst.sizes());
        dst.copy_(t);
      }
    }
}

Registry<OptimizerFactory>& optimizer_registry() {
  static Registry<OptimizerFactory> r("optimizer");
  return r;
}

namespace {
Registrar adamw_registrar(optimizer_registry(), "adamw",
                          [](std::vector<ParamGroup> groups, const config::OptimizerConfig& c) {
                            bool fused = false;
                            for (auto& g : groups)
                              for (auto& p : g.params) fused = fused || use_fused_optimizer(c.implementation, p.device());
                            return std::make_unique<AdamW>(std::move(groups), c.betas.at(0), c.betas.at(1), c.eps,
                                                           c.weight_decay, fused);
                          });
}  // namespace

bool use_fused_optimizer(const std::string& implementation, const at::Device& device) {
  return implementation == "fused" || (implementation == "auto" && device.is_cuda());
}

std::vector<ParamGroup> default_param_groups(const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                                             const std::vector<std::string>& lr_multipliers) {
  std::vector<std::pair<PathPattern, double>> rules;
  for (const auto& r : lr_multipliers) {
    const size_t eq = r.rfind('=');
    double mult = -1;
    if (eq != std::string::npos && eq > 0) {
      try {
        size_t used = 0;
        mult = std::stod(r.substr(eq + 1), &used);
        if (used != r.size() - eq - 1) mult = -1;
      } catch (const std::exception&) {
        mult = -1;
      }
    }
    if (!(mult >= 0))
      throw ConfigError(cat("config: training.optimizer.lr_multipliers entry '", r,
                            "' must be PATTERN=MULTIPLIER with a multiplier >= 0, e.g. visual.merger=10"));
    rules.emplace_back(PathPattern(r.substr(0, eq)), mult);
  }
  std::vector<bool> used(rules.size(), false);
  auto multiplier = [&](const std::string& name) {
    std::vector<std::string> paths = {name};  // the parameter, then each module above it
    for (size_t dot = name.rfind('.'); dot != std::string::npos && dot > 0; dot = name.rfind('.', dot - 1))
      paths.push_back(name.substr(0, dot));
    for (size_t i = 0; i < rules.size(); ++i)
      for (const auto& path : paths)
        if (rules[i].first.matches(path)) {
          used[i] = true;
          return rules[i].second;
        }
    return 1.0;
  };
  std::vector<ParamGroup> out;
  auto group_for = [&](double scale, bool decay) -> ParamGroup& {
    for (auto& g : out)
      if (g.lr_scale == scale && g.weight_decay == decay) return g;
    out.push_back({});
    out.back().lr_scale = scale;
    out.back().weight_decay = decay;
    return out.back();
  };
  // Groups in first-use order with the decay group of the default scale first, as before.
  if (rules.empty()) {
    group_for(1.0, true);
    group_for(1.0, false);
  }
  for (auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;
    ParamGroup& g = group_for(multiplier(name), p.dim() >= 2);
    g.names.push_back(name);
    g.params.push_back(p);
  }
  for (size_t i = 0; i < rules.size(); ++i)
    if (!used[i])
      throw ConfigError(cat("config: training.optimizer.lr_multipliers pattern '", rules[i].first.str(),
                            "' matches no trainable parameter"));
  out.erase(std::remove_if(out.begin(), out.end(), [](const ParamGroup& g) { return g.params.empty(); }), out.end());
  return out;
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  // Summed in fp64 on the parameters' device; one transfer at the end (no sync per parameter).
  at::Tensor sq;
  for (auto& p : params) {
    if (!p.grad().defined()) continue;
    at::Tensor s = p.grad().to(at::kFloat).pow(2).sum().to(at::kDouble);
    sq = sq.defined() ? sq.add_(s) : s;
  }
  double norm = sq.defined() ? std::sqrt(sq.item<double>()) : 0.0;
  if (max_norm > 0 && norm > max_norm) {
    // Same coefficient as torch.nn.utils.clip_grad_norm_.
    double coef = max_norm / (norm + 1e-6);
    for (auto& p : params)
      if (p.grad().defined()) p.grad().mul_(coef);
  }
  return norm;
}

}  // namespace mm::training
