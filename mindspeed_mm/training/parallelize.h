// parallelize(): the one place where plans are applied to a built model, in this order
// (TorchTitan's parallelize_* functions; model code knows none of it):
//   1. freeze           features.freeze: parameters that take no gradient (and no optimizer state)
//      LoRA             features.lora: adapters on the targets, everything else frozen (training/lora.h)
//   2. tensor parallel  parallel.tensor_parallel_size (the Megatron backend's issue; 1 today)
//   3. data parallel    DDP (+ ZeRO-1) over parallel.data_parallel_replicate_size, or FSDP / HSDP
//                       units (parallel.fsdp.units, else the model's PlanTable::fsdp_units): the
//                       outermost wrapper of each unit, so it gathers what the inner ones use
//   4. materialise      a model built deferred (FSDP) gets its shards: initialised from the seed,
//                       then model.pretrained's tensors, each rank keeping its slices
//   5. recompute        features.recompute: activation checkpointing of the matching blocks
//   6. chunked loss     training.loss_chunk_size: a language model's head fused with its
//                       cross-entropy, chunk by chunk (models/common/cross_entropy.h)
// A new plan (LoRA, offload, context parallel) is one more numbered step here.
#pragma once

#include <memory>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/models/model.h"
#include "mindspeed_mm/training/data_parallel.h"
#include "mindspeed_mm/training/lora.h"
#include "mindspeed_mm/training/parallel_setup.h"

namespace mm::training {

// ConfigError when the mesh does not fit the model: a tensor-parallel plan whose sizes do not
// divide, pipeline layer lists that do not match the model's layers, too few layers for the
// virtual stages, FSDP with pipeline stages. Needs no process group: train() runs it first.
void check_parallel_layout(models::Model& model, const config::Config& cfg, const parallel::MeshShape& mesh);

// deferred: the model was built without parameter storage (build_model(..., deferred = true)).
// Returns the data-parallel layer the train step runs through; *lora (when given) the LoRA plan's
// layout (empty without features.lora).
std::unique_ptr<DataParallelModel> parallelize(models::Model& model, const config::Config& cfg,
                                               const TrainParallel& mesh, at::Device device, bool deferred,
                                               LoraLayout* lora = nullptr);

}  // namespace mm::training
