// One optimizer step, the same for `mm train`, the benchmarks and the tests: for each
// micro-batch a forward (under bf16 autocast when asked), the objective's summed loss divided by
// the step's global normaliser, and backward (data-parallel communication on the last
// micro-batch for DDP, on every one for FSDP); then the global gradient norm and clipping, the
// optimizer update at `lr`, and zero_grad.
//
// The normaliser is global: every micro-batch's summed loss is divided by the objective's count
// over the whole step on all data-parallel ranks, and the data-parallel reduction sums the
// gradients, so the update is the same for any DP size and accumulation count.
#pragma once

#include <functional>
#include <vector>

#include "mindspeed_mm/models/model.h"
#include "mindspeed_mm/training/data_parallel.h"
#include "mindspeed_mm/training/device_batches.h"
#include "mindspeed_mm/training/objectives/objective.h"
#include "mindspeed_mm/training/optimizer.h"
#include "mindspeed_mm/training/pipeline.h"

namespace mm::training {

// What a step runs on.
struct StepEnv {
  models::Model& model;
  const Objective& objective;
  DataParallelModel& dp;
  Optimizer& optimizer;
  const TrainParallel& par;
  bool bf16 = false;      // bf16 autocast for the device's type around the forward
  double clip_grad = 0;   // max global gradient norm; 0 = no clipping
  // Pipeline parallelism: the micro-batches go through the stages by its schedule.
  PipelineRunner* pipeline = nullptr;
  // After micro-batch m's forward (the crash-mid-step tests).
  std::function<void(size_t m)> after_forward;
  // After the gradients are final and clipped, before the update (the first step's memory report).
  std::function<void()> before_update;
};

struct StepResult {
  double loss = 0;          // summed loss / normaliser over the whole step, every rank's
  double grad_norm = 0;     // before clipping
  double normaliser = 0;    // the objective's count over the step
  double input_tokens = 0;  // Model::input_tokens over the step, every rank's
  double flops = 0;         // training FLOPs of the step, every rank's
  std::vector<double> sums; // the caller's per-rank values, summed over the data-parallel ranks
};

// mm::Error when the loss is not finite (before the update: the weights are left as they were).
// iteration names the step in that message and seeds what the objective draws for it
// (Objective::prepare). local_sums ride on the step's first collective.
StepResult train_step(StepEnv& env, const std::vector<MicroBatch>& micro, double lr, int64_t iteration,
                      const std::vector<double>& local_sums = {});

// bf16 compute with fp32 weights: autocast for the device's type runs matmuls in bf16 and keeps
// reductions in fp32.
class AutocastScope {
 public:
  AutocastScope(bool on, at::DeviceType type);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_;
  at::DeviceType type_;
};

// The device of the model's first parameter (the CPU for a model without parameters).
at::Device model_device(const models::Model& model);

}  // namespace mm::training
