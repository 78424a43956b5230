#include "mindspeed_mm/training/evaluation.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "mindspeed_mm/training/train_step.h"

namespace mm::training {

double evaluate(models::Model& model, const Objective& objective, const data::ValPass& val, int64_t batch_size,
                int64_t max_batches, bool bf16, DataParallelModel* dp, const TrainParallel* par,
                PipelineRunner* pipeline, std::vector<double>* parts, const InputEncoder* encoder,
                std::vector<std::pair<std::string, data::Image>>* images) {
  at::NoGradGuard no_grad;
  const at::Device device = model_device(model);
  AutocastScope autocast(bf16, device.type());
  // Summed on the device; read once at the end.
  at::Tensor sum_t = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  at::Tensor count_t = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  const int64_t shard = dp ? dp->eval_shard() : 0, num_shards = dp ? dp->eval_num_shards() : 1;
  const int64_t n_parts = objective.eval_parts_size();
  at::Tensor parts_t = at::zeros({n_parts}, at::TensorOptions().dtype(at::kDouble).device(device));
  bool first = true;
  val(batch_size, max_batches, shard, num_shards, [&](const data::Batch& host) {
    data::Batch b = data::batch_to_device(dp ? dp->shard_batch(host) : host, device);
    if (encoder) encoder->encode(b, b);
    objective.prepare(b, Objective::kValidationStep);
    if (dp) dp->begin_forward(b);
    EvalSums s;
    if (pipeline) {
      s = pipeline->eval_sums(b, objective);
    } else {
      const models::Outputs out = model.forward(b);
      s = objective.eval_sums(out, b);
      if (images && first && shard == 0) *images = objective.eval_images(out, b);
    }
    first = false;
    sum_t.add_(s.sum.to(at::kDouble));
    count_t.add_(s.count.to(at::kDouble));
    if (n_parts > 0) parts_t.add_(s.parts.to(at::kDouble));
  });
  std::vector<double> totals = {sum_t.item<double>(), count_t.item<double>()};
  if (n_parts > 0) {
    const at::Tensor p = parts_t.cpu().contiguous();
    totals.insert(totals.end(), p.data_ptr<double>(), p.data_ptr<double>() + n_parts);
  }
  if (dp) dp->end_eval();
  // The same length on every rank (eval_parts_size), whether or not its shard had batches.
  // Context-parallel ranks hold shards of the same batches: their sums add up too.
  if (par && num_shards > 1) totals = par->grad_sum(totals);
  else if (par && par->cp_size() > 1) totals = par->cp_sum(totals);
  if (parts) parts->assign(totals.begin() + 2, totals.end());
  return totals[1] > 0 ? totals[0] / totals[1] : NAN;
}

}  // namespace mm::training
