#include "mindspeed_mm/training/model_builder.h"

#include "mindspeed_mm/training/lora.h"

#include <filesystem>

#include "mindspeed_mm/core/param_init.h"

namespace fs = std::filesystem;

namespace mm::training {

nlohmann::json resolve_hf_config(const config::ModelConfig& m, int64_t tokenizer_vocab, bool* strict) {
  nlohmann::json cfg = nlohmann::json::object();
  if (!m.pretrained.empty()) cfg = checkpoint::read_hf_config(m.pretrained);
  else if (!m.config_path.empty()) cfg = checkpoint::read_hf_config(m.config_path);
  // Fields written in our YAML are checked strictly only when they are the whole config; on top
  // of a real config.json the model ignores fields it does not use, as Hugging Face does.
  if (strict) *strict = cfg.empty();
  for (auto& [k, v] : m.config.items()) {
    if (v.is_null()) cfg.erase(k);  // `model.config.key=null` removes a field
    else cfg[k] = v;
  }
  if (tokenizer_vocab > 0) {
    if (!cfg.contains("vocab_size")) cfg["vocab_size"] = tokenizer_vocab;
    if (cfg["vocab_size"].is_number_integer() && cfg["vocab_size"].get<int64_t>() < tokenizer_vocab)
      throw ConfigError(cat("config: model vocab_size ", cfg["vocab_size"].get<int64_t>(),
                            " is smaller than the tokenizer's ", tokenizer_vocab, " ids"));
  }
  return cfg;
}

namespace {

struct PartSpec {
  size_t index;  // into the model's parts()
  std::string pretrained;
  bool trainable = true;
};

std::vector<PartSpec> part_specs(const models::Model& model, const config::ModelConfig& m) {
  MM_CHECK(m.parts.is_object(), "config: model.parts must be a map of part names (got ", m.parts.dump(), ")");
  const std::vector<models::ModelPart> parts = model.parts();
  std::vector<PartSpec> specs;
  for (auto& [name, v] : m.parts.items()) {
    const std::string key = "model.parts." + name;
    size_t index = parts.size();
    std::string known;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].name == name) index = i;
      known += (known.empty() ? "" : ", ") + parts[i].name;
    }
    if (index == parts.size())
      throw ConfigError(cat("config: ", key, ": model ", m.id, " has no part '", name, "' (its parts: ", known, ")"));
    PartSpec s{index, "", true};
    if (v.is_string()) {
      s.pretrained = v.get<std::string>();
    } else if (v.is_object()) {
      for (auto& [k, x] : v.items()) {
        if (k == "pretrained" && x.is_string()) s.pretrained = x.get<std::string>();
        else if (k == "trainable" && x.is_boolean()) s.trainable = x.get<bool>();
        else
          throw ConfigError(cat("config: ", key, ".", k, ": expected pretrained (a directory) or trainable (true/false), got ",
                                x.dump()));
      }
    } else {
      throw ConfigError(cat("config: ", key, " must be a directory or {pretrained: DIR, trainable: BOOL} (got ", v.dump(), ")"));
    }
    specs.push_back(s);
  }
  return specs;
}

std::vector<std::pair<std::string, at::Tensor>> part_parameters(const models::Model& model, size_t index) {
  const auto parts = model.parts();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, p] : model.named_parameters())
    if (models::part_of(parts, name) == index && !LoraLayout::is_adapter(name)) out.emplace_back(name, p);
  return out;
}

}  // namespace

void load_part_weights(models::Model& model, const config::ModelConfig& m, const checkpoint::WeightStore& store) {
  const auto parts = model.parts();
  for (const PartSpec& s : part_specs(model, m)) {
    if (s.pretrained.empty()) continue;
    const std::string prefix = parts[s.index].prefix;
    checkpoint::load_weights(part_parameters(model, s.index), s.pretrained, model.optional_checkpoint_tensors(),
                             [&](const std::string& k) { return model.parameter_name(prefix + k); }, store);
  }
}

int64_t freeze_parts(models::Model& model, const config::ModelConfig& m) {
  int64_t n = 0;
  for (const PartSpec& s : part_specs(model, m)) {
    if (s.trainable) continue;
    for (auto& [name, p] : part_parameters(model, s.index)) {
      p.requires_grad_(false);
      ++n;
    }
  }
  return n;
}

std::shared_ptr<models::Model> build_model(const config::ModelConfig& m, int64_t tokenizer_vocab, uint64_t seed,
                                           const std::string* source_file, bool deferred, at::Device device) {
  bool strict = false;
  nlohmann::json hf = resolve_hf_config(m, tokenizer_vocab, &strict);
  std::string source = !m.pretrained.empty()    ? m.pretrained + "/config.json"
                       : !m.config_path.empty() ? m.config_path
                                                : "model.config";
  if (source_file && m.pretrained.empty() && m.config_path.empty())
    source += " in " + fs::path(*source_file).filename().string();
  std::shared_ptr<models::Model> model;
  {
    mm::nn::DeferredInitGuard meta;
    model = models::model_registry().get(m.id, "model.id")(hf, source, strict);
  }
  if (deferred) return model;
  mm::nn::materialize(*model, device);
  model->init_weights(seed);
  if (!m.pretrained.empty())
    checkpoint::load_model_weights(*model, m.pretrained, model->optional_checkpoint_tensors(),
                                   [&](const std::string& k) { return model->parameter_name(k); });
  load_part_weights(*model, m);
  return model;
}

std::shared_ptr<models::Model> build_model(const config::ModelConfig& m, const data::TrainData& data, uint64_t seed,
                                           const std::string* source_file, bool deferred, at::Device device) {
  return build_model(m, data.vocab_size, seed, source_file, deferred, device);
}

}  // namespace mm::training
