// LoRA as a plan (PEFT's LoraConfig semantics, applied to unchanged model code): every Linear
// that features.lora.target names gets two Linear children, lora_A [rank, in] and lora_B
// [out, rank], and computes W x + b + (alpha / rank) B A dropout(x); every other parameter is
// frozen except those of modules_to_save. The adapters are ordinary parameters of the tree
// (`model.layers.0.self_attn.q_proj.lora_A.weight`), so the optimizer, DDP, FSDP and checkpoints
// take them with no special case; the tensor-parallel plan splits lora_B with a column-parallel
// layer's rows and lora_A with a row-parallel layer's columns.
//
// PEFT's files: adapter_config.json + adapter_model.safetensors, keys
// `base_model.model.<transformers module path>.lora_A.weight` (and `base_model.model.<path>.weight`
// for modules_to_save), the module paths of transformers' current classes (Model::hf_module_path).
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/models/model.h"

namespace mm::training {

struct LoraLayout {
  config::LoraConfig config;
  std::vector<std::string> targets;  // module paths of the adapted Linears, in module order
  std::vector<std::string> saved;    // module paths of modules_to_save
  double scaling = 1;                // alpha / rank
  // Adapter and modules_to_save parameters: what trains and what an adapter file holds.
  std::set<std::string> trainable;
  bool enabled() const { return !targets.empty(); }
  // Whether a parameter is one of the adapters' own (lora_A / lora_B).
  static bool is_adapter(const std::string& name);
};

// Adds the adapters (deferred when the model's parameters are: FSDP materialises them), freezes
// the rest. ConfigError naming the target that matches no Linear (or a module that is not one).
LoraLayout apply_lora_plan(models::Model& model, const config::LoraConfig& c);
// PEFT's initialisation: lora_A kaiming-uniform (a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), lora_B
// zeros (the adapted model starts as the base), deterministic in seed.
void init_lora_weights(models::Model& model, const LoraLayout& layout, uint64_t seed);

// While alive, the adapters are out of the model's tree: the base model's init_weights then draws
// exactly what it draws without LoRA (a deferred build initialises after the plans).
class HiddenAdapters {
 public:
  HiddenAdapters(models::Model& model, const LoraLayout& layout);
  ~HiddenAdapters();
  HiddenAdapters(const HiddenAdapters&) = delete;
  HiddenAdapters& operator=(const HiddenAdapters&) = delete;

 private:
  std::vector<std::pair<mm::nn::Module*, std::vector<std::pair<std::string, std::shared_ptr<mm::nn::Module>>>>> taken_;
};

// The base model's parameters (everything but the adapters), for loading an HF directory.
std::vector<std::pair<std::string, at::Tensor>> base_parameters(const models::Model& model);

// adapter_config.json as PEFT writes it for this layout.
nlohmann::json peft_adapter_config(const models::Model& model, const LoraLayout& layout,
                                   const std::string& base_model = "");
// PEFT key of a parameter and back (mm::Error for a key that is not PEFT's).
std::string peft_key(const models::Model& model, const std::string& name);
std::string parameter_of_peft_key(const models::Model& model, const std::string& key);
// Writes DIR/adapter_config.json + DIR/adapter_model.safetensors from the named trainable tensors
// (full values: a gathered model or a checkpoint's).
void save_peft_adapter(const std::string& dir, const nlohmann::json& adapter_config,
                       const models::Model& model, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
// A PEFT adapter directory's configuration as ours (r, lora_alpha, lora_dropout, target_modules,
// modules_to_save); mm::Error naming the file for what mm cannot run (DoRA, rsLoRA, rank or
// alpha patterns, bias other than none, fan_in_fan_out).
config::LoraConfig read_peft_adapter_config(const std::string& dir);
// Loads DIR's adapter tensors into the model's (after apply_lora_plan with the same targets):
// every adapter and modules_to_save parameter must be there with its shape (mm::Error naming it).
// `store` as load_weights takes it (FSDP, tensor parallelism keep their slices).
void load_peft_adapter(models::Model& model, const std::string& dir,
                       const std::function<void(at::Tensor& param, const at::Tensor& value)>& store = {});

// A PEFT adapter directory run on a loaded model without merging (`--adapter` of mm generate,
// eval and sample): its configuration applied as the plan, its tensors loaded. Returns the layout.
LoraLayout attach_peft_adapter(models::Model& model, const std::string& dir);

}  // namespace mm::training
