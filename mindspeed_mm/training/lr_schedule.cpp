#include "mindspeed_mm/training/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace mm::training {

Registry<LRScheduleFactory>& lr_schedule_registry() {
  static Registry<LRScheduleFactory> r("lr_schedule");
  return r;
}

namespace {

// Warmup: lr * (it + 1) / warmup for the first `warmup` iterations (Megatron's rule), then
// decay(progress) with progress in [0, 1] over the decay window, clamped at the end.
LRScheduleFactory with_warmup(std::function<double(double progress)> shape) {
  return [shape](const config::LRScheduleConfig& c, double lr, int64_t total) -> LRSchedule {
    const int64_t warmup = c.warmup_iters;
    const int64_t decay_end = c.decay_iters > 0 ? c.decay_iters : total;
    const double min_lr = c.min_lr;
    return [=](int64_t it) {
      if (it < warmup) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup);
      const int64_t span = std::max<int64_t>(1, decay_end - warmup);
      const double progress = std::clamp(static_cast<double>(it - warmup) / static_cast<double>(span), 0.0, 1.0);
      return min_lr + (lr - min_lr) * shape(progress);
    };
  };
}

const double kPi = 3.14159265358979323846;
Registrar cosine(lr_schedule_registry(), "cosine", with_warmup([](double p) { return 0.5 * (1.0 + std::cos(kPi * p)); }));
Registrar linear(lr_schedule_registry(), "linear", with_warmup([](double p) { return 1.0 - p; }));
Registrar constant(lr_schedule_registry(), "constant", with_warmup([](double) { return 1.0; }));

}  // namespace

LRSchedule make_lr_schedule(const config::LRScheduleConfig& c, double lr, int64_t train_iters) {
  return lr_schedule_registry().get(c.id, "training.lr_schedule.id")(c, lr, train_iters);
}

}  // namespace mm::training
