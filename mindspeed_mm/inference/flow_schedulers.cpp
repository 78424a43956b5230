#include "mindspeed_mm/inference/flow_schedulers.h"

#include <cmath>

#include "mindspeed_mm/core/errors.h"

namespace mm::inference {

double shift_sigma(double sigma, double shift) { return shift * sigma / (1 + (shift - 1) * sigma); }

Registry<FlowSchedulerFactory>& flow_scheduler_registry() {
  static Registry<FlowSchedulerFactory> r("scheduler");
  return r;
}

std::unique_ptr<FlowScheduler> make_flow_scheduler(const std::string& name, const FlowSchedulerOptions& o,
                                                   const std::string& what) {
  if (o.steps < 1) throw ConfigError(cat("config: ", what, ": steps must be at least 1 (got ", o.steps, ")"));
  if (!(o.shift > 0)) throw ConfigError(cat("config: ", what, ": shift must be > 0 (got ", o.shift, ")"));
  return flow_scheduler_registry().get(name, what)(o);
}

namespace {

// numpy.linspace(start, stop, num): start + i * step, the last value exactly stop.
std::vector<double> linspace(double start, double stop, int64_t num) {
  std::vector<double> v(static_cast<size_t>(num));
  const double step = num > 1 ? (stop - start) / static_cast<double>(num - 1) : 0;
  for (int64_t i = 0; i < num; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i) * step;
  if (num > 1) v.back() = stop;
  return v;
}

float f32(double v) { return static_cast<float>(v); }

// FlowMatchEulerDiscreteScheduler: its training schedule (linspace(1, 1000, 1000) / 1000,
// shifted, in fp32) gives sigma_max and sigma_min; the sampling timesteps run linearly between
// them and are shifted again, as diffusers does.
class EulerScheduler : public FlowScheduler {
 public:
  explicit EulerScheduler(const FlowSchedulerOptions& o) {
    const double n = static_cast<double>(o.num_train_timesteps);
    const double sigma_max = f32(shift_sigma(f32(n / n), o.shift));
    const double sigma_min = f32(shift_sigma(f32(1.0 / n), o.shift));
    for (double t : linspace(sigma_max * n, sigma_min * n, o.steps)) {
      const float s = f32(shift_sigma(t / n, o.shift));
      sigmas_.push_back(s);
      timesteps_.push_back(f32(s * static_cast<float>(n)));
    }
    sigmas_.push_back(0);
  }

  at::Tensor step(const at::Tensor& velocity, const at::Tensor& sample) override {
    MM_CHECK(index_ < steps(), "scheduler: step ", index_ + 1, " of ", steps());
    const float dt = f32(sigmas_[static_cast<size_t>(index_ + 1)]) - f32(sigmas_[static_cast<size_t>(index_)]);
    ++index_;
    return (sample.to(at::kFloat) + dt * velocity.to(at::kFloat)).to(sample.scalar_type());
  }
};

// UniPCMultistepScheduler for flow prediction (Wan's diffusers configuration): order 2, bh2,
// predicting x0, lower order at the last step, final sigma 0. Scalars in double from the fp32
// sigmas; tensors in fp32.
class UniPCScheduler : public FlowScheduler {
 public:
  explicit UniPCScheduler(const FlowSchedulerOptions& o) {
    const double n = static_cast<double>(o.num_train_timesteps);
    std::vector<double> s = linspace(1.0, 1.0 / n, o.steps + 1);
    s.pop_back();
    for (double& v : s) v = shift_sigma(v, o.shift);
    if (std::fabs(s[0] - 1) < 1e-6) s[0] -= 1e-6;  // keeps log(sigma) finite at the start
    for (double v : s) {
      timesteps_.push_back(static_cast<double>(static_cast<int64_t>(v * n)));  // numpy -> int64 truncates
      sigmas_.push_back(f32(v));
    }
    sigmas_.push_back(0);
  }

  at::Tensor step(const at::Tensor& velocity, const at::Tensor& sample_in) override {
    MM_CHECK(index_ < steps(), "scheduler: step ", index_ + 1, " of ", steps());
    const at::Tensor sample = sample_in.to(at::kFloat);
    const at::Tensor m = sample - static_cast<float>(sigma(index_)) * velocity.to(at::kFloat);  // x0 prediction
    at::Tensor x = sample;
    if (index_ > 0 && last_sample_.defined()) x = correct(m, x);
    prev_m_ = last_m_;
    last_m_ = m;
    const int order = std::min<int>(std::min<int64_t>(2, steps() - index_), lower_order_nums_ + 1);
    this_order_ = order;
    last_sample_ = x;
    at::Tensor out = predict(x, order);
    lower_order_nums_ = std::min(lower_order_nums_ + 1, 2);
    ++index_;
    return out.to(sample_in.scalar_type());
  }

 private:
  double sigma(int64_t i) const { return sigmas_[static_cast<size_t>(i)]; }
  static double lambda(double s) { return std::log(1 - s) - std::log(s); }

  // h phi_k terms of the bh2 solver: b_1, b_2 and B(h) for hh = -h.
  struct Terms {
    double hh, h_phi_1, B_h, b1, b2;
  };
  static Terms terms(double h) {
    Terms t;
    t.hh = -h;
    t.h_phi_1 = std::expm1(t.hh);
    t.B_h = std::expm1(t.hh);
    double h_phi_k = t.h_phi_1 / t.hh - 1;
    t.b1 = h_phi_k / t.B_h;
    h_phi_k = h_phi_k / t.hh - 0.5;
    t.b2 = h_phi_k * 2 / t.B_h;
    return t;
  }

  // From sample x at sigma[index_] to sigma[index_ + 1] with the x0 predictions last_m_ (and prev_m_).
  at::Tensor predict(const at::Tensor& x, int order) const {
    const double s_t = sigma(index_ + 1), s_0 = sigma(index_);
    const double a_t = 1 - s_t;
    const double h = lambda(s_t) - lambda(s_0);
    const Terms k = terms(h);
    at::Tensor out = static_cast<float>(s_t / s_0) * x - static_cast<float>(a_t * k.h_phi_1) * last_m_;
    if (order == 2) {
      const double rk = (lambda(sigma(index_ - 1)) - lambda(s_0)) / h;
      const at::Tensor d1 = (prev_m_ - last_m_) / static_cast<float>(rk);
      out = out - static_cast<float>(a_t * k.B_h * 0.5) * d1;
    }
    return out;
  }

  // The corrector: the step just taken (sigma[index_ - 1] -> sigma[index_], from last_sample_)
  // redone with the new x0 prediction m.
  at::Tensor correct(const at::Tensor& m, const at::Tensor& x_t) const {
    const double s_t = sigma(index_), s_0 = sigma(index_ - 1);
    const double a_t = 1 - s_t;
    const double h = lambda(s_t) - lambda(s_0);
    const Terms k = terms(h);
    at::Tensor out = static_cast<float>(s_t / s_0) * last_sample_ - static_cast<float>(a_t * k.h_phi_1) * last_m_;
    const at::Tensor d1_t = m - last_m_;
    if (this_order_ == 1) return out - static_cast<float>(a_t * k.B_h * 0.5) * d1_t;
    // rhos_c solves [[1, 1], [rk, 1]] rho = [b1, b2].
    const double rk = (lambda(sigma(index_ - 2)) - lambda(s_0)) / h;
    const double rho0 = (k.b1 - k.b2) / (1 - rk), rho1 = k.b1 - rho0;
    const at::Tensor d1 = (prev_m_ - last_m_) / static_cast<float>(rk);
    return out - static_cast<float>(a_t * k.B_h) * (static_cast<float>(rho0) * d1 + static_cast<float>(rho1) * d1_t);
  }

  at::Tensor last_m_, prev_m_, last_sample_;
  int this_order_ = 1, lower_order_nums_ = 0;
};

const Registrar kEuler(flow_scheduler_registry(), "euler",
                       [](const FlowSchedulerOptions& o) { return std::unique_ptr<FlowScheduler>(new EulerScheduler(o)); });
const Registrar kUniPC(flow_scheduler_registry(), "unipc",
                       [](const FlowSchedulerOptions& o) { return std::unique_ptr<FlowScheduler>(new UniPCScheduler(o)); });

}  // namespace

}  // namespace mm::inference
