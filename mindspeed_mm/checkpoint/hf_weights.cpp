// Hugging Face weight directories: lazy reading through the shard index, and HF-compatible
// sharded writing (the algorithm of huggingface_hub's split_torch_state_dict_into_shards).
#include "mindspeed_mm/checkpoint/hf_weights.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/core/file_io.h"

namespace mm::st {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

[[noreturn]] void fail(const std::string& where, const std::string& msg) {
  throw Error(cat("hf weights: ", where, ": ", msg));
}


bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

std::string read_text(const std::string& path) {
  auto bytes = read_file_bytes(path);
  if (!bytes) fail(path, "cannot open");
  return std::move(*bytes);
}

bool is_torch_checkpoint(const std::string& name) {
  return ends_with(name, ".pth") || ends_with(name, ".pt") || ends_with(name, ".bin");
}

// A torch.save'd state dict (zip archive or legacy format) as (name, tensor) in file order. A
// nested {"state_dict": {...}} or {"model": {...}} is unwrapped.
std::vector<std::pair<std::string, at::Tensor>> read_torch_state_dict(const std::string& path) {
  auto bytes = read_file_bytes(path);
  if (!bytes) fail(path, "cannot open");
  c10::IValue v;
  try {
    v = torch::jit::pickle_load(std::vector<char>(bytes->begin(), bytes->end()));
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    fail(path, cat("not a PyTorch checkpoint libtorch can read (", what, ")"));
  }
  for (const char* inner : {"state_dict", "model"}) {
    if (!v.isGenericDict()) break;
    for (const auto& kv : v.toGenericDict())
      if (kv.key().isString() && kv.key().toStringRef() == inner && kv.value().isGenericDict()) {
        c10::IValue nested = kv.value();
        v = nested;
        break;
      }
  }
  if (!v.isGenericDict()) fail(path, cat("holds a ", v.tagKind(), ", not a state dict of named tensors"));
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& kv : v.toGenericDict())
    if (kv.key().isString() && kv.value().isTensor()) out.emplace_back(kv.key().toStringRef(), kv.value().toTensor());
  if (out.empty()) fail(path, "holds no named tensors");
  return out;
}

}  // namespace

struct HFWeights::Shard {
  std::string path;
  std::once_flag once;
  std::unique_ptr<SafetensorsReader> reader;
};

HFWeights::HFWeights(const std::string& dir_or_file) : source_(dir_or_file) {
  const fs::path src(dir_or_file);
  std::error_code ec;
  std::vector<std::string> plain_files;  // opened eagerly: their keys are in their headers
  std::string torch_file;
  if (fs::is_directory(src, ec)) {
    // One listing: safetensors (the single file, an index, other shards) before a PyTorch file.
    std::vector<std::string> indexes, shards, torch_files;
    for (const auto& e : fs::directory_iterator(src, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file(ec)) continue;
      if (ends_with(name, ".safetensors.index.json")) indexes.push_back(e.path().string());
      else if (ends_with(name, ".safetensors")) shards.push_back(e.path().string());
      else if (is_torch_checkpoint(name)) torch_files.push_back(e.path().string());
    }
    std::sort(indexes.begin(), indexes.end());
    std::sort(shards.begin(), shards.end());
    std::sort(torch_files.begin(), torch_files.end());
    if (is_file(src / kSingleFile)) {
      plain_files.push_back((src / kSingleFile).string());
    } else if (is_file(src / kIndexFile)) {
      index_path_ = (src / kIndexFile).string();
    } else if (indexes.size() > 1) {
      fail(dir_or_file, cat("several *.safetensors.index.json files (", indexes[0], ", ", indexes[1], "); pass the one to use"));
    } else if (indexes.size() == 1) {
      index_path_ = indexes[0];
    } else if (!shards.empty()) {
      plain_files = shards;
    } else if (torch_files.size() > 1) {
      fail(dir_or_file, cat("several PyTorch checkpoints (", torch_files[0], ", ", torch_files[1], "); pass the one to use"));
    } else if (torch_files.size() == 1) {
      torch_file = torch_files[0];
    } else {
      fail(dir_or_file, cat("no ", kSingleFile, ", ", kIndexFile, " or other *.safetensors file"));
    }
  } else if (is_file(src) && is_torch_checkpoint(dir_or_file)) {
    torch_file = dir_or_file;
  } else if (is_file(src)) {
    if (ends_with(dir_or_file, ".json")) index_path_ = dir_or_file;
    else plain_files.push_back(dir_or_file);
  } else {
    fail(dir_or_file, "no such file or directory");
  }
  if (!torch_file.empty()) {
    for (auto& [name, t] : read_torch_state_dict(torch_file)) {
      if (!pickled_.emplace(name, t).second) fail(torch_file, cat("tensor \"", name, "\" appears twice"));
      keys_.push_back(name);
    }
    return;
  }

  if (!index_path_.empty()) {
    // weight_map: tensor name -> shard file (relative to the index's directory).
    nlohmann::ordered_json index;
    try {
      index = nlohmann::ordered_json::parse(read_text(index_path_));
    } catch (const nlohmann::json::exception& e) {
      fail(index_path_, cat("not valid JSON (", json_error_text(e.what()), ")"));
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail(index_path_, "no \"weight_map\" object");
    const fs::path base = fs::path(index_path_).parent_path();
    std::unordered_map<std::string, size_t> shard_of_file;
    for (const auto& item : index["weight_map"].items()) {
      const std::string& name = item.key();
      if (!item.value().is_string())
        fail(index_path_, cat("weight_map entry for \"", name, "\" is not a string"));
      const std::string file = item.value().get<std::string>();
      auto it = shard_of_file.find(file);
      if (it == shard_of_file.end()) {
        const fs::path rel(file);
        if (rel.is_absolute() || std::find(rel.begin(), rel.end(), fs::path("..")) != rel.end())
          fail(index_path_, cat("shard \"", file, "\" for tensor \"", name, "\" is outside the directory"));
        const fs::path full = base / rel;
        if (!is_file(full))
          fail(index_path_, cat("shard file ", full.string(), " (for tensor \"", name, "\") does not exist"));
        auto shard = std::make_unique<Shard>();
        shard->path = full.string();
        shards_.push_back(std::move(shard));
        it = shard_of_file.emplace(file, shards_.size() - 1).first;
      }
      where_.emplace(name, it->second);
      keys_.push_back(name);
    }
  }

  for (const auto& file : plain_files) {
    auto shard = std::make_unique<Shard>();
    shard->path = file;
    const size_t idx = shards_.size();
    shards_.push_back(std::move(shard));
    for (const auto& name : reader(idx).keys()) {
      auto [it, inserted] = where_.emplace(name, idx);
      if (!inserted)
        fail(dir_or_file, cat("tensor \"", name, "\" is in both ", shards_[it->second]->path, " and ", file));
      keys_.push_back(name);
    }
  }
}

HFWeights::~HFWeights() = default;

const SafetensorsReader& HFWeights::reader(size_t shard) const {
  Shard& s = *shards_[shard];
  std::call_once(s.once, [&] { s.reader = std::make_unique<SafetensorsReader>(s.path); });
  return *s.reader;
}

size_t HFWeights::locate(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(source_, cat("no tensor \"", name, "\" (", keys_.size(), " tensors present)"));
  const SafetensorsReader& r = reader(it->second);
  if (!r.has(name))
    fail(index_path_, cat("maps tensor \"", name, "\" to ", r.path(), ", which does not contain it"));
  return it->second;
}

std::vector<std::string> HFWeights::keys() const { return keys_; }

bool HFWeights::has(const std::string& name) const { return where_.count(name) > 0 || pickled_.count(name) > 0; }

at::Tensor HFWeights::get(const std::string& name) const {
  if (!pickled_.empty()) {
    auto it = pickled_.find(name);
    if (it == pickled_.end()) fail(source_, cat("no tensor \"", name, "\" (", keys_.size(), " tensors present)"));
    return it->second;
  }
  return reader(locate(name)).get(name);
}

void HFWeights::release(const std::string& name, const void* p, size_t bytes) const {
  if (pickled_.empty()) reader(locate(name)).release(p, bytes);
}

TensorInfo HFWeights::info(const std::string& name) const {
  if (!pickled_.empty()) {
    const at::Tensor t = get(name);
    return {t.scalar_type(), t.sizes().vec(), 0, static_cast<uint64_t>(t.nbytes())};
  }
  return reader(locate(name)).info(name);
}

std::vector<std::string> HFWeights::files() const {
  std::vector<std::string> out;
  for (const auto& s : shards_) out.push_back(s->path);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writer

void save_torch_state_dict(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].second.defined()) fail(path, cat("tensor \"", tensors[i].first, "\" is undefined"));
    index.emplace(tensors[i].first, i);
  }
  save_torch_state_dict(path, specs_of(tensors), [&](const std::string& name) { return tensors[index.at(name)].second; });
}

void save_torch_state_dict(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFetch& fetch) {
  // torch.save's layout: a zip (stored, 64-byte aligned records) of archive/data.pkl, a pickle of
  // a plain dict whose tensors are torch._utils._rebuild_tensor_v2 over persistent storages
  // ('storage', torch.FloatStorage, key, 'cpu', numel), and archive/data/<key> per storage.
  // No type tags, so torch.load(weights_only=True) reads it. The pickle needs only each tensor's
  // dtype and shape: it is made from stand-ins that hold no data (never read), and the data is
  // fetched tensor by tensor while the records are written.
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  std::set<std::string> seen;
  // The pickler reads only a tensor's dtype, shape and storage size: a CPU tensor over this
  // address stands for each (from_blob allocates nothing and nobody dereferences it).
  alignas(64) static char kNoData[64];
  for (const auto& spec : specs) {
    if (!seen.insert(spec.name).second) fail(path, cat("duplicate tensor name \"", spec.name, "\""));
    dict.insert(spec.name, at::from_blob(kNoData, spec.shape, [](void*) {}, at::TensorOptions().dtype(spec.dtype)));
  }
  std::vector<char> pkl;
  int64_t next_key = 0;
  torch::jit::Pickler pickler([&](const char* b, size_t n) { pkl.insert(pkl.end(), b, b + n); }, nullptr, nullptr, nullptr,
                              [&](const at::Tensor&) { return std::to_string(next_key++); }, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(dict);
  pickler.stop();
  MM_CHECK(pickler.tensorData().size() == specs.size(), "torch state dict ", path, ": ", pickler.tensorData().size(),
           " storages pickled for ", specs.size(), " tensors");
  write_file_atomic_streaming(path, [&](const ByteSink& sink) {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* b, size_t n) {
      sink(b, n);
      return n;
    });
    writer.writeRecord("data.pkl", pkl.data(), pkl.size());
    writer.writeRecord("byteorder", "little", 6);
    // The dict pickles its entries in insertion order: storage key i is specs[i].
    for (size_t i = 0; i < specs.size(); ++i) {
      at::Tensor c = fetch(specs[i].name).detach().cpu().to(specs[i].dtype).contiguous();
      if (c.sizes().vec() != specs[i].shape)
        fail(path, cat("tensor \"", specs[i].name, "\" fetched with shape ", c.sizes(), ", declared ",
                       c10::IntArrayRef(specs[i].shape)));
      writer.writeRecord(cat("data/", i), c.data_ptr(), c.nbytes());
    }
    writer.writeRecord("version", "3\n", 2);
    writer.writeEndOfFile();
  });
}

std::string weights_stem(const nlohmann::json& hf_config) {
  return hf_config.is_object() && hf_config.contains("_class_name") ? "diffusion_pytorch_model" : "model";
}

void save_hf_weights(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                     uint64_t max_shard_bytes, const std::string& stem) {
  for (const auto& [name, t] : tensors)
    if (!t.defined()) fail(dir, cat("tensor \"", name, "\" is undefined"));
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].first, i);
  save_hf_weights(dir, specs_of(tensors), [&](const std::string& name) { return tensors[index.at(name)].second; },
                  max_shard_bytes, stem);
}

void save_hf_weights(const std::string& dir, const std::vector<TensorSpec>& specs, const TensorFetch& fetch,
                     uint64_t max_shard_bytes, const std::string& stem) {
  const std::string single_file = stem + ".safetensors", index_file = stem + ".safetensors.index.json";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, cat("cannot create directory: ", ec.message()));

  // Shard assignment, as huggingface_hub: an oversized tensor gets its own shard; otherwise a
  // tensor that would push the current shard past the limit starts a new one.
  using Group = std::vector<TensorSpec>;
  std::vector<Group> shards;
  Group current;
  uint64_t current_bytes = 0, total_bytes = 0;
  std::set<std::string> seen;
  for (const auto& spec : specs) {
    if (!seen.insert(spec.name).second) fail(dir, cat("duplicate tensor name \"", spec.name, "\""));
    uint64_t nbytes = at::elementSize(spec.dtype);
    for (int64_t d : spec.shape) nbytes *= static_cast<uint64_t>(d);
    total_bytes += nbytes;
    if (nbytes > max_shard_bytes) {
      shards.push_back({spec});
      continue;
    }
    if (current_bytes + nbytes > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(spec);
    current_bytes += nbytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  const std::map<std::string, std::string> meta{{"format", "pt"}};
  const fs::path base(dir);
  std::set<std::string> written;
  if (shards.size() == 1) {
    save_safetensors((base / single_file).string(), shards[0], fetch, meta);
    written.insert(single_file);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char num[32];
      std::snprintf(num, sizeof num, "-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      const std::string file = stem + num;
      save_safetensors((base / file).string(), shards[i], fetch, meta);
      for (const auto& spec : shards[i]) weight_map[spec.name] = file;
      written.insert(file);
    }
    nlohmann::json index = nlohmann::json::object();
    index["metadata"]["total_size"] = total_bytes;
    index["weight_map"] = std::move(weight_map);
    // json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers writes it.
    write_file_atomic((base / index_file).string(), index.dump(2) + "\n");
    written.insert(index_file);
  }

  // Files of an earlier save that would otherwise shadow or confuse this one.
  const std::regex stale_shard(stem + R"(-\d{5}-of-\d{5}\.safetensors)");
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    const bool ours = name == single_file || name == index_file || std::regex_match(name, stale_shard);
    if (ours && !written.count(name)) stale.push_back(e.path());
  }
  for (const auto& p : stale) fs::remove(p, ec);
}

}  // namespace mm::st
