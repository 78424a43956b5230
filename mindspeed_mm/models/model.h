// The model interface every family implements: a tree of named modules (parameter paths are the
// checkpoint names) with a forward pass from a named-tensor Batch to named outputs, and what
// training, checkpointing, plans and FLOPs accounting need around it. Nothing here knows about
// losses or parallelism: an objective (training/objectives/) scores the outputs, plans wrap the
// blocks after the model is built.
//
// CausalLM is the kind of model that outputs next-token logits (Qwen2, and the vision-language
// models that put a vision tower in front of one: Qwen2-VL, Qwen2.5-VL, LLaVA).
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mindspeed_mm/core/module.h"
#include "mindspeed_mm/data/batch.h"
#include "mindspeed_mm/models/memory.h"

namespace mm::models {

// A forward pass's results by name ("logits").
using Outputs = data::TensorMap;
inline constexpr std::string_view kLogits = "logits";
// fp32 [B, S]: each position's cross-entropy (0 where unlabeled), from a language model that fuses
// its head with the loss (training.loss_chunk_size) instead of giving logits.
inline constexpr std::string_view kTokenLosses = "token_losses";

// A named part of a model: the parameters under a path prefix ("visual." for Qwen2-VL's vision
// tower), the longest matching prefix deciding, so "" holds what no other part claims. Parameter
// counts, freezing and per-part pretrained weights (model.parts in the config) go by parts.
struct ModelPart {
  std::string name;    // vision_tower, projector, language_model
  std::string prefix;  // "visual.", "visual.merger.", ""
};

// Where each parallel plan applies by default, as module-path patterns (core/pattern.h): data a
// model family supplies, which training::parallelize() applies (TorchTitan's per-model plans).
struct PlanTable {
  // The FSDP units when parallel.fsdp.units is empty: the repeated blocks ("model.layers.{*}").
  std::vector<std::string> fsdp_units;
  // Tensor parallelism: (pattern, style), the styles of training/tensor_parallel_plan.h
  // (colwise, rowwise, heads, kv_colwise, qkv_colwise, vocab, vocab_head, vocab_tied, colwise_norm).
  std::vector<std::pair<std::string, std::string>> tensor_parallel;
  // Sequence parallelism: the blocks whose hidden states [B, S, hidden] are sharded along the
  // sequence between the first and the last of them ("model.layers.{*}").
  std::vector<std::string> sequence_parallel;
  // Context parallelism: the self-attention modules (models::AttentionCoreHost) whose attention
  // runs over the whole sequence while everything else sees this rank's tokens only
  // ("model.layers.{*}.self_attn").
  std::vector<std::string> context_parallel;
  // The blocks between which a model that computes its sequence itself (a diffusion
  // transformer's patches) holds this rank's shard of it: cut on entering the first, gathered
  // after the last ("blocks.{*}"). Empty: the batch's token fields are cut before the model sees
  // them (a language model, a vision-language model's text and vision tokens).
  std::vector<std::string> context_parallel_blocks;
  // The (rows, length) of the sequence those blocks take, from a batch: a pipeline's later
  // stages, which never see it cut, prepare the cut from it. Unset: no pipeline with CP.
  std::function<std::pair<int64_t, int64_t>(const data::Batch&)> context_parallel_length;
  // Before a host batch's token fields are cut: what the model needs of the whole row, added
  // as fields it reads instead (a vision-language model's M-RoPE positions and the feature row
  // of each pad token: data::kMropePositionIds, k*FeatureIndex). Unset: nothing.
  std::function<data::Batch(const data::Batch&)> context_parallel_prepare;
  // The batch fields that every cp rank takes whole (pixel rows, which an encoder stretch below
  // may cut on its own, and their grids).
  std::vector<std::string> context_parallel_whole;
  // Encoders whose own sequence is cut among the cp ranks too (a vision tower's patches, one
  // image batch's worth per call): their attention modules and the blocks cut on entering the
  // first and gathered after the last, as above. The blocks take [N, hidden] (one unbatched
  // sequence) and name the segments attention stays inside by ForwardContext::cu_seqlens (frames,
  // windows), which may change from block to block.
  struct CpStretch {
    std::vector<std::string> attention, blocks;
    // The batch fields whose rows are the sequence, each with the host grid field that sizes
    // it ({"pixel_values", "image_grid_thw"}): each cp rank is then handed only its rows (cut on
    // the host before the device copy; data::kPixelRowsCut), in the order the blocks take them:
    // order(grid) lists the field's row at each position (undefined or unset: the rows' own).
    std::vector<std::pair<std::string, std::string>> inputs;
    std::function<at::Tensor(const at::Tensor& grid)> order;
  };
  std::vector<CpStretch> context_parallel_encoders;
};

// Pipeline parallelism (training/pipeline.h) runs the forward pass a piece at a time: the model
// lists its submodules in forward order, each a run of numbered layers with the parameters used
// before the first of them and after the last (parameter-path prefixes). A stage runs layers
// [begin, end) of a submodule (with the parts before / after when the range starts / ends the
// submodule) on the activations the previous piece left in `carry`; the last piece leaves the
// model's Outputs there. What a piece needs besides (positions, masks, grids) it reads from the
// batch, which every stage has.
struct PipelineSubmodule {
  std::string name;         // "text", "vision"
  int64_t num_layers = 0;
  std::string layer_prefix;  // layer i's parameters: layer_prefix + i + "."
  std::vector<std::string> before, after;
};

class Model : public mm::nn::Module {
 public:
  // A batch on the model's device -> named outputs.
  virtual Outputs forward(const data::Batch& batch) = 0;
  // Batch fields forward needs, and those it reads when a batch has them. The trainer checks
  // the first against the dataset's fields at start and warns about fields nothing reads.
  virtual std::vector<std::string> required_fields() const = 0;
  virtual std::vector<std::string> optional_fields() const { return {}; }
  // The objective (training/objectives/) a run uses unless training.objective names another.
  virtual std::string default_objective() const = 0;

  // Deterministic given the seed, independent of device and dtype.
  virtual void init_weights(uint64_t seed) = 0;
  // The HF config.json that reproduces this model.
  virtual nlohmann::json hf_config() const = 0;
  // The repeated blocks in order: the units plans wrap and shard.
  virtual std::vector<std::shared_ptr<mm::nn::Block>> blocks() = 0;
  // A checkpoint's parameter name in this model's tree (for naming schemes other than the
  // tree's own); identity by default.
  virtual std::string parameter_name(const std::string& checkpoint_name) const { return checkpoint_name; }
  // The path transformers' current class gives a parameter path of this model (the inverse of
  // parameter_name where the two differ): what PEFT's adapter files are keyed by. Identity by default.
  virtual std::string hf_module_path(const std::string& name) const { return name; }
  // Checkpoint tensors loading may skip: copies of tied weights (a tied LM's lm_head.weight).
  virtual std::vector<std::string> optional_checkpoint_tensors() const { return {}; }
  // The model's parts (default: one, "model", holding everything).
  virtual std::vector<ModelPart> parts() const { return {{"model", ""}}; }
  // The default targets of the parallel plans (empty FSDP units: every block).
  virtual PlanTable plans() const { return {}; }

  // Work of one batch, read from its host copy (no device sync): the inputs counted for
  // throughput (real tokens for a language model), and the training FLOPs (forward + backward).
  virtual double input_tokens(const data::Batch& host) const = 0;
  virtual double training_flops(const data::Batch& host) const = 0;
  // The same FLOPs by part (parts()' names, in their order; they add up to training_flops). The
  // default: a one-part model's everything under its name, else "model".
  virtual std::vector<std::pair<std::string, double>> training_flops_by_part(const data::Batch& host) const;
  // What a run's first lines say about its cost ("1.25 MFLOP per text token").
  virtual std::string cost_summary(int64_t seq_len) const = 0;

  // The activations one micro-batch's forward leaves for backward on a rank of layout q, from the
  // host batch's shapes (models/memory.h); nullopt for a model that has no estimate.
  virtual std::optional<ActivationEstimate> estimate_activations(const data::Batch& host, const MemoryQuery& q) const {
    (void)host;
    (void)q;
    return std::nullopt;
  }

  // Pipeline pieces (see PipelineSubmodule); a model without them cannot be pipelined.
  virtual std::vector<PipelineSubmodule> pipeline_submodules() const { return {}; }
  virtual void pipeline_forward(size_t submodule, int64_t begin, int64_t end, Outputs& carry, const data::Batch& batch);
};

// The part a parameter path belongs to (index into parts).
size_t part_of(const std::vector<ModelPart>& parts, const std::string& parameter);
// Parameters of each part, in the parts' order.
std::vector<std::pair<std::string, int64_t>> parameters_by_part(const Model& model);

}  // namespace mm::models
