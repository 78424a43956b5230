// Datasets and collators by id. A dataset factory turns the `data` config section into train and
// validation sets plus the tokenizer that made them; a collator turns sample indices into a
// batch of tensors.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/registry.h"
#include "mindspeed_mm/data/text_dataset.h"

namespace mm::data {

// Language-model data: packed rows of token ids, and how to turn text into ids and back.
struct LMData {
  std::shared_ptr<PackedTextDataset> train, val;
  int64_t vocab_size = 0;  // ids the tokenizer can produce
  int64_t eos_id = 0;
  int64_t skipped_lines = 0;
  std::function<std::vector<int64_t>(std::string_view)> encode;
  std::function<std::string(const std::vector<int64_t>&)> decode;
};

using DatasetFactory = std::function<LMData(const config::DataConfig&)>;
Registry<DatasetFactory>& dataset_registry();

using Collator = std::function<LMBatch(const PackedTextDataset&, const std::vector<int64_t>& indices)>;
using CollatorFactory = std::function<Collator(const config::DataConfig&)>;
Registry<CollatorFactory>& collator_registry();

}  // namespace mm::data
