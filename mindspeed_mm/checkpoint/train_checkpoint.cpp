#include "mindspeed_mm/checkpoint/train_checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
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

std::vector<std::pair<std::string, at::Tensor>> detached(const std::vector<std::pair<std::string, at::Tensor>>& in) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [n, t] : in) out.emplace_back(n, t.detach());
  return out;
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

namespace {

std::string rank_file(const char* kind, int rank, const char* ext) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s.rank%05d.%s", kind, rank, ext);
  return buf;
}

// A rank's pieces as 1-D tensors; where each came from travels in the file's metadata.
void write_pieces(const fs::path& path, const std::vector<ShardEntry>& entries) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json placement = nlohmann::json::object();
  for (const ShardEntry& e : entries) {
    MM_CHECK(e.data.numel() == e.end - e.begin, "checkpoint: piece of ", e.name, " holds ", e.data.numel(),
             " elements for the range [", e.begin, ", ", e.end, ")");
    tensors.emplace_back(e.name, e.data.detach().reshape({-1}));  // to the host one at a time, while writing
    placement[e.name] = {{"shape", e.shape}, {"begin", e.begin}, {"end", e.end}};
  }
  st::save_safetensors(path.string(), tensors, {{"mm_placement", placement.dump()}});
}

// metadata.json from every rank's piece files: global shapes, dtypes and the placement of each piece.
nlohmann::json collect_metadata(const fs::path& dir, int world) {
  nlohmann::json meta = {{"format", "mm-sharded-v1"}, {"world", world}, {"tensors", nlohmann::json::object()}};
  for (const char* kind : {"model", "optimizer"}) {
    nlohmann::json& out = meta["tensors"][kind];
    out = nlohmann::json::object();
    for (int r = 0; r < world; ++r) {
      const std::string name = rank_file(kind, r, "safetensors");
      st::SafetensorsReader reader((dir / name).string());
      auto it = reader.metadata().find("mm_placement");
      if (it == reader.metadata().end()) throw Error(cat("checkpoint: ", (dir / name).string(), " has no placement metadata"));
      const nlohmann::json placement = nlohmann::json::parse(it->second);
      for (auto& [t, where] : placement.items()) {
        nlohmann::json& e = out[t];
        e["shape"] = where["shape"];
        e["dtype"] = st::dtype_to_safetensors(reader.info(t).dtype);
        e["shards"].push_back({{"file", name}, {"begin", where["begin"]}, {"end", where["end"]}});
      }
    }
  }
  return meta;
}

}  // namespace

std::string save_checkpoint(const std::string& save_dir, const TrainState& state, const nlohmann::json& hf_config,
                            const RankCheckpoint& mine, int rank, int world, const std::function<void()>& barrier) {
  const std::string name = iteration_dir_name(state.iteration);
  const fs::path final_dir = fs::path(save_dir) / name;
  const fs::path tmp_dir = fs::path(save_dir) / ("." + name + ".tmp");
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(save_dir, ec);
    if (ec) throw Error(cat("checkpoint: cannot create '", save_dir, "': ", ec.message()));
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
  }
  barrier();

  // Every rank: its own files.
  if (mine.sharded) {
    write_pieces(tmp_dir / rank_file("model", rank, "safetensors"), mine.model_shards);
    write_pieces(tmp_dir / rank_file("optimizer", rank, "safetensors"), mine.optimizer_shards);
  } else if (rank == 0) {
    MM_CHECK(mine.model, "checkpoint: rank 0 of an unsharded save needs the model");
    // Streamed: one tensor at a time comes to the host while the file is written.
    st::save_safetensors((tmp_dir / "model.safetensors").string(), detached(mine.model->named_parameters()),
                         {{"format", "pt"}});
    st::save_safetensors((tmp_dir / "optimizer.safetensors").string(), detached(mine.optimizer_state));
  }
  st::write_file_atomic((tmp_dir / rank_file("loader", rank, "json")).string(), mine.loader_state.dump() + "\n");
  const char* kill = std::getenv("MM_DEBUG_KILL_IN_SAVE");
  const char* kill_rank = std::getenv("MM_DEBUG_KILL_RANK");
  if (kill && std::atoll(kill) == state.iteration && (kill_rank ? std::atoi(kill_rank) : 0) == rank) std::raise(SIGKILL);
  barrier();

  // Rank 0: the shared files, then the rename that makes the folder visible, then `latest`.
  if (rank == 0) {
    if (mine.sharded) st::write_file_atomic((tmp_dir / "metadata.json").string(), collect_metadata(tmp_dir, world).dump(1) + "\n");
    st::write_file_atomic((tmp_dir / "config.json").string(), hf_config.dump(2) + "\n");
    std::vector<std::pair<std::string, at::Tensor>> rng = {{"cpu", at::detail::getDefaultCPUGenerator().get_state()}};
    if (state.device_rng.second.defined()) rng.push_back(state.device_rng);
    st::save_safetensors((tmp_dir / "rng.safetensors").string(), rng);
    nlohmann::json js = {{"iteration", state.iteration},
                         {"consumed_samples", state.consumed_samples},
                         {"sampler", state.sampler},
                         {"loader_world", world},
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
  }
  barrier();
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
                        const std::function<std::string(const std::string&)>& rename, const WeightStore& store) {
  load_weights(model.named_parameters(), source, ignorable, rename, store);
}

void load_weights(const std::vector<std::pair<std::string, at::Tensor>>& params, const std::string& source,
                  const std::vector<std::string>& ignorable, const std::function<std::string(const std::string&)>& rename,
                  const WeightStore& store) {
  st::HFWeights weights(source);
  std::map<std::string, std::string> by_model_name;  // model name -> checkpoint name
  std::vector<std::string> unexpected;
  for (auto& k : weights.keys()) {
    const std::string name = rename ? rename(k) : k;
    if (!by_model_name.emplace(name, k).second) unexpected.push_back(cat(k, " (a second ", name, ")"));
  }
  const std::map<std::string, std::string> source_name = by_model_name;
  std::vector<std::string> missing, mismatched;
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
  for (const auto& [name, param] : params) {
    at::Tensor p = param;  // the same TensorImpl
    if (store) store(p, weights.get(source_name.at(name)));
    else p.copy_(weights.get(source_name.at(name)));
  }
}

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const fs::path meta_path = fs::path(dir) / "metadata.json";
  sharded_ = fs::exists(meta_path);
  if (!sharded_) {
    for (const char* kind : {"model", "optimizer"}) {
      const std::string name = std::string(kind) + ".safetensors";
      if (!fs::exists(fs::path(dir) / name))
        throw Error(cat("checkpoint: '", dir, "' has neither metadata.json nor ", name));
      const st::SafetensorsReader& f = file(name);
      for (const auto& key : f.keys()) {
        const st::TensorInfo& info = f.info(key);
        int64_t n = 1;
        for (int64_t d : info.shape) n *= d;
        entries_[kind][key] = {info.shape, info.dtype, {{name, 0, n}}};
      }
    }
    return;
  }
  const nlohmann::json meta = read_json(meta_path.string());
  try {
    for (const char* kind : {"model", "optimizer"})
      for (auto& [key, e] : meta.at("tensors").at(kind).items()) {
        Entry entry;
        entry.shape = e.at("shape").get<std::vector<int64_t>>();
        entry.dtype = st::dtype_from_safetensors(e.at("dtype").get<std::string>());
        for (auto& piece : e.at("shards"))
          entry.pieces.push_back({piece.at("file").get<std::string>(), piece.at("begin").get<int64_t>(),
                                  piece.at("end").get<int64_t>()});
        entries_[kind][key] = std::move(entry);
      }
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("checkpoint: ", meta_path.string(), ": ", e.what()));
  }
}

CheckpointReader::~CheckpointReader() = default;

const st::SafetensorsReader& CheckpointReader::file(const std::string& name) const {
  auto it = files_.find(name);
  if (it == files_.end())
    it = files_.emplace(name, std::make_shared<st::SafetensorsReader>((fs::path(dir_) / name).string())).first;
  return *it->second;
}

bool CheckpointReader::has(const std::string& kind, const std::string& name) const {
  auto k = entries_.find(kind);
  return k != entries_.end() && k->second.count(name) > 0;
}

std::vector<std::string> CheckpointReader::names(const std::string& kind) const {
  std::vector<std::string> out;
  auto k = entries_.find(kind);
  if (k != entries_.end())
    for (auto& [name, _] : k->second) out.push_back(name);
  return out;
}

std::vector<int64_t> CheckpointReader::shape(const std::string& kind, const std::string& name) const {
  if (!has(kind, name)) throw Error(cat("checkpoint: '", dir_, "' has no ", kind, " tensor '", name, "'"));
  return entries_.at(kind).at(name).shape;
}

at::ScalarType CheckpointReader::dtype(const std::string& kind, const std::string& name) const {
  shape(kind, name);  // the error for a missing tensor
  return entries_.at(kind).at(name).dtype;
}

at::Tensor CheckpointReader::read(const std::string& kind, const std::string& name, int64_t begin, int64_t end) const {
  if (!has(kind, name)) throw Error(cat("checkpoint: '", dir_, "' has no ", kind, " tensor '", name, "'"));
  const Entry& e = entries_.at(kind).at(name);
  at::Tensor out;
  int64_t covered = 0;
  for (const Piece& p : e.pieces) {
    const int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.end);
    if (hi <= lo) continue;
    at::Tensor src = file(p.file).get(name).reshape({-1});
    if (!out.defined()) out = at::empty({end - begin}, src.options());
    out.narrow(0, lo - begin, hi - lo).copy_(src.narrow(0, lo - p.begin, hi - lo));
    covered += hi - lo;
  }
  if (end == begin) return at::empty({0}, e.dtype);
  if (covered != end - begin)
    throw Error(cat("checkpoint: '", dir_, "': elements [", begin, ", ", end, ") of ", kind, " tensor '", name,
                    "' are not all in its pieces (a rank's files missing?)"));
  return out;
}

at::Tensor CheckpointReader::read_full(const std::string& kind, const std::string& name) const {
  const auto s = shape(kind, name);
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return read(kind, name, 0, n).view(s);
}

TrainState CheckpointReader::train_state() const {
  nlohmann::json js = read_json((fs::path(dir_) / "train_state.json").string());
  TrainState s;
  try {
    s.iteration = js.at("iteration").get<int64_t>();
    s.consumed_samples = js.at("consumed_samples").get<int64_t>();
    s.sampler = js.at("sampler");
    s.config_yaml = js.value("config", "");
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("checkpoint: ", dir_, "/train_state.json: ", e.what()));
  }
  return s;
}

at::Tensor CheckpointReader::rng_state(const std::string& which) const {
  st::SafetensorsReader rng((fs::path(dir_) / "rng.safetensors").string());
  if (which != "cpu" && !rng.has(which)) return at::Tensor();
  return rng.get_copy(which);
}

nlohmann::json CheckpointReader::loader_state(int rank, int world) const {
  nlohmann::json js = read_json((fs::path(dir_) / "train_state.json").string());
  const fs::path own = fs::path(dir_) / rank_file("loader", rank, "json");
  if (js.value("loader_world", 1) == world && fs::exists(own)) return read_json(own.string());
  return js.at("sampler");
}

void export_hf_directory(const std::string& dir, const nlohmann::json& hf_config, const mm::nn::Module& model,
                         uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(cat("export: cannot create '", dir, "': ", ec.message()));
  st::save_hf_weights(dir, detached(model.named_parameters()), max_shard_bytes);  // streamed to the host
  st::write_file_atomic((fs::path(dir) / "config.json").string(), hf_config.dump(2) + "\n");
}

void export_hf_streaming(const std::string& dir, const nlohmann::json& hf_config, const std::vector<st::TensorSpec>& specs,
                         const st::TensorFetch& fetch, uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(cat("export: cannot create '", dir, "': ", ec.message()));
  st::save_hf_weights(dir, specs, fetch, max_shard_bytes);
  st::write_file_atomic((fs::path(dir) / "config.json").string(), hf_config.dump(2) + "\n");
}

void export_hf_from_checkpoint(const CheckpointReader& reader, const std::string& dir, uint64_t max_shard_bytes) {
  std::vector<st::TensorSpec> specs;
  for (const auto& name : reader.names("model"))
    specs.push_back({name, reader.dtype("model", name), reader.shape("model", name)});
  export_hf_streaming(dir, read_hf_config(reader.dir()), specs,
                      [&](const std::string& name) { return reader.read_full("model", name); }, max_shard_bytes);
}

nlohmann::json read_hf_config(const std::string& dir) {
  fs::path p = fs::path(dir);
  if (fs::is_directory(p)) p /= "config.json";
  if (!fs::exists(p)) throw Error(cat("model: no config.json in '", dir, "'"));
  return read_json(p.string());
}

}  // namespace mm::checkpoint
