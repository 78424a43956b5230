// Learning-rate schedules: linear warmup from 0, then cosine / linear decay to min_lr, or constant.
// A schedule is a pure function of the iteration, so resuming needs only the iteration count.
#pragma once

#include <functional>
#include <string>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/registry.h"

namespace mm::training {

// lr at iteration `it` (0-based count of finished updates) for peak `lr` over `total` iterations.
using LRSchedule = std::function<double(int64_t it)>;
using LRScheduleFactory = std::function<LRSchedule(const config::LRScheduleConfig&, double lr, int64_t total)>;
Registry<LRScheduleFactory>& lr_schedule_registry();

LRSchedule make_lr_schedule(const config::LRScheduleConfig& c, double lr, int64_t train_iters);

}  // namespace mm::training
