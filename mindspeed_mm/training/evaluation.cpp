#include "mindspeed_mm/training/evaluation.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "mindspeed_mm/training/train_step.h"

namespace mm::training {

double evaluate(models::Model& model, const Objective& objective, const data::ValPass& val, int64_t batch_size,
                int64_t max_batches, bool bf16, DataParallelModel* dp, const TrainParallel* par,
                PipelineRunner* pipeline) {
  at::NoGradGuard no_grad;
  const at::Device device = model_device(model);
  AutocastScope autocast(bf16, device.type());
  // Summed on the device; read once at the end.
  at::Tensor sum_t = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor count_t = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  const int64_t shard = dp ? dp->eval_shard() : 0, num_shards = dp ? dp->eval_num_shards() : 1;
  val(batch_size, max_batches, shard, num_shards, [&](const data::Batch& host) {
    const data::Batch b = data::batch_to_device(host, device);
    if (dp) dp->begin_forward();
    EvalSums s = pipeline ? pipeline->eval_sums(b, objective) : objective.eval_sums(model.forward(b), b);
    sum_t.add_(s.sum.to(at::kDouble));
    count_t.add_(s.count.to(at::kDouble));
  });
  double sum = sum_t.item<double>();
  double count = count_t.item<double>();
  if (dp) dp->end_eval();
  if (par && num_shards > 1) {
    auto total = par->dp_sum({sum, count});
    sum = total[0];
    count = total[1];
  }
  return count > 0 ? sum / count : NAN;
}

}  // namespace mm::training
