// Precomputed diffusion features: what the frozen encoders make of each video and caption (the
// VAE's normalised latents, the text encoder's features), written once by `mm data
// extract-features` and read back by the "features" dataset, so training never runs the
// encoders. A features directory is sharded safetensors with an index, as a sharded HF checkpoint:
//   features-00001.safetensors            latents.<i> [C, F, H, W], prompt_embeds.<i> [L, D],
//                                          null_prompt_embeds [L, D] (the empty prompt's; optional)
//   features.safetensors.index.json       {"metadata": {"format": "mm-features", "samples": n},
//                                          "weight_map": {name: shard}, "captions": [...]}
// Samples may differ in latent shape (resolution and frame buckets) and in text length.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "mindspeed_mm/data/dataset_registry.h"

namespace mm::data {

struct FeatureSample {
  at::Tensor latents;        // [C, F, H, W]
  at::Tensor prompt_embeds;  // [L, D]
  std::string caption;
};

// Writes samples (and the empty prompt's features when defined) to a fresh DIR, shards of about
// max_shard_bytes, each file atomically and the index last, so a directory with an index is complete.
void write_features(const std::string& dir, const std::vector<FeatureSample>& samples,
                    const at::Tensor& null_prompt_embeds = {}, uint64_t max_shard_bytes = 1ull << 30);

// Incremental form for long extractions: add() one sample at a time (a shard is written when it
// is full), finish() writes the last shard and the index.
class FeatureWriter {
 public:
  FeatureWriter(std::string dir, uint64_t max_shard_bytes = 1ull << 30);
  void add(const FeatureSample& sample);
  void finish(const at::Tensor& null_prompt_embeds = {});
  int64_t samples() const { return next_; }

 private:
  void flush();
  std::string dir_;
  uint64_t max_bytes_, pending_bytes_ = 0;
  int64_t next_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> pending_;
  std::vector<std::string> shard_files_;
  std::vector<std::vector<std::string>> shard_keys_;
  std::vector<std::string> captions_;
};

// The "features" dataset (data.dataset: features, data.paths: [DIR]): batches of kLatents,
// kPromptEmbeds (zero-padded to the batch's longest text), kSampleIds and, when the directory has
// it, kNullPromptEmbeds. data.val_fraction holds samples out (seeded by data.seed). Samples whose
// latents differ in shape never share a batch: they are grouped by shape into batches of
// micro_batch_size, and the batches (not the samples) are shuffled and dealt to the ranks.
TrainData make_features_data(const config::DataConfig& c, const DataContext& ctx);

}  // namespace mm::data
