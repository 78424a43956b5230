// DataLoader: batches of encoded samples prepared on N worker threads while the model trains.
//
// Order: batch k holds the sampler's k-th group of batch_size indices, drawn on the caller's
// thread in order; workers only encode and collate. Results wait in a reorder buffer and
// next() hands them out strictly by k, so the batch sequence is identical for any worker
// count (0 = encode on the caller's thread). At most `prefetch` batches are in flight.
//
// Bad samples: encode(i) throwing mm::Error (or c10::Error) means sample i is unusable; any other
// exception (out of memory, a bug) stops the run instead of silently replacing samples. A bad
// sample is replaced by the next index i+1, i+2, ... (mod n) that encodes, so batches keep their
// size and the choice is a function of the data alone, never of timing. Each bad record is
// logged once (its source and reason) and counted, in delivery order; sample_key maps an
// index to its record, so a record a mixture repeats counts once. When the share of bad attempts among all
// attempts exceeds max_bad_fraction (checked once at least min_samples_for_bad_check were
// attempted), next() throws an mm::Error naming the count and the first bad samples.
//
// Resume: state() is the sampler's state as of the last batch next() returned (prefetched
// batches do not count) plus the bad-sample record; load_state() continues exactly there.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/data/mllm/sample_encoder.h"
#include "mindspeed_mm/data/sampler.h"

namespace mm::data {

struct LoaderOptions {
  int64_t batch_size = 1;
  int num_workers = 2;
  int64_t prefetch = 4;  // batches in flight beyond the one being consumed
  double max_bad_fraction = 0.1;
  int64_t min_samples_for_bad_check = 200;
  int64_t max_replacements = 32;  // consecutive bad indices tried before giving up on a slot
  std::function<int64_t(int64_t)> sample_key;  // index -> record id (empty: the index itself)
};

struct LoaderStats {
  int64_t batches = 0, samples = 0;  // delivered
  int64_t attempts = 0;              // encodes tried for delivered batches (bad ones included)
  int64_t bad_attempts = 0;
  std::map<int64_t, std::string> bad;  // distinct bad record (sample_key) -> "source: reason"
  std::string first_bad;               // the first one delivered
};

class DataLoader {
 public:
  using EncodeFn = std::function<EncodedSample(int64_t index)>;
  using CollateFn = std::function<Batch(const std::vector<EncodedSample>&)>;

  // `dataset_size` indexes encode(); the sampler draws from [0, dataset_size).
  DataLoader(int64_t dataset_size, EncodeFn encode, CollateFn collate, ResumableSampler sampler,
             LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  Batch next();

  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);
  const LoaderStats& stats() const { return stats_; }
  int64_t batches_per_epoch() const { return sampler_.per_epoch() / options_.batch_size; }

 private:
  struct Task {
    int64_t seq;
    std::vector<int64_t> indices;
    nlohmann::json sampler_after;
  };
  struct Result {
    Batch batch;
    nlohmann::json sampler_after;
    int64_t attempts = 0;
    std::vector<std::pair<int64_t, std::string>> bad;  // (record key, reason) in slot order
    std::exception_ptr error;
  };

  Result run(const Task& task);
  EncodedSample encode_slot(int64_t index, Result& r);
  void dispatch_locked();  // fills the task queue up to the prefetch bound
  void worker_loop();
  void start_workers();
  void stop_workers();
  void deliver(Result& r);

  int64_t n_;
  EncodeFn encode_;
  CollateFn collate_;
  ResumableSampler sampler_;
  LoaderOptions options_;

  // Shared with workers (under mu_).
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<Task> queue_;              // FIFO of tasks not yet taken
  std::map<int64_t, Result> done_;       // finished, waiting for their turn
  int64_t next_seq_ = 0, dispatched_ = 0;
  bool stopping_ = false;
  std::map<int64_t, std::string> known_bad_;  // record key -> reason: a bad file is decoded once
  std::vector<std::thread> workers_;

  nlohmann::json delivered_sampler_;     // sampler state after the last delivered batch
  LoaderStats stats_;
};

}  // namespace mm::data
