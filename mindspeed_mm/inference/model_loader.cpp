// Loading a model and its prompt settings for inference.
#include "mindspeed_mm/inference/model_loader.h"

#include <filesystem>
#include <fstream>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"

namespace fs = std::filesystem;

namespace mm::inference {

LoadedModel load_model(const std::string& path) {
  MM_CHECK(fs::exists(path), "model: '", path, "' does not exist");
  LoadedModel out;
  out.dir = path;
  if (!fs::exists(fs::path(path) / "config.json")) {
    const std::string latest = checkpoint::resolve_resume_dir("auto", path);
    MM_CHECK(!latest.empty(), "model: '", path, "' holds neither a config.json nor a training checkpoint (latest)");
    out.dir = latest;
  }
  const nlohmann::json hf = checkpoint::read_hf_config(out.dir);
  MM_CHECK(hf.contains("model_type") && hf.at("model_type").is_string(), "model: ", out.dir,
           "/config.json has no model_type");
  const std::string id = hf.at("model_type").get<std::string>();
  out.model = models::model_registry().get(id, "config.json model_type")(hf, out.dir + "/config.json", false);
  checkpoint::load_model_weights(*out.model, out.dir, {},
                                 [&](const std::string& k) { return out.model->parameter_name(k); });
  const fs::path state = fs::path(out.dir) / "train_state.json";
  if (fs::exists(state)) {
    auto bytes = read_file_bytes(state.string());
    MM_CHECK(bytes, "model: cannot read ", state.string());
    nlohmann::json j = nlohmann::json::parse(*bytes, nullptr, false);
    if (!j.is_discarded() && j.contains("config") && j.at("config").is_string())
      out.train_config = j.at("config").get<std::string>();
  }
  return out;
}

config::DataConfig inference_data_config(const LoadedModel& m, const std::string& config_path,
                                         const std::vector<std::string>& overrides) {
  std::vector<std::string> data_overrides;
  for (const auto& o : overrides) {
    MM_CHECK(o.rfind("data.", 0) == 0, "config: inference overrides set data.* keys only (got '", o, "')");
    data_overrides.push_back(o);
  }
  if (!config_path.empty()) return config::load_config(config_path, data_overrides).data;
  if (!m.train_config.empty())
    return config::parse_config(m.train_config, m.dir + "/train_state.json", data_overrides).data;
  config::DataConfig d = config::parse_config("{}", "defaults", data_overrides).data;
  const fs::path dir(m.dir);
  bool tokenizer_set = false;
  for (const auto& o : data_overrides) tokenizer_set |= o.rfind("data.tokenizer=", 0) == 0;
  if (!tokenizer_set && fs::exists(dir / "tokenizer.json")) d.tokenizer = (dir / "tokenizer.json").string();
  const fs::path pre = dir / "preprocessor_config.json";
  if (fs::exists(pre)) {
    auto bytes = read_file_bytes(pre.string());
    nlohmann::json j = bytes ? nlohmann::json::parse(*bytes, nullptr, false) : nlohmann::json();
    MM_CHECK(j.is_object(), "model: ", pre.string(), " is not a JSON object");
    auto& p = d.processor;
    auto num = [&](const char* k, int64_t& v) {
      if (j.contains(k) && j.at(k).is_number_integer()) v = j.at(k).get<int64_t>();
    };
    num("min_pixels", p.min_pixels);
    num("max_pixels", p.max_pixels);
    num("patch_size", p.patch_size);
    num("temporal_patch_size", p.temporal_patch_size);
    num("merge_size", p.merge_size);
    for (const char* k : {"image_mean", "image_std"})
      if (j.contains(k) && j.at(k).is_array() && j.at(k).size() == 3)
        (std::string(k) == "image_mean" ? p.image_mean : p.image_std) = j.at(k).get<std::vector<double>>();
  }
  return d;
}

}  // namespace mm::inference
