// The train engine of `mm train`: build data, model, objective and optimizer from the config,
// apply plans, resume, then loop over train_step() with validation, logging, checkpoints, HF
// export and the objective's closing report.
#pragma once

#include <cmath>
#include <string>

#include "mindspeed_mm/config/config.h"

namespace mm::training {

struct TrainSummary {
  double val_loss_before = NAN, val_loss_after = NAN;  // the objective's validation loss
  int64_t iterations = 0;
  double mean_tokens_per_s = 0;                        // the model's input tokens (Model::input_tokens)
  int64_t skipped_samples = 0;                         // bad samples the data skipped
};

TrainSummary train(const config::Config& cfg);

}  // namespace mm::training
