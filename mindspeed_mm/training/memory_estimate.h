// `mm memory CONFIG.yaml`: each rank's peak tensor memory for a config's layout, before any run.
//
// Parameters, gradients and optimizer state come from the model built without storage and the
// plans' placement of every parameter (tensor-parallel splits, pipeline stages, FSDP and ZeRO-1
// shards); activations from the model family's own count of what its forward saves
// (Model::estimate_activations) for the data's first batches, under the schedule (micro-batches
// in flight on a pipeline stage, recomputed blocks); the data's own tensors are measured as the
// dataset opens. The peak is the largest of the moments a step goes through:
//   forward's end     parameters + optimizer state + data + activations + the loss's gradients
//                     (+ gradients of earlier micro-batches)
//   backward's end    parameters + optimizer state + data + gradients (+ DDP's reduce buckets)
// The measured counterpart is the progress line's `mem` (live tensors at their peak in a step,
// core/allocator.h on the CPU); tests/unit/test_memory.cpp holds the two within 15%.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mindspeed_mm/config/config.h"

namespace mm::models {
class Model;
}

namespace mm::training {

struct RankMemory {
  std::string role;        // "every rank", "stage 1"
  std::vector<int> ranks;  // the world ranks it describes
  int64_t params = 0, grads = 0, optimizer = 0, data = 0;
  int64_t activations = 0;     // at forward's end: every micro-batch in flight, the loss's gradients
  int64_t transient = 0;       // FSDP's gathered units, a recomputed block rebuilt in backward
  int64_t peak = 0;
  std::string peak_at;         // "forward's end", "backward's end"
  std::vector<std::pair<std::string, int64_t>> terms;  // the activations' named parts (one micro-batch)
};

struct MemoryEstimate {
  std::string model, layout, batch;  // "qwen2", "dp 2 x tp 2", "16 x 128 tokens"
  int world = 1;
  std::vector<RankMemory> ranks;
  std::vector<std::string> notes;  // what the estimate leaves out (bf16 autocast, ...)
};

struct MemoryOptions {
  int world = 0;    // the ranks the layout runs on (0: the product of the config's degrees)
  int batches = 4;  // micro-batches read from the data for their shapes: the largest counts
  // seq_len > 0: no data is opened; a micro-batch is micro_batch_size rows of seq_len tokens,
  // each with `images` images of image_height x image_width pixels (before the processor's
  // resize), so full-size configs size on a laptop without their data.
  int64_t seq_len = 0, images = 0, image_height = 448, image_width = 448;
  // Set: the storage-less model is built once into it and reused by later calls with the same
  // config (a search over seq_len; building a 7B model's shapes takes seconds).
  std::shared_ptr<models::Model>* model_cache = nullptr;
};

// A synthetic row (seq_len > 0) too short for its images' tokens.
class RowTooShort : public Error {
 public:
  using Error::Error;
};

// cfg: a training config. mm::ConfigError for layouts the config cannot run; RowTooShort.
MemoryEstimate estimate_memory(const config::Config& cfg, const MemoryOptions& options = {});

// The report `mm memory` prints: one block per rank role.
std::string format_memory_estimate(const MemoryEstimate& e);

}  // namespace mm::training
