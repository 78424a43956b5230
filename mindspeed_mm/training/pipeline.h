// Pipeline parallelism (Megatron's 1F1B and interleaved 1F1B) over a model's pipeline pieces
// (models/model.h PipelineSubmodule): the layers of each submodule are placed per stage,
// MindSpeed-MM style (parallel.pipeline_num_layers: {vision: [32, 0], text: [1, 27]}), so a vision
// tower and a language model are placed independently; with virtual chunks (interleaved) each
// stage runs several non-adjacent chunks. Model chunk c runs on stage c % pp; the forward pass
// goes through chunks 0, 1, ... in order. A stage holds only the parameters its chunks use (the
// others keep no storage), so model code is unchanged.
//
// Activations travel between stages point to point with their names, shapes and dtypes (a
// multimodal batch's sequence length differs from one micro-batch to the next); gradients come
// back in the same order. Sends never wait, so a stage's next receive is never blocked by its
// own send. The loss is computed on the last stage and summed over the stages for the report.
#pragma once

#include <map>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/models/model.h"
#include "mindspeed_mm/parallel/communicator.h"
#include "mindspeed_mm/training/objectives/objective.h"

namespace mm::training {

// Layers [begin, end) of submodule `submodule`.
struct PipelinePiece {
  size_t submodule = 0;
  int64_t begin = 0, end = 0;
};

struct PipelineLayout {
  int stages = 1, virtual_chunks = 1;           // pp, vp
  std::vector<models::PipelineSubmodule> submodules;
  std::vector<std::vector<PipelinePiece>> chunks;  // [chunk] in forward order; chunk c on stage c % stages
  std::map<std::string, std::vector<int>> owners;  // parameter -> the chunks that use it (tied: two)
  // The parameters that train, recorded before each stage released the ones it does not hold
  // (those stop requiring gradients there), for counting one process's memory.
  std::set<std::string> trainable;

  int num_chunks() const { return static_cast<int>(chunks.size()); }
  int stage_of(int chunk) const { return chunk % stages; }
  // Whether stage `stage` holds the parameter, and whether it is the first stage that does (a
  // tied parameter's gradient norm is counted there only).
  bool held_by(const std::string& name, int stage) const;
  bool first_holder(const std::string& name, int stage) const;
  // Parameters held by more than one stage (tied embeddings): their gradients are summed.
  std::vector<std::string> shared() const;
  // "stage 0: vision 0-31, text 0 | stage 1: text 1-9 | ..."
  std::string describe() const;
};

// The layout from parallel.pipeline_num_layers (empty: the last submodule's layers split evenly
// over the pp x vp chunks, the earlier submodules on the first chunk) and the parameters' owners.
// ConfigError before any process group is built, naming the key, for: a submodule the model does
// not have or one left out, lists of the wrong length or shape, counts that do not sum to a
// submodule's layers, a submodule placed before an earlier one, and interleaving with fewer
// layers than chunks.
// parallel.virtual_pipeline_size, or with num_layers_per_virtual_pipeline_stage N > 0 the
// language model's (the last submodule's) layers / (pipeline_parallel_size x N); ConfigError
// when that does not divide or disagrees with a virtual_pipeline_size also given.
int resolve_virtual_pipeline_size(const models::Model& model, const config::ParallelConfig& p);

PipelineLayout make_pipeline_layout(const models::Model& model, const nlohmann::json& num_layers, int pp, int vp);

// One step's order of work on a stage: forward or backward of micro-batch `micro` through model
// chunk `chunk`.
struct PipelineAction {
  bool forward = true;
  int micro = 0, chunk = 0;
};
// 1F1B (vp 1: warm-up forwards, one forward one backward, cool-down backwards) or Megatron's
// interleaved 1F1B (vp > 1; micro-batches a multiple of pp). ConfigError otherwise.
std::vector<PipelineAction> pipeline_schedule(int stage, int stages, int micro_batches, int vp);
// Activations a stage keeps at most at once under the schedule (forwards waiting for backward).
int max_in_flight(const std::vector<PipelineAction>& actions);
// Every stage's timeline of one step, one character per time slot (F forward, B backward,
// . idle; the micro-batch index below), computed by simulating the schedule with unit-time
// forwards and two-unit backwards; and its bubble fraction against (p - 1) / (m + p - 1).
std::string print_schedule(int stages, int micro_batches, int vp, double* bubble = nullptr);

class PipelineRunner {
 public:
  // model: built with only this stage's parameters. pp: the pipeline group (stage = its rank).
  PipelineRunner(models::Model& model, PipelineLayout layout, std::shared_ptr<parallel::Communicator> pp);

  const PipelineLayout& layout() const { return layout_; }
  int stage() const { return stage_; }
  bool last_stage() const { return stage_ == layout_.stages - 1; }

  // Forward and backward of every micro-batch (on the device) by the schedule; each micro-batch's
  // loss is the objective's sum divided by normaliser. Returns the summed (undivided) loss of all
  // micro-batches, the same on every stage.
  double run_step(const std::vector<data::Batch>& micro, const Objective& objective, double normaliser,
                  bool bf16);
  // A validation batch forward through every stage: its sums on every stage (no gradient).
  EvalSums eval_sums(const data::Batch& batch, const Objective& objective);
  // Runs before each chunk's forward with its micro-batch (context parallelism's sequence:
  // DataParallelModel::begin_forward).
  void set_before_forward(std::function<void(const data::Batch&)> f) { before_forward_ = std::move(f); }

 private:
  models::Model& model_;
  PipelineLayout layout_;
  std::shared_ptr<parallel::Communicator> pp_;
  int stage_ = 0;
  std::function<void(const data::Batch&)> before_forward_;

  void run_chunk(int chunk, models::Outputs& carry, const data::Batch& batch);
  void send_carry(const models::Outputs& carry, int to_stage, int tag, std::vector<std::shared_ptr<parallel::PendingWork>>& sends);
  models::Outputs recv_carry(int from_stage, int tag, at::Device device);
};

}  // namespace mm::training
