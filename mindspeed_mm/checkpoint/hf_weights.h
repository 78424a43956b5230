// A Hugging Face model's weights: one model.safetensors, or shards named by
// model.safetensors.index.json, read lazily; and the writer that shards like save_pretrained.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mindspeed_mm/checkpoint/safetensors.h"

namespace mm::st {

// Opens, in HF's order of preference: DIR/model.safetensors, DIR/model.safetensors.index.json;
// else the one *.safetensors.index.json in DIR (e.g. diffusers' diffusion_pytorch_model...);
// else every *.safetensors in DIR (names must not repeat across files). A path to a
// .safetensors file or to an *.index.json file opens just that.
// PyTorch checkpoints (torch.save of a state dict: the original Wan2.1 VAE and umT5 .pth files)
// are read too: a path to a .pth / .pt / .bin file, or a directory holding no safetensors and one
// such file. libtorch's unpickler reads them whole into memory (it builds only tensors and plain
// containers, never arbitrary Python objects); a value that is not a tensor is skipped, a file
// that is not a state dict is an error naming it. Shards named by an index are
// mapped on first use, once each. Thread-safe.
class HFWeights {
 public:
  explicit HFWeights(const std::string& dir_or_file);
  ~HFWeights();

  std::vector<std::string> keys() const;  // index order, or file order for plain files
  bool has(const std::string& name) const;
  at::Tensor get(const std::string& name) const;  // zero-copy, as SafetensorsReader::get
  TensorInfo info(const std::string& name) const;
  // SafetensorsReader::release on the file holding `name` (a no-op for a PyTorch checkpoint's
  // tensors, which live in memory).
  void release(const std::string& name, const void* p, size_t bytes) const;
  std::vector<std::string> files() const;  // the safetensors files behind these weights
  const std::string& source() const { return source_; }

 private:
  struct Shard;
  const SafetensorsReader& reader(size_t shard) const;
  size_t locate(const std::string& name) const;  // shard index, or mm::Error naming source and key

  std::string source_;
  std::string index_path_;  // empty unless opened through an index
  std::unordered_map<std::string, at::Tensor> pickled_;  // a PyTorch checkpoint's tensors
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::string> keys_;
  std::unordered_map<std::string, size_t> where_;
};

// Writes `tensors` as a torch.save-compatible state dict (zip archive; torch.load reads it, as
// HFWeights does): the format of the original Wan VAE and umT5 checkpoints. Written atomically.
void save_torch_state_dict(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
// The same streamed: each tensor's data from fetch, in specs' order, one at a time (the pickle of
// names, dtypes and shapes first, then one zip record per tensor).
void save_torch_state_dict(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFetch& fetch);

// Writes DIR/model.safetensors when everything fits in one shard, else
// model-00001-of-0000N.safetensors shards plus model.safetensors.index.json
// ({"metadata": {"total_size": N}, "weight_map": {...}}, indent 2, sorted keys), as HF's
// save_pretrained does: a tensor larger than max_shard_bytes gets a shard of its own, others fill
// shards in order. Each file is written atomically with metadata {"format": "pt"}; the index goes
// last, then stale files of an earlier save in DIR are removed. DIR is created if missing.
// `stem` names the files: "model" (transformers) or "diffusion_pytorch_model" (diffusers).
void save_hf_weights(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                     uint64_t max_shard_bytes = 5ull << 30, const std::string& stem = "model");
// The same, streaming: each tensor's data comes from fetch, in specs' order, one at a time.
void save_hf_weights(const std::string& dir, const std::vector<TensorSpec>& specs, const TensorFetch& fetch,
                     uint64_t max_shard_bytes = 5ull << 30, const std::string& stem = "model");
// The stem a model directory's weights take: diffusers' (config.json has "_class_name") or transformers'.
std::string weights_stem(const nlohmann::json& hf_config);

}  // namespace mm::st
