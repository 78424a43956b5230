#include "mindspeed_mm/training/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/core/pattern.h"
#include "mindspeed_mm/models/common/linear.h"
#include "mindspeed_mm/training/plans.h"

namespace fs = std::filesystem;

namespace mm::training {
namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// PEFT's target matching: a plain name matches a module path equal to it or ending with "." + it;
// ours adds plan patterns ({*}, *, ?), matched the same way against the path's last segments
// ("merger.mlp.{0,2}" matches visual.merger.mlp.0).
struct Target {
  std::string text;
  bool pattern;
  PathPattern compiled;
  explicit Target(const std::string& t)
      : text(t), pattern(t.find_first_of("*?{") != std::string::npos), compiled(t) {}
  bool matches(const std::string& path) const {
    if (!pattern) return path == text || ends_with(path, "." + text);
    for (size_t from = 0; from != std::string::npos; from = path.find('.', from), from += from != std::string::npos)
      if (compiled.matches(path.substr(from))) return true;
    return false;
  }
};

std::vector<Target> compile(const std::vector<std::string>& v) {
  std::vector<Target> out;
  for (const auto& t : v) out.emplace_back(t);
  return out;
}

}  // namespace

bool LoraLayout::is_adapter(const std::string& name) {
  return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight");
}

LoraLayout apply_lora_plan(models::Model& model, const config::LoraConfig& c) {
  LoraLayout layout;
  layout.config = c;
  layout.scaling = c.alpha / static_cast<double>(c.rank);
  const auto targets = compile(c.target), saved = compile(c.modules_to_save);
  std::vector<bool> used(targets.size(), false), used_saved(saved.size(), false);
  std::vector<std::pair<std::string, models::Linear*>> adapt;
  std::vector<std::pair<std::string, mm::nn::Module*>> save;
  for_each_module(model, [&](const std::string& path, mm::nn::Module& m) {
    // A target may name our path or transformers' (an adapter_config.json written for the HF
    // model lists "model.language_model.layers.0.self_attn.q_proj" for our "model.layers.0...").
    const std::string hf = model.hf_module_path(path);
    auto matches = [&](const Target& t) { return t.matches(path) || (hf != path && t.matches(hf)); };
    for (size_t i = 0; i < saved.size(); ++i)
      if (matches(saved[i])) {
        used_saved[i] = true;
        save.emplace_back(path, &m);
        return;
      }
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!matches(targets[i])) continue;
      auto* lin = dynamic_cast<models::Linear*>(&m);
      if (!lin)
        throw ConfigError(cat("config: features.lora.target '", targets[i].text, "' matches ", path, ", a ",
                              m.type_name(), ", not a Linear layer"));
      used[i] = true;
      adapt.emplace_back(path, lin);
      return;
    }
  });
  for (size_t i = 0; i < targets.size(); ++i)
    if (!used[i]) throw ConfigError(cat("config: features.lora.target '", targets[i].text, "' matches no Linear layer"));
  for (size_t i = 0; i < saved.size(); ++i)
    if (!used_saved[i])
      throw ConfigError(cat("config: features.lora.modules_to_save '", saved[i].text, "' matches no module"));

  at::NoGradGuard no_grad;
  for (auto& [name, p] : model.named_parameters()) p.requires_grad_(false);
  for (auto& [path, m] : save) {
    layout.saved.push_back(path);
    for (auto& [name, p] : m->named_parameters(path)) {
      p.requires_grad_(true);
      layout.trainable.insert(name);
    }
  }
  for (auto& [path, lin] : adapt) {
    const bool deferred = mm::nn::deferred_value(lin->weight).has_value();
    const at::ScalarType dtype = lin->weight.scalar_type();
    std::shared_ptr<models::Linear> a, b;
    {
      std::unique_ptr<mm::nn::DeferredInitGuard> guard;
      if (deferred) guard = std::make_unique<mm::nn::DeferredInitGuard>();
      a = lin->register_module("lora_A", std::make_shared<models::Linear>(lin->in_features, c.rank, false, dtype));
      b = lin->register_module("lora_B", std::make_shared<models::Linear>(c.rank, lin->out_features, false, dtype));
    }
    if (!deferred) {  // on the base's device, from the start
      a->to(lin->weight.device());
      b->to(lin->weight.device());
    }
    const double scaling = layout.scaling, dropout = c.dropout;
    // lora_B(lora_A(dropout(x))) * scaling, through the children's own forward, so a tensor-
    // parallel plan that splits them (parallel_forward) is obeyed.
    lin->adapter = [a, b, scaling, dropout](const models::Linear&, const at::Tensor& x) {
      const bool train = at::GradMode::is_enabled() && dropout > 0;
      return b->forward(a->forward(train ? at::dropout(x, dropout, true) : x)) * scaling;
    };
    layout.targets.push_back(path);
    layout.trainable.insert(path + ".lora_A.weight");
    layout.trainable.insert(path + ".lora_B.weight");
  }
  return layout;
}

void init_lora_weights(models::Model& model, const LoraLayout& layout, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x10AA5EEDull);
  std::map<std::string, at::Tensor> params;
  for (auto& [name, p] : model.named_parameters()) params.emplace(name, p);
  for (const auto& path : layout.targets) {
    at::Tensor& a = params.at(path + ".lora_A.weight");
    at::Tensor& b = params.at(path + ".lora_B.weight");
    const int64_t fan_in = mm::nn::full_shape(a).at(1);
    mm::nn::init_param_uniform(a, 1.0 / std::sqrt(static_cast<double>(fan_in)), gen);
    mm::nn::init_param_fill(b, 0.0);
  }
}

HiddenAdapters::HiddenAdapters(models::Model& model, const LoraLayout& layout) {
  if (!layout.enabled()) return;
  std::map<std::string, mm::nn::Module*> modules;
  for_each_module(model, [&](const std::string& path, mm::nn::Module& m) { modules[path] = &m; });
  for (const auto& path : layout.targets) {
    mm::nn::Module* m = modules.at(path);
    std::vector<std::pair<std::string, std::shared_ptr<mm::nn::Module>>> kids;
    for (const char* name : {"lora_A", "lora_B"})
      if (auto child = m->take_module(name)) kids.emplace_back(name, child);
    taken_.emplace_back(m, std::move(kids));
  }
}

HiddenAdapters::~HiddenAdapters() {
  for (auto& [m, kids] : taken_)
    for (auto& [name, child] : kids) m->register_module(name, child);
}

std::vector<std::pair<std::string, at::Tensor>> base_parameters(const models::Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, p] : model.named_parameters())
    if (!LoraLayout::is_adapter(name)) out.emplace_back(name, p);
  return out;
}

std::string peft_key(const models::Model& model, const std::string& name) {
  if (LoraLayout::is_adapter(name)) {
    const std::string module = name.substr(0, name.size() - std::string(".lora_A.weight").size());
    const std::string suffix = name.substr(module.size());
    // The module's path in transformers' class: map its weight's path, then drop ".weight".
    const std::string hf = model.hf_module_path(module + ".weight");
    return kPeftPrefix + hf.substr(0, hf.size() - 7) + suffix;
  }
  return kPeftPrefix + model.hf_module_path(name);
}

std::string parameter_of_peft_key(const models::Model& model, const std::string& key) {
  if (key.compare(0, std::string(kPeftPrefix).size(), kPeftPrefix) != 0)
    throw Error(cat("lora: adapter tensor '", key, "' does not start with ", kPeftPrefix, " (not a PEFT LoRA adapter)"));
  std::string rest = key.substr(std::string(kPeftPrefix).size());
  if (LoraLayout::is_adapter(rest)) {
    const std::string module = rest.substr(0, rest.size() - std::string(".lora_A.weight").size());
    const std::string suffix = rest.substr(module.size());
    const std::string ours = model.parameter_name(module + ".weight");
    return ours.substr(0, ours.size() - 7) + suffix;
  }
  // modules_to_save: PEFT may keep the wrapper's name (".modules_to_save.default.").
  for (const std::string wrapper : {".modules_to_save.default.", ".modules_to_save."}) {
    const auto at = rest.find(wrapper);
    if (at != std::string::npos) rest = rest.substr(0, at) + "." + rest.substr(at + wrapper.size());
  }
  return model.parameter_name(rest);
}

nlohmann::json peft_adapter_config(const models::Model& model, const LoraLayout& layout, const std::string& base_model) {
  nlohmann::json saved = nullptr;
  if (!layout.config.modules_to_save.empty()) saved = layout.config.modules_to_save;
  // PEFT reads each target_modules entry as a module-name suffix: plan patterns ({*}, *, ?) mean
  // nothing to it, so a config that uses them lists the adapted modules' own paths instead.
  nlohmann::json targets = layout.config.target;
  bool patterns = false;
  for (const auto& t : layout.config.target) patterns = patterns || t.find_first_of("*?{") != std::string::npos;
  if (patterns) {
    targets = nlohmann::json::array();
    for (const auto& path : layout.targets) {
      const std::string hf = model.hf_module_path(path + ".weight");
      targets.push_back(hf.substr(0, hf.size() - 7));
    }
  }
  return {{"peft_type", "LORA"},
          {"task_type", nullptr},
          {"base_model_name_or_path", base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
          {"r", layout.config.rank},
          {"lora_alpha", layout.config.alpha},
          {"lora_dropout", layout.config.dropout},
          {"target_modules", targets},
          {"modules_to_save", saved},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"init_lora_weights", true},
          {"use_rslora", false},
          {"use_dora", false},
          {"inference_mode", true},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"revision", nullptr}};
}

void save_peft_adapter(const std::string& dir, const nlohmann::json& adapter_config, const models::Model& model,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(cat("lora: cannot create '", dir, "': ", ec.message()));
  std::vector<std::pair<std::string, at::Tensor>> keyed;
  for (const auto& [name, t] : tensors) keyed.emplace_back(peft_key(model, name), t.detach().cpu().contiguous());
  st::save_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), keyed, {{"format", "pt"}});
  st::write_file_atomic((fs::path(dir) / "adapter_config.json").string(), adapter_config.dump(2) + "\n");
}

config::LoraConfig read_peft_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  auto bytes = read_file_bytes(path);
  if (!bytes) throw Error(cat("lora: no adapter_config.json in '", dir, "'"));
  const nlohmann::json j = nlohmann::json::parse(*bytes, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(cat("lora: ", path, " is not a JSON object"));
  auto fail = [&](const std::string& what) { throw Error(cat("lora: ", path, ": ", what)); };
  if (j.value("peft_type", "") != "LORA") fail(cat("peft_type ", j.value("peft_type", std::string("(none)")), ", not LORA"));
  for (const char* k : {"use_dora", "use_rslora", "fan_in_fan_out"})
    if (j.contains(k) && j.at(k).is_boolean() && j.at(k).get<bool>()) fail(cat(k, " is set: mm runs plain LoRA only"));
  if (j.contains("bias") && j.at("bias").is_string() && j.at("bias").get<std::string>() != "none")
    fail(cat("bias '", j.at("bias").get<std::string>(), "': mm trains no biases in LoRA (bias: none)"));
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (j.contains(k) && j.at(k).is_object() && !j.at(k).empty()) fail(cat(k, " is set: one rank and alpha for every layer only"));
  config::LoraConfig c;
  try {
    c.rank = j.at("r").get<int64_t>();
    c.alpha = j.at("lora_alpha").get<double>();
    c.dropout = j.value("lora_dropout", 0.0);
    const nlohmann::json& t = j.at("target_modules");
    if (t.is_string()) c.target = {t.get<std::string>()};  // PEFT's regex form: a full-match pattern
    else c.target = t.get<std::vector<std::string>>();
    if (j.contains("modules_to_save") && j.at("modules_to_save").is_array())
      c.modules_to_save = j.at("modules_to_save").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail(json_error_text(e.what()));
  }
  if (c.rank <= 0 || c.target.empty()) fail("r must be > 0 and target_modules non-empty");
  return c;
}

void load_peft_adapter(models::Model& model, const std::string& dir,
                       const std::function<void(at::Tensor& param, const at::Tensor& value)>& store) {
  const std::string file = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::exists(file)) throw Error(cat("lora: no adapter_model.safetensors in '", dir, "'"));
  st::SafetensorsReader reader(file);
  std::vector<std::pair<std::string, at::Tensor>> wanted;
  std::map<std::string, at::Tensor> params;
  for (auto& [name, p] : model.named_parameters())
    if (p.requires_grad() || LoraLayout::is_adapter(name)) wanted.emplace_back(name, p);
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (auto& [name, p] : wanted) shapes.emplace_back(name, mm::nn::full_shape(p));
  const auto keys = checkpoint::match_checkpoint_names(
      shapes, reader.keys(), [&](const std::string& k) { return reader.info(k).shape; }, file, {},
      [&](const std::string& k) { return parameter_of_peft_key(model, k); });
  at::NoGradGuard no_grad;
  for (auto& [name, param] : wanted) {
    at::Tensor p = param;
    const at::Tensor value = reader.get(keys.at(name));
    if (store) store(p, value);
    else p.copy_(value);
  }
}

LoraLayout attach_peft_adapter(models::Model& model, const std::string& dir) {
  const config::LoraConfig c = read_peft_adapter_config(dir);
  LoraLayout layout = apply_lora_plan(model, c);
  load_peft_adapter(model, dir);
  for (auto& [name, p] : model.named_parameters()) p.requires_grad_(false);  // inference
  return layout;
}

}  // namespace mm::training
