// Objectives: what a run optimises and reports. An objective turns a model's outputs into the
// summed loss of a micro-batch, says what that sum is normalised by (tokens, samples) and how
// many of those a batch holds, scores validation batches, and words the run's reports (a
// language model's perplexity; a diffusion model's loss per timestep bucket). The train loop,
// train_step() and evaluate() call only this interface, so a new objective is one new file here
// plus its registration (see causal_lm.cpp).
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/registry.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/models/model.h"
#include "mindspeed_mm/parallel/tensor_parallel.h"

namespace mm::training {

// A report line and its JSONL record fields.
struct Report {
  std::string text;
  nlohmann::json record = nlohmann::json::object();
};

// Summed validation loss of batches and what it is normalised by (0-dim, on the device), and
// optionally more sums the objective reports beside it (1-D of Objective::eval_parts_size(): a
// diffusion objective's loss and count per timestep bucket), summed over batches and ranks.
struct EvalSums {
  at::Tensor sum, count;
  at::Tensor parts;
};

class Objective {
 public:
  virtual ~Objective() = default;
  // Batch fields the loss reads (checked against the dataset's fields at start), fields it reads
  // when a batch has them, and fields prepare() adds for the model (the dataset need not have them).
  virtual std::vector<std::string> required_fields() const = 0;
  virtual std::vector<std::string> optional_fields() const { return {}; }
  virtual std::vector<std::string> provided_fields() const { return {}; }
  // What the objective derives from a batch on the device before the forward: a diffusion
  // objective's noise, timesteps, noisy inputs and target (it may also repeat the samples).
  // Whatever it draws depends only on the run's seed, `step` and the batch's sample ids, so
  // every layout and rank draws the same for the same sample; validation passes
  // kValidationStep (fixed timesteps and noise: comparable from one evaluation to the next).
  static constexpr int64_t kValidationStep = -1;
  virtual void prepare(data::Batch& batch, int64_t step) const {}
  // The seed of sample `id`'s draws at `step` of a run seeded `seed` (splitmix64 mixing).
  static uint64_t draw_seed(uint64_t seed, int64_t step, uint64_t id);
  // What the loss is normalised by, in words ("tokens", "samples").
  virtual std::string normalised_by() const = 0;
  // How many of those a micro-batch holds, read from its host copy before the forward (no
  // device sync). The step's normaliser is the sum over its micro-batches and the data-parallel
  // ranks, so the update is the same for any data-parallel size and accumulation count.
  virtual double count(const data::Batch& host) const = 0;
  // The micro-batch's summed loss (fp32, 0-dim, differentiable); train_step divides it by the
  // step's normaliser.
  virtual at::Tensor loss_sum(const models::Outputs& out, const data::Batch& batch) const = 0;
  // A validation batch's loss sum and count (no gradient).
  virtual EvalSums eval_sums(const models::Outputs& out, const data::Batch& batch) const = 0;
  // A loss in the run's words: "loss 2.3026 (ppl 10.00)".
  virtual std::string describe(double loss) const = 0;
  // Fields a validation record in the metrics JSONL carries besides val_loss ({"val_ppl": 10.0}).
  virtual nlohmann::json eval_record(double loss) const { return nlohmann::json::object(); }
  // The report of EvalSums::parts summed over the validation batches and ranks, appended to the
  // validation line and its record.
  virtual int64_t eval_parts_size() const { return 0; }
  virtual Report eval_parts(const std::vector<double>& parts) const { return {}; }
  // Pictures of a validation batch's result (a VAE's input and reconstruction frames), tagged
  // for TensorBoard ("samples/reconstruction"); asked for the first batch only.
  virtual std::vector<std::pair<std::string, data::Image>> eval_images(const models::Outputs& out,
                                                                       const data::Batch& batch) const {
    return {};
  }
  // Added to the first validation report (a baseline the loss can be judged against); the
  // JSONL fields go into the same record.
  virtual Report baseline(const data::TrainData& data) const { return {}; }
  // After training, on the main rank with the full weights (gathered for it under FSDP, so only
  // when reports_after_training()): a demonstration of the result, such as a language model's
  // greedy continuation of tools.sample.prompt.
  virtual bool reports_after_training() const { return false; }
  virtual Report after_training(models::Model& model, const data::TrainData& data) const { return {}; }
  // Tensor parallelism left the model's logits split over `group` along the vocabulary: the loss
  // must be computed without gathering them. An objective that cannot says so (ConfigError).
  virtual void set_vocab_parallel(parallel::TpGroup group) {
    throw ConfigError("config: this training.objective cannot take vocabulary-parallel logits "
                      "(parallel.tensor_parallel_size > 1)");
  }
};

// Objectives by id ("causal_lm"): a factory from the whole config (the objective reads its own
// options, e.g. training.loss_normalization).
using ObjectiveFactory = std::function<std::unique_ptr<Objective>(const config::Config&)>;
Registry<ObjectiveFactory>& objective_registry();

// The objective a run uses: training.objective, or the model's default when that is "auto".
std::unique_ptr<Objective> make_objective(const config::Config& cfg, const models::Model& model);

}  // namespace mm::training
