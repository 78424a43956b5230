#include "mindspeed_mm/config/config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <yaml-cpp/depthguard.h>

#include "mindspeed_mm/core/file_io.h"

namespace mm::config {
namespace {

YAML::Node load_yaml(const std::string& text, const std::string& name) {
  try {
    YAML::Node root = YAML::Load(text);
    if (!root || root.IsNull()) return YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) throw ConfigError(cat("config: ", name, " must hold a YAML mapping of sections"));
    return root;
  } catch (const YAML::DeepRecursion& e) {
    throw ConfigError(cat("config: ", name, " line ", e.mark.line + 1, ": invalid YAML (nested too deeply: depth ",
                          e.depth(), ")"));
  } catch (const YAML::ParserException& e) {
    throw ConfigError(cat("config: ", name, " line ", e.mark.line + 1, ": invalid YAML (", e.msg, ")"));
  }
}

// Rules that involve more than one field.
void validate(const Config& c, const Source& src, bool for_training) {
  auto fail = [&](const std::string& msg) { throw ConfigError(cat("config: ", msg, " in ", src.file)); };
  const auto& p = c.parallel;
  if (p.data_parallel_shard_size == 0) fail("parallel.data_parallel_shard_size must be >= 1, or -1 for the rest of the world");
  // The built-in datasets read files; a registered dataset may generate its data.
  const bool reads_files = c.data.dataset == "text" || c.data.dataset == "mllm";
  if (for_training && reads_files && c.data.paths.empty()) fail("data.paths must name at least one file or directory");
  if (c.model.config.is_null() || (!c.model.config.is_object()))
    fail("model.config must be a mapping of Hugging Face config.json fields");
  if (for_training && c.model.pretrained.empty() && c.model.config_path.empty() && c.model.config.empty())
    fail("model needs one of model.pretrained, model.config_path or model.config");
  if (c.training.optimizer.betas.size() != 2)
    fail(cat("training.optimizer.betas must hold 2 numbers (got ", c.training.optimizer.betas.size(), ")"));
  if (c.training.lr_schedule.min_lr > c.training.optimizer.lr)
    fail(cat("training.lr_schedule.min_lr (", c.training.lr_schedule.min_lr, ") must be <= training.optimizer.lr (",
             c.training.optimizer.lr, ")"));
  if (for_training && c.training.resume == "auto" && c.training.save_dir.empty())
    fail("training.resume: auto needs training.save_dir");
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& name, const std::vector<std::string>& overrides,
                    bool for_training) {
  Source src;
  src.file = name;
  YAML::Node root = load_yaml(yaml_text, name);
  for (auto& o : overrides) apply_override(root, o, src);
  Config c;
  Reader r(root, "", &src);
  c.io(r);
  r.finish();
  c.source_file = name;
  validate(c, src, for_training);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, bool for_training) {
  const std::optional<std::string> text = read_file_bytes(path);
  if (!text) throw ConfigError(cat("config: ", path, ": ", unreadable_reason(path)));
  if (text->find_first_not_of(" \t\r\n") == std::string::npos)
    throw ConfigError(cat("config: ", path, ": empty (a config holds at least its data and model sections)"));
  Config c = parse_config(*text, std::filesystem::path(path).filename().string(), overrides, for_training);
  c.source_file = path;
  return c;
}

std::string to_yaml(const Config& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  Writer w(out);
  const_cast<Config&>(c).io(w);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace mm::config
