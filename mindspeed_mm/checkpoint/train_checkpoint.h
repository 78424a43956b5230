// Training checkpoints for any parallel layout, loadable into any other.
//
// save/iter_0000100/
//   config.json                       the model's HF config
//   unsharded runs (one process, DDP): rank 0 writes
//     model.safetensors               full weights under their HF names (the folder is an HF model dir)
//     optimizer.safetensors           full optimizer state ("step", "exp_avg.<param>", ...)
//   sharded runs (FSDP, HSDP, ZeRO-1): every rank writes
//     model.rank00003.safetensors     1-D pieces: elements [begin, end) of each flattened tensor
//     optimizer.rank00003.safetensors
//     metadata.json                   every tensor's global shape and dtype, and each piece's
//                                     file and [begin, end) (rank 0 writes it from the headers)
//   rng.safetensors, train_state.json rank 0: CPU generator, iteration, consumed samples, config
//   loader.rank00003.json             each data-parallel rank's data-loader position
// save/latest                         the newest complete folder's name, written last
//
// The folder is written under a temporary name and renamed into place only when every rank has
// finished, so a crash mid-save (of any rank) never damages the previous checkpoint.
// CheckpointReader serves any flat range of any tensor from either layout, which is all a
// loader needs to reshard: FSDP over 4 -> DDP over 2 -> one process, or back.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"

#include "mindspeed_mm/checkpoint/safetensors.h"

namespace mm::checkpoint {

struct TrainState {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  nlohmann::json sampler;      // rank 0's data-loader state
  std::string config_yaml;     // resolved config, for reference
  // Rank 0's device generator ("cuda" and its state) besides the CPU one; empty on the CPU.
  std::pair<std::string, at::Tensor> device_rng;
};

// A block of a tensor: the tensor viewed as `view` (its own shape, or a finer one such as a fused
// qkv weight's [3, heads * dim, in]), the block at `offset` of `sizes`. Empty view: the whole tensor.
struct TensorBox {
  std::vector<int64_t> view, offset, sizes;
  bool whole() const { return view.empty(); }
};

// Part of a tensor that one rank holds: elements [begin, end) of the flattened box (a tensor-
// parallel slice, or the whole global tensor), e.g. an FSDP chunk of this rank's TP slice.
struct ShardEntry {
  std::string name;
  std::vector<int64_t> shape;  // global; {} for a scalar
  int64_t begin = 0, end = 0;
  at::Tensor data;             // end - begin elements
  TensorBox box;
};

// What one rank contributes to a checkpoint.
struct RankCheckpoint {
  bool sharded = false;
  // Unsharded: rank 0's full model and optimizer state (the others pass nothing). The state is
  // named tensors ("exp_avg.model.norm.weight", scalars 0-dim), as the optimizer holds them.
  const mm::nn::Module* model = nullptr;
  bool trainable_only = false;  // only the parameters that require grad (LoRA's adapters)
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state;
  // Sharded: this rank's pieces.
  std::vector<ShardEntry> model_shards, optimizer_shards;
  nlohmann::json loader_state;  // this data-parallel rank's data-loader state
  // Which data-parallel rank's loader state this is, of how many (-1: the writing rank's, of
  // the world); a rank that repeats another's (a tensor-parallel peer) sets writes_loader false.
  int loader_rank = -1, loader_world = -1;
  bool writes_loader = true;
  // Where this rank sits in the mesh ({"pp": 1, "dp": 0, "cp": 0, "tp": 1}) and the mesh's sizes:
  // recorded with each of its pieces in metadata.json (informational; loading goes by boxes).
  nlohmann::json placement, mesh;
};

// Every rank calls this with its part (rank of world data-parallel ranks; barrier synchronises
// them, a no-op in one process). Returns the folder written. MM_DEBUG_KILL_IN_SAVE=N makes rank
// MM_DEBUG_KILL_RANK (default 0) kill itself while saving iteration N, after writing its own
// files and before the rename (the crash-during-save tests).
std::string save_checkpoint(const std::string& save_dir, const TrainState& state, const nlohmann::json& hf_config,
                            const RankCheckpoint& mine, int rank, int world, const std::function<void()>& barrier);

std::string iteration_dir_name(int64_t iteration);  // "iter_0000100"
// A rank's file in a checkpoint folder: rank_file_name("model", 3, "safetensors") = "model.rank00003.safetensors".
std::string rank_file_name(const std::string& kind, int rank, const std::string& ext);
// Whether `dir` holds a sharded checkpoint (metadata.json beside the ranks' pieces).
bool is_sharded_checkpoint(const std::string& dir);
// "auto" -> the folder named by save_dir/latest, or "" when there is none yet; a path -> itself
// (an error if it does not exist).
std::string resolve_resume_dir(const std::string& resume, const std::string& save_dir);

// The first iter_* checkpoint folder in save_dir ("" when none): a fresh run (no resume) refuses a
// save_dir that holds one rather than overwrite it.
std::string first_checkpoint_in(const std::string& save_dir);

// Reads a checkpoint folder of either layout.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }

  // kind: "model" or "optimizer".
  bool has(const std::string& kind, const std::string& name) const;
  std::vector<std::string> names(const std::string& kind) const;
  std::vector<int64_t> shape(const std::string& kind, const std::string& name) const;
  at::ScalarType dtype(const std::string& kind, const std::string& name) const;
  // Elements [begin, end) of the flattened tensor, in its stored dtype. mm::Error naming the
  // folder and tensor when it is missing or the range is not covered.
  at::Tensor read(const std::string& kind, const std::string& name, int64_t begin, int64_t end) const;
  // Elements [begin, end) of a box of the tensor (flattened), from pieces of any box and range:
  // a tensor-parallel slice of a checkpoint saved at another tensor-parallel size, say.
  at::Tensor read_box(const std::string& kind, const std::string& name, const TensorBox& box, int64_t begin,
                      int64_t end) const;
  at::Tensor read_full(const std::string& kind, const std::string& name) const;
  // Gives back the mapped pages of every piece of the tensor (SafetensorsReader::release): a
  // streaming reader's memory stays at the tensor it is on.
  void release(const std::string& kind, const std::string& name) const;
  // Where each piece of the tensor sits: [{"file", "begin", "end", ("view", "offset", "box")}].
  nlohmann::json pieces(const std::string& kind, const std::string& name) const;

  TrainState train_state() const;
  // A generator's state: "cpu", or a device's ("cuda": undefined when the run was on the CPU).
  at::Tensor rng_state(const std::string& which = "cpu") const;
  // The data-loader state of data-parallel rank `rank` of `world`: its own when the checkpoint
  // was written by as many ranks, else rank 0's (the sampler reshards it by consumed samples).
  nlohmann::json loader_state(int rank, int world) const;

 private:
  struct Piece {
    std::string file;
    int64_t begin, end;
    TensorBox box;
  };
  struct Entry {
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
    std::vector<Piece> pieces;
  };
  const st::SafetensorsReader& file(const std::string& name) const;
  static void check_entry(const std::string& meta, const std::string& kind, const std::string& name, const Entry& e);
  at::Tensor piece_data(const Piece& p, const std::string& kind, const std::string& name, const Entry& e) const;

  std::string dir_;
  bool sharded_ = false;
  std::map<std::string, std::map<std::string, Entry>> entries_;  // kind -> name -> entry
  mutable std::map<std::string, std::shared_ptr<st::SafetensorsReader>> files_;
};

// Writes an HF model directory: config.json + model.safetensors (sharded past max_shard_bytes).
void export_hf_directory(const std::string& dir, const nlohmann::json& hf_config, const mm::nn::Module& model,
                         uint64_t max_shard_bytes = 5ull << 30);
// The same from tensors fetched one at a time in specs' order (sharded state, streamed).
void export_hf_streaming(const std::string& dir, const nlohmann::json& hf_config, const std::vector<st::TensorSpec>& specs,
                         const st::TensorFetch& fetch, uint64_t max_shard_bytes = 5ull << 30);
// A checkpoint folder of either layout as an HF directory, one tensor in memory at a time.
void export_hf_from_checkpoint(const CheckpointReader& reader, const std::string& dir, uint64_t max_shard_bytes = 5ull << 30);
// Reads DIR/config.json.
nlohmann::json read_hf_config(const std::string& dir);
// Loads weights (an HF directory, a .safetensors file, or a sharded checkpoint folder: a training
// checkpoint or `mm convert hf-to-mm` output, each tensor assembled from its pieces) into the model by name. Every model
// parameter must be present with its exact shape; extra checkpoint tensors are an error too,
// except `ignorable` ones. The message lists the first offenders. `rename` maps a checkpoint
// name to the model's (e.g. transformers' newer "model.language_model.*" to "model.*"); the
// error names the checkpoint's own spelling.
// `store(param, value)` replaces the copy into each parameter (FSDP keeps only its slice of the
// file's zero-copy view).
using WeightStore = std::function<void(at::Tensor& param, const at::Tensor& value)>;
void load_model_weights(mm::nn::Module& model, const std::string& source,
                        const std::vector<std::string>& ignorable = {},
                        const std::function<std::string(const std::string&)>& rename = {},
                        const WeightStore& store = {});
// Pairs each wanted (model name, full shape) with the checkpoint key that `rename` maps to it:
// model name -> key. mm::Error naming `source` and the first offenders when one is missing, a
// shape differs, or a key maps to nothing wanted (and is not `ignorable`).
std::map<std::string, std::string> match_checkpoint_names(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& wanted, const std::vector<std::string>& keys,
    const std::function<std::vector<int64_t>(const std::string&)>& shape_of, const std::string& source,
    const std::vector<std::string>& ignorable = {}, const std::function<std::string(const std::string&)>& rename = {});
// The same into the named parameters `params` (a part of a model: `rename` maps the source's
// names to these).
void load_weights(const std::vector<std::pair<std::string, at::Tensor>>& params, const std::string& source,
                  const std::vector<std::string>& ignorable = {},
                  const std::function<std::string(const std::string&)>& rename = {}, const WeightStore& store = {});

}  // namespace mm::checkpoint
