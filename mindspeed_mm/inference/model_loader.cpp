// Loading a model and its prompt settings for inference.
#include "mindspeed_mm/inference/model_loader.h"

#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <fstream>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/core/param_init.h"

namespace fs = std::filesystem;

namespace mm::inference {

LoadedModel load_model(const std::string& path, at::Device device) {
  MM_CHECK(fs::exists(path), "model: '", path, "' does not exist");
  LoadedModel out;
  out.dir = path;
  if (!fs::exists(fs::path(path) / "config.json")) {
    const std::string latest = checkpoint::resolve_resume_dir("auto", path);
    MM_CHECK(!latest.empty(), "model: '", path, "' holds neither a config.json nor a training checkpoint (latest)");
    out.dir = latest;
  }
  if (fs::exists(fs::path(out.dir) / "adapter" / "adapter_config.json"))
    throw Error(cat("model: ", out.dir, " is a LoRA run's checkpoint, which holds only the adapters: use --model BASE_DIR "
                    "--adapter ", (fs::path(out.dir) / "adapter").string(), " (or mm convert merge-lora)"));
  const nlohmann::json hf = checkpoint::read_hf_config(out.dir);
  MM_CHECK(hf.contains("model_type") && hf.at("model_type").is_string(), "model: ", out.dir,
           "/config.json has no model_type");
  const std::string id = hf.at("model_type").get<std::string>();
  {
    mm::nn::DeferredInitGuard deferred;
    out.model = models::as_causal_lm(
        models::model_registry().get(id, "config.json model_type")(hf, out.dir + "/config.json", false),
        "model: " + out.dir);
  }
  mm::nn::materialize(*out.model, device);
  // An HF directory, or a sharded checkpoint (FSDP, ZeRO-1, TP/PP, mm convert): each tensor
  // assembled from its pieces.
  checkpoint::load_model_weights(*out.model, out.dir, {},
                                 [&](const std::string& k) { return out.model->parameter_name(k); });
  const fs::path state = fs::path(out.dir) / "train_state.json";
  if (fs::exists(state)) {
    auto bytes = read_file_bytes(state.string());
    MM_CHECK(bytes, "model: cannot read ", state.string());
    nlohmann::json j = nlohmann::json::parse(*bytes, nullptr, false);
    MM_CHECK(!j.is_discarded() && j.is_object(), "model: ", state.string(), ": not a JSON object (a training checkpoint's state)");
    if (j.contains("config") && j.at("config").is_string())
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
  if (!config_path.empty()) return config::load_config(config_path, data_overrides, /*for_training=*/false).data;
  if (!m.train_config.empty())
    return config::parse_config(m.train_config, m.dir + "/train_state.json", data_overrides, false).data;
  // An HF directory: its tokenizer and image processor settings, then the user's overrides.
  std::vector<std::string> assignments;
  const fs::path dir(m.dir);
  if (fs::exists(dir / "tokenizer.json")) assignments.push_back("data.tokenizer=" + (dir / "tokenizer.json").string());
  const fs::path pre = dir / "preprocessor_config.json";
  if (fs::exists(pre)) {
    auto bytes = read_file_bytes(pre.string());
    nlohmann::json j = bytes ? nlohmann::json::parse(*bytes, nullptr, false) : nlohmann::json();
    MM_CHECK(j.is_object(), "model: ", pre.string(), " is not a JSON object");
    for (const char* k : {"min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size"})
      if (j.contains(k) && j.at(k).is_number_integer())
        assignments.push_back(cat("data.processor.", k, "=", j.at(k).get<int64_t>()));
    for (const char* k : {"image_mean", "image_std"})
      if (j.contains(k) && j.at(k).is_array() && j.at(k).size() == 3) assignments.push_back(cat("data.processor.", k, "=", j.at(k).dump()));
  }
  assignments.insert(assignments.end(), data_overrides.begin(), data_overrides.end());
  return config::parse_config("{}", m.dir, assignments, false).data;
}

}  // namespace mm::inference
