#include "mindspeed_mm/training/train_step.h"

#include <cmath>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/torch_compat.h"
#include "mindspeed_mm/tools/trace.h"

namespace mm::training {

AutocastScope::AutocastScope(bool on, at::DeviceType type) : on_(on), type_(type) {
  if (on_) compat::set_autocast(type_, true, at::kBFloat16);
}

AutocastScope::~AutocastScope() {
  if (on_) {
    compat::set_autocast(type_, false, at::kBFloat16);
    at::autocast::clear_cache();
  }
}

at::Device model_device(const models::Model& model) {
  for (auto& p : model.parameters()) return p.device();
  return at::kCPU;
}

StepResult train_step(StepEnv& env, const std::vector<MicroBatch>& micro, double lr, int64_t iteration,
                      const std::vector<double>& local_sums) {
  MM_CHECK(!micro.empty(), "train_step: no micro-batches");
  const at::DeviceType device_type = model_device(env.model).type();
  // Local counts from the host copies (no device sync), summed over the ranks in one collective.
  std::vector<double> local = {0, 0, 0};
  for (const auto& mb : micro) {
    local[0] += env.objective.count(mb.host);
    local[1] += mb.input_tokens >= 0 ? mb.input_tokens : env.model.input_tokens(mb.host);
    local[2] += (mb.model_flops >= 0 ? mb.model_flops : env.model.training_flops(mb.host)) + mb.extra_flops;
  }
  local.insert(local.end(), local_sums.begin(), local_sums.end());
  // Over the data-parallel ranks and their context-parallel peers (each has a shard's counts).
  const std::vector<double> global = env.par.grad_sum(local);
  StepResult r;
  r.normaliser = global[0];
  r.input_tokens = global[1];
  r.flops = global[2];
  r.sums.assign(global.begin() + 3, global.end());
  const double normaliser = std::max(1.0, r.normaliser);

  // What the objective draws for this step's samples (noise, timesteps), on every stage alike.
  std::vector<data::Batch> batches;
  for (const auto& mb : micro) {
    batches.push_back(mb.device);
    env.objective.prepare(batches.back(), iteration);
  }
  at::Tensor loss_sum;  // summed on the device, read once after the step's backward passes
  if (env.pipeline) {
    tools::TraceScope phase("forward_backward", "phase", {{"schedule", "pipeline"}});
    loss_sum = at::tensor(env.pipeline->run_step(batches, env.objective, normaliser, env.bf16), at::kDouble);
  }
  for (size_t m = 0; m < micro.size() && !env.pipeline; ++m) {
    const data::Batch& b = batches[m];
    models::Outputs out;
    at::Tensor sum;
    {
      tools::TraceScope phase("forward", "phase", {{"micro_batch", m}});
      {
        AutocastScope autocast(env.bf16, device_type);
        env.dp.begin_forward(b);
        out = env.model.forward(b);
      }
      if (env.after_forward) env.after_forward(m);
      sum = env.objective.loss_sum(out, b);
    }
    // DDP reduces once per step, after the last micro-batch; FSDP after every one.
    {
      tools::TraceScope phase("backward", "phase", {{"micro_batch", m}});
      env.dp.prepare_backward(sum / normaliser, m + 1 == micro.size()).backward();
    }
    at::Tensor s = sum.detach().to(at::kDouble);
    loss_sum = loss_sum.defined() ? loss_sum + s : s;
  }
  r.loss = env.par.grad_sum({loss_sum.item<double>()})[0] / normaliser;
  if (!std::isfinite(r.loss))
    throw Error(cat("training: loss is ", r.loss, " at iteration ", iteration + 1,
                    "; lower training.optimizer.lr or check the data (the last checkpoint is untouched)"));
  {
    tools::TraceScope phase("grad_sync", "phase");
    env.dp.finish_gradients();
  }
  tools::TraceScope phase("optimizer", "phase");
  r.grad_norm = env.dp.clip_grad_norm(env.clip_grad);
  if (env.before_update) env.before_update();
  env.dp.before_optimizer_step();
  env.optimizer.step(lr);
  env.dp.after_optimizer_step();
  env.optimizer.zero_grad();
  return r;
}

}  // namespace mm::training
