// Datasets and collators by id. A dataset factory turns the `data` config section into the
// training stream (batches in order, resumable), a validation pass, the fields its batches have
// and, for text, the tokenizer that made them; the trainer sees only Batches.
//   text  plain text / fortunes / JSONL packed into fixed rows (collator lm_packed)
//   mllm  ShareGPT-style multimodal conversations through the threaded loader
//         (collators padded, packed)
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/registry.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/data/mllm/sample_encoder.h"

namespace mm::data {

// What the data needs to know about the run.
struct DataContext {
  int64_t micro_batch_size = 1;
  int64_t rank = 0, world = 1;  // data-parallel rank and size: each rank reads its own shard
};

// The training batches, in order, forever (epochs roll over).
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  virtual Batch next() = 0;
  // Position after the last batch next() returned; load_state continues from there.
  virtual nlohmann::json state() const = 0;
  virtual void load_state(const nlohmann::json& state) = 0;
  // Samples skipped as bad so far (malformed records included).
  virtual int64_t skipped_samples() const { return 0; }
};

// One in-order pass over validation batches: fn(batch) for batches k < max_batches (0 = all)
// with k % num_shards == shard, so the data-parallel ranks' sums add up to one process's pass.
using ValPass = std::function<void(int64_t batch_size, int64_t max_batches, int64_t shard, int64_t num_shards,
                                   const std::function<void(const Batch&)>& fn)>;

struct TrainData {
  std::unique_ptr<BatchStream> train;
  ValPass val;                       // null when there is no validation data
  std::vector<std::string> fields;   // the Batch fields its batches may have (data/batch.h)
  // The tokenizer's, for datasets of text (0 and null for datasets without a vocabulary).
  int64_t vocab_size = 0;            // ids the tokenizer can produce
  int64_t eos_id = 0;
  std::function<std::vector<int64_t>(std::string_view)> encode;  // text prompt -> ids
  std::function<std::string(const std::vector<int64_t>&)> decode;
  // Text data only: label-token counts of the train and val splits (the unigram baseline).
  std::vector<int64_t> train_token_counts, val_token_counts;
};

using DatasetFactory = std::function<TrainData(const config::DataConfig&, const DataContext&)>;
Registry<DatasetFactory>& dataset_registry();

// Collators of encoded (mllm) samples.
using SampleCollator = std::function<Batch(const std::vector<EncodedSample>&)>;
using CollatorFactory = std::function<SampleCollator(const config::DataConfig&, int64_t pad_id)>;
Registry<CollatorFactory>& collator_registry();

}  // namespace mm::data
