#include "mindspeed_mm/training/parallelize.h"

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/training/model_builder.h"
#include "mindspeed_mm/training/plans.h"
#include "mindspeed_mm/training/recompute.h"

namespace mm::training {

std::unique_ptr<DataParallelModel> parallelize(models::Model& model, const config::Config& cfg,
                                               const TrainParallel& mesh, at::Device device, bool deferred) {
  // 1. freeze
  if (const int64_t n = freeze_parts(model, cfg.model); n > 0) log::info("plan: froze ", n, " parameter tensors of model.parts");
  if (!cfg.features.freeze.empty())
    log::info("plan: froze ", apply_freeze_plan(model, cfg.features.freeze), " parameter tensors");
  // 2. tensor parallel: parallel_setup refuses sizes other than 1 until the Megatron backend.
  // 3. data parallel
  config::ParallelConfig pc = cfg.parallel;
  if (pc.fsdp.units.empty()) pc.fsdp.units = model.plans().fsdp_units;
  auto dp = std::make_unique<DataParallelModel>(model, mesh, pc, device);
  // 4. materialise
  if (deferred) {
    model.to(device);  // buffers (FSDP gives the parameters their storage on the device)
    dp->initialize([&] { model.init_weights(static_cast<uint64_t>(cfg.training.seed)); });
    if (!cfg.model.pretrained.empty())
      checkpoint::load_model_weights(model, cfg.model.pretrained, model.optional_checkpoint_tensors(),
                                     [&](const std::string& k) { return model.parameter_name(k); },
                                     dp->weight_store());
    load_part_weights(model, cfg.model, dp->weight_store());
  }
  // 5. recompute
  if (!cfg.features.recompute.empty())
    log::info("plan: recomputing activations of ", apply_recompute_plan(model, cfg.features.recompute), " blocks");
  return dp;
}

}  // namespace mm::training
