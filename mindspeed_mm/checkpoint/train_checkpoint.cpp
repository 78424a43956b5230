#include "mindspeed_mm/checkpoint/train_checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/file_io.h"

namespace fs = std::filesystem;

namespace mm::checkpoint {
namespace {

std::string read_text(const std::string& path) {
  auto bytes = read_file_bytes(path);
  if (!bytes) throw Error(cat("checkpoint: cannot read '", path, "'"));
  return std::move(*bytes);
}

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(cat("checkpoint: '", path, "' is not valid JSON (", e.what(), ")"));
  }
}

std::vector<std::pair<std::string, at::Tensor>> contiguous_cpu(const std::vector<std::pair<std::string, at::Tensor>>& in) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [n, t] : in) out.emplace_back(n, t.detach().to(at::kCPU).contiguous());
  return out;
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

std::string save_train_checkpoint(const std::string& save_dir, const TrainState& state, const nlohmann::json& hf_config,
                                  const mm::nn::Module& model, const training::Optimizer& optimizer) {
  const std::string name = iteration_dir_name(state.iteration);
  const fs::path final_dir = fs::path(save_dir) / name;
  const fs::path tmp_dir = fs::path(save_dir) / ("." + name + ".tmp");
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec) throw Error(cat("checkpoint: cannot create '", save_dir, "': ", ec.message()));
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  st::write_file_atomic((tmp_dir / "config.json").string(), hf_config.dump(2) + "\n");
  st::save_safetensors((tmp_dir / "model.safetensors").string(), contiguous_cpu(model.named_parameters()),
                       {{"format", "pt"}});
  st::save_safetensors((tmp_dir / "optimizer.safetensors").string(), contiguous_cpu(optimizer.state()));
  at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  st::save_safetensors((tmp_dir / "rng.safetensors").string(), {{"cpu", rng.contiguous()}});
  nlohmann::json js = {{"iteration", state.iteration},
                       {"consumed_samples", state.consumed_samples},
                       {"sampler", state.sampler},
                       {"config", state.config_yaml}};
  st::write_file_atomic((tmp_dir / "train_state.json").string(), js.dump(2) + "\n");

  // Replace an older copy of the same iteration (a resumed run saving again) only now that the
  // new one is complete.
  if (fs::exists(final_dir)) {
    fs::path old = fs::path(save_dir) / ("." + name + ".old");
    fs::remove_all(old);
    fs::rename(final_dir, old);
    fs::rename(tmp_dir, final_dir);
    fs::remove_all(old);
  } else {
    fs::rename(tmp_dir, final_dir);
  }
  st::write_file_atomic((fs::path(save_dir) / "latest").string(), name + "\n");
  return final_dir.string();
}

std::string resolve_resume_dir(const std::string& resume, const std::string& save_dir) {
  if (resume.empty()) return "";
  if (resume == "auto") {
    fs::path latest = fs::path(save_dir) / "latest";
    if (!fs::exists(latest)) return "";
    std::string name = read_text(latest.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    fs::path dir = fs::path(save_dir) / name;
    if (!fs::is_directory(dir))
      throw Error(cat("checkpoint: '", latest.string(), "' names '", name, "', which does not exist"));
    return dir.string();
  }
  if (!fs::is_directory(resume)) throw Error(cat("checkpoint: training.resume '", resume, "' is not a directory"));
  return resume;
}

void load_model_weights(mm::nn::Module& model, const std::string& source, const std::vector<std::string>& ignorable,
                        const std::function<std::string(const std::string&)>& rename) {
  st::HFWeights weights(source);
  std::map<std::string, std::string> by_model_name;  // model name -> checkpoint name
  std::vector<std::string> unexpected;
  for (auto& k : weights.keys()) {
    const std::string name = rename ? rename(k) : k;
    if (!by_model_name.emplace(name, k).second) unexpected.push_back(cat(k, " (a second ", name, ")"));
  }
  const std::map<std::string, std::string> source_name = by_model_name;
  std::vector<std::string> missing, mismatched;
  auto params = model.named_parameters();
  for (auto& [name, p] : params) {
    auto it = by_model_name.find(name);
    if (it == by_model_name.end()) {
      missing.push_back(name);
      continue;
    }
    auto info = weights.info(it->second);
    if (std::vector<int64_t>(p.sizes().begin(), p.sizes().end()) != info.shape)
      mismatched.push_back(cat(it->second, " ", c10::IntArrayRef(info.shape), " vs model ", p.sizes()));
    by_model_name.erase(it);
  }
  for (auto& [name, k] : by_model_name)
    if (std::find(ignorable.begin(), ignorable.end(), name) == ignorable.end()) unexpected.push_back(k);
  auto first = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 5; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 5) s += cat(", ... (", v.size(), " in all)");
    return s;
  };
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty()) {
    std::string msg = cat("checkpoint: '", source, "' does not fit the model:");
    if (!missing.empty()) msg += " missing " + first(missing) + ";";
    if (!mismatched.empty()) msg += " shape mismatch " + first(mismatched) + ";";
    if (!unexpected.empty()) msg += " unexpected " + first(unexpected) + ";";
    msg.pop_back();
    throw Error(msg);
  }
  at::NoGradGuard no_grad;
  for (auto& [name, p] : params) p.copy_(weights.get(source_name.at(name)));
}

TrainState load_train_checkpoint(const std::string& dir, mm::nn::Module& model, training::Optimizer& optimizer) {
  load_model_weights(model, (fs::path(dir) / "model.safetensors").string());
  st::SafetensorsReader opt((fs::path(dir) / "optimizer.safetensors").string());
  optimizer.load_state([&](const std::string& name) { return opt.get_copy(name); });
  st::SafetensorsReader rng((fs::path(dir) / "rng.safetensors").string());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.get_copy("cpu"));
  }
  nlohmann::json js = read_json((fs::path(dir) / "train_state.json").string());
  TrainState s;
  try {
    s.iteration = js.at("iteration").get<int64_t>();
    s.consumed_samples = js.at("consumed_samples").get<int64_t>();
    s.sampler = js.at("sampler");
    s.config_yaml = js.value("config", "");
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("checkpoint: ", dir, "/train_state.json: ", e.what()));
  }
  return s;
}

void export_hf_directory(const std::string& dir, const nlohmann::json& hf_config, const mm::nn::Module& model,
                         uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(cat("export: cannot create '", dir, "': ", ec.message()));
  st::save_hf_weights(dir, contiguous_cpu(model.named_parameters()), max_shard_bytes);
  st::write_file_atomic((fs::path(dir) / "config.json").string(), hf_config.dump(2) + "\n");
}

nlohmann::json read_hf_config(const std::string& dir) {
  fs::path p = fs::path(dir);
  if (fs::is_directory(p)) p /= "config.json";
  if (!fs::exists(p)) throw Error(cat("model: no config.json in '", dir, "'"));
  return read_json(p.string());
}

}  // namespace mm::checkpoint
