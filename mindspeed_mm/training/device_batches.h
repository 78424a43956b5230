// Batches on the training device (data::batch_to_device: pinned memory, non-blocking copies).
//
// DevicePrefetcher keeps one step ahead: when the trainer takes a step's micro-batches, the next
// step's are read from the loader and their copies queued at once, so the transfer overlaps the
// step's compute instead of starting after it. The loader state it reports is the one after
// the last batch handed out, so a checkpoint resumes exactly where training stood.
#pragma once

#include <deque>
#include <functional>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/dataset_registry.h"

namespace mm::training {

// One micro-batch of a step.
struct MicroBatch {
  data::Batch host;    // as the loader made it: counts and FLOPs are read from here, not the device
  data::Batch device;  // what the forward takes (the same tensors on the CPU)
  double extra_flops = 0;  // spent on it outside the trained model (frozen input encoders), counted in the step's
  // Context parallelism: this rank's share of the model's training FLOPs and input tokens (the
  // whole batch's over the cp ranks, whether host is cut or whole on each); -1: read from host.
  double model_flops = -1, input_tokens = -1;
};

class DevicePrefetcher {
 public:
  using Item = MicroBatch;
  // ahead = 0: batches are read and copied when asked for; k > 0: the next k batches are always
  // in flight.
  // shard (optional) rewrites each item's host batch before its copy (context parallelism).
  DevicePrefetcher(data::BatchStream& stream, at::Device device, int64_t ahead,
                   std::function<void(Item&)> shard = {});

  Item next();
  // The loader's state after the last batch next() returned (prefetched ones do not count).
  nlohmann::json state() const;
  // Drops what was prefetched and continues from `state`.
  void load_state(const nlohmann::json& state);
  // Bad samples skipped in the batches handed out.
  int64_t skipped_samples() const { return skipped_; }

 private:
  struct Pending {
    Item item;
    nlohmann::json state_after;
    int64_t skipped_after;
  };
  void fill(int64_t n);  // until n batches are pending

  data::BatchStream& stream_;
  at::Device device_;
  int64_t ahead_;
  std::function<void(Item&)> shard_;
  std::deque<Pending> pending_;
  nlohmann::json state_;
  int64_t skipped_ = 0;
};

}  // namespace mm::training
