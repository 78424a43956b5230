// Validation loss of a model under its objective.
#pragma once

#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/models/model.h"
#include "mindspeed_mm/training/data_parallel.h"
#include "mindspeed_mm/training/encoders/input_encoder.h"
#include "mindspeed_mm/training/objectives/objective.h"
#include "mindspeed_mm/training/pipeline.h"

namespace mm::training {

// The objective's validation loss (sum over batches / count) over the first max_batches
// validation batches (all when 0), in order, on the model's device (bf16: autocast for that
// device). With dp and par, each data-parallel rank runs its share of the batches and the sums
// are added over the ranks (FSDP: every rank runs them all). NaN when nothing was counted.
// Each batch goes through the input encoder (when there is one), then Objective::prepare with
// kValidationStep. parts: the sums of EvalSums::parts (empty when the objective gives none).
// images: Objective::eval_images of the first batch of the first shard (not under a pipeline).
double evaluate(models::Model& model, const Objective& objective, const data::ValPass& val, int64_t batch_size,
                int64_t max_batches, bool bf16, DataParallelModel* dp = nullptr, const TrainParallel* par = nullptr,
                PipelineRunner* pipeline = nullptr, std::vector<double>* parts = nullptr,
                const InputEncoder* encoder = nullptr, std::vector<std::pair<std::string, data::Image>>* images = nullptr);

}  // namespace mm::training
