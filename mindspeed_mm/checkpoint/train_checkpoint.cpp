#include "mindspeed_mm/checkpoint/train_checkpoint.h"

#include "mindspeed_mm/core/param_init.h"

#include <ATen/core/grad_mode.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
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
#include "mindspeed_mm/core/strings.h"

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
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("checkpoint: '", path, "' is not valid JSON (", json_error_text(e.what()), ")"));
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

std::string rank_file_name(const std::string& kind, int rank, const std::string& ext) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), ".rank%05d.", rank);
  return kind + buf + ext;
}

bool is_sharded_checkpoint(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / "metadata.json"); }

namespace {

std::string rank_file(const char* kind, int rank, const char* ext) { return rank_file_name(kind, rank, ext); }

// A rank's pieces as 1-D tensors; where each came from travels in the file's metadata.
void write_pieces(const fs::path& path, const std::vector<ShardEntry>& entries, const RankCheckpoint& mine) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json placement = nlohmann::json::object();
  for (const ShardEntry& e : entries) {
    MM_CHECK(e.data.numel() == e.end - e.begin, "checkpoint: piece of ", e.name, " holds ", e.data.numel(),
             " elements for the range [", e.begin, ", ", e.end, ")");
    tensors.emplace_back(e.name, e.data.detach().reshape({-1}));  // to the host one at a time, while writing
    placement[e.name] = {{"shape", e.shape}, {"begin", e.begin}, {"end", e.end}};
    if (!e.box.whole()) {
      placement[e.name]["view"] = e.box.view;
      placement[e.name]["offset"] = e.box.offset;
      placement[e.name]["box"] = e.box.sizes;
    }
  }
  std::map<std::string, std::string> meta = {{"mm_placement", placement.dump()}};
  if (!mine.placement.is_null()) meta["mm_rank_placement"] = mine.placement.dump();
  if (!mine.mesh.is_null()) meta["mm_mesh"] = mine.mesh.dump();
  st::save_safetensors(path.string(), tensors, meta);
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
      nlohmann::json rank_placement;
      if (auto p = reader.metadata().find("mm_rank_placement"); p != reader.metadata().end())
        rank_placement = nlohmann::json::parse(p->second);
      if (auto m = reader.metadata().find("mm_mesh"); m != reader.metadata().end() && !meta.contains("mesh"))
        meta["mesh"] = nlohmann::json::parse(m->second);
      for (auto& [t, where] : placement.items()) {
        nlohmann::json& e = out[t];
        e["shape"] = where["shape"];
        e["dtype"] = st::dtype_to_safetensors(reader.info(t).dtype);
        nlohmann::json piece = {{"file", name}, {"begin", where["begin"]}, {"end", where["end"]}};
        for (const char* k : {"view", "offset", "box"})
          if (where.contains(k)) piece[k] = where[k];
        if (!rank_placement.is_null()) piece["placement"] = rank_placement;
        e["shards"].push_back(std::move(piece));
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
    write_pieces(tmp_dir / rank_file("model", rank, "safetensors"), mine.model_shards, mine);
    write_pieces(tmp_dir / rank_file("optimizer", rank, "safetensors"), mine.optimizer_shards, mine);
  } else if (rank == 0) {
    MM_CHECK(mine.model, "checkpoint: rank 0 of an unsharded save needs the model");
    // Streamed: one tensor at a time comes to the host while the file is written.
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (auto& [name, p] : mine.model->named_parameters())
      if (!mine.trainable_only || p.requires_grad()) params.emplace_back(name, p);
    st::save_safetensors((tmp_dir / "model.safetensors").string(), detached(params), {{"format", "pt"}});
    st::save_safetensors((tmp_dir / "optimizer.safetensors").string(), detached(mine.optimizer_state));
  }
  if (mine.writes_loader)
    st::write_file_atomic((tmp_dir / rank_file("loader", mine.loader_rank >= 0 ? mine.loader_rank : rank, "json")).string(),
                          mine.loader_state.dump() + "\n");
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
                         {"loader_world", mine.loader_world > 0 ? mine.loader_world : world},
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
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || printable(name) != name)
      throw Error(cat("checkpoint: '", latest.string(), "' does not name a checkpoint folder (it holds '",
                      printable(name, 40), "'; expected iter_NNNNNNN)"));
    fs::path dir = fs::path(save_dir) / name;
    if (!fs::is_directory(dir))
      throw Error(cat("checkpoint: '", latest.string(), "' names '", name, "', which does not exist"));
    return dir.string();
  }
  if (!fs::is_directory(resume)) throw Error(cat("checkpoint: training.resume '", resume, "' is not a directory"));
  return resume;
}

std::string first_checkpoint_in(const std::string& save_dir) {
  std::error_code ec;
  if (save_dir.empty() || !fs::is_directory(save_dir, ec)) return "";
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("iter_", 0) == 0 && e.is_directory(ec)) found.push_back(n);
  }
  std::sort(found.begin(), found.end());
  return found.empty() ? "" : found.front();
}

void load_model_weights(mm::nn::Module& model, const std::string& source, const std::vector<std::string>& ignorable,
                        const std::function<std::string(const std::string&)>& rename, const WeightStore& store) {
  load_weights(model.named_parameters(), source, ignorable, rename, store);
}

std::map<std::string, std::string> match_checkpoint_names(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& wanted, const std::vector<std::string>& keys,
    const std::function<std::vector<int64_t>(const std::string&)>& shape_of, const std::string& source,
    const std::vector<std::string>& ignorable, const std::function<std::string(const std::string&)>& rename) {
  std::map<std::string, std::string> by_model_name;  // model name -> checkpoint name
  std::vector<std::string> unexpected;
  for (auto& k : keys) {
    const std::string name = rename ? rename(k) : k;
    if (!by_model_name.emplace(name, k).second) unexpected.push_back(cat(k, " (a second ", name, ")"));
  }
  std::map<std::string, std::string> matched;
  std::vector<std::string> missing, mismatched;
  for (auto& [name, shape] : wanted) {
    auto it = by_model_name.find(name);
    if (it == by_model_name.end()) {
      missing.push_back(name);
      continue;
    }
    const std::vector<int64_t> stored = shape_of(it->second);
    if (shape != stored)
      mismatched.push_back(cat(it->second, " ", c10::IntArrayRef(stored), " vs model ", c10::IntArrayRef(shape)));
    matched.emplace(name, it->second);
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
  return matched;
}

void load_weights(const std::vector<std::pair<std::string, at::Tensor>>& params, const std::string& source,
                  const std::vector<std::string>& ignorable, const std::function<std::string(const std::string&)>& rename,
                  const WeightStore& store) {
  // An HF directory or file, or a sharded checkpoint (its model tensors, each read whole).
  std::unique_ptr<st::HFWeights> hf;
  std::unique_ptr<CheckpointReader> ckpt;
  if (is_sharded_checkpoint(source)) ckpt = std::make_unique<CheckpointReader>(source);
  else hf = std::make_unique<st::HFWeights>(source);
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (auto& [name, p] : params) wanted.emplace_back(name, mm::nn::full_shape(p));  // a TP slice's whole tensor
  const std::map<std::string, std::string> source_name = match_checkpoint_names(
      wanted, hf ? hf->keys() : ckpt->names("model"),
      [&](const std::string& k) { return hf ? hf->info(k).shape : ckpt->shape("model", k); }, source, ignorable, rename);
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    at::Tensor p = param;  // the same TensorImpl
    const std::string& k = source_name.at(name);
    const at::Tensor value = hf ? hf->get(k) : ckpt->read_full("model", k);
    if (store) store(p, value);
    else p.copy_(value);
  }
}

// metadata.json is read from disk like any stranger's file: every shape, range and box is
// checked before a piece is read, so a reader never narrows past a file's tensor or returns
// elements no piece wrote (found by fuzz_checkpoint_metadata).
void CheckpointReader::check_entry(const std::string& meta, const std::string& kind, const std::string& name,
                                   const Entry& e) {
  auto bad = [&](const std::string& what) {
    throw Error(cat("checkpoint: ", meta, ": ", kind, " tensor '", printable(name), "': ", what));
  };
  auto count = [&](const std::vector<int64_t>& dims, const char* what) {
    int64_t n = 1;
    for (const int64_t d : dims)
      if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t(1) << 56)) bad(cat(what, " is not a valid shape"));
    return n;
  };
  const int64_t numel = count(e.shape, "shape");
  std::vector<std::pair<int64_t, int64_t>> whole_ranges;
  std::vector<const Piece*> boxes;
  for (const Piece& p : e.pieces) {
    if (p.file.empty() || p.file == "." || p.file == ".." || p.file.find('/') != std::string::npos ||
        printable(p.file, p.file.size()) != p.file)
      bad(cat("piece file '", printable(p.file, 40), "' is not a file name in the checkpoint folder"));
    if (p.begin < 0 || p.end < p.begin) bad(cat("piece range [", p.begin, ", ", p.end, ") is not a range"));
    if (p.box.whole()) {
      if (p.end > numel) bad(cat("piece range [", p.begin, ", ", p.end, ") exceeds its ", numel, " elements"));
      whole_ranges.emplace_back(p.begin, p.end);
      continue;
    }
    const size_t r = p.box.view.size();
    if (r == 0 || p.box.offset.size() != r || p.box.sizes.size() != r) bad("piece box has mismatched ranks");
    if (count(p.box.view, "piece view") != numel) bad("piece view does not hold the tensor's elements");
    for (size_t d = 0; d < r; ++d)
      if (p.box.offset[d] < 0 || p.box.sizes[d] < 0 || p.box.offset[d] > p.box.view[d] - p.box.sizes[d])
        bad("piece box lies outside its view");
    if (p.end > count(p.box.sizes, "piece box")) bad(cat("piece range [", p.begin, ", ", p.end, ") exceeds its box"));
    boxes.push_back(&p);
  }
  // Pieces never overlap: whole-tensor ranges are disjoint; two boxed pieces either hold the
  // same box (then their ranges are disjoint) or boxes that do not intersect.
  std::sort(whole_ranges.begin(), whole_ranges.end());
  for (size_t i = 1; i < whole_ranges.size(); ++i)
    if (whole_ranges[i].first < whole_ranges[i - 1].second) bad("two pieces overlap");
  for (size_t i = 0; i < boxes.size(); ++i)
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      const TensorBox &a = boxes[i]->box, &b = boxes[j]->box;
      if (a.view != b.view) continue;  // read_box refuses mixed views with its own message
      if (a.offset == b.offset && a.sizes == b.sizes) {
        if (boxes[i]->begin < boxes[j]->end && boxes[j]->begin < boxes[i]->end) bad("two pieces overlap");
        continue;
      }
      bool intersect = true;
      for (size_t d = 0; d < a.view.size(); ++d)
        intersect = intersect && a.offset[d] < b.offset[d] + b.sizes[d] && b.offset[d] < a.offset[d] + a.sizes[d];
      if (intersect) bad("two pieces' boxes overlap");
    }
}

// Piece p's elements from its file, checked against what metadata.json says it holds.
at::Tensor CheckpointReader::piece_data(const Piece& p, const std::string& kind, const std::string& name,
                                        const Entry& e) const {
  const st::SafetensorsReader& f = file(p.file);
  const at::Tensor t = f.get(name);
  if (t.numel() != p.end - p.begin || t.scalar_type() != e.dtype)
    throw Error(cat("checkpoint: '", dir_, "': ", kind, " tensor '", printable(name), "' in ", p.file, " holds ",
                    t.numel(), " ", c10::toString(t.scalar_type()), " elements; metadata.json says ", p.end - p.begin,
                    " ", c10::toString(e.dtype)));
  return t.reshape({-1});
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
        for (auto& piece : e.at("shards")) {
          Piece p{piece.at("file").get<std::string>(), piece.at("begin").get<int64_t>(), piece.at("end").get<int64_t>(), {}};
          if (piece.contains("view")) {
            p.box.view = piece.at("view").get<std::vector<int64_t>>();
            p.box.offset = piece.at("offset").get<std::vector<int64_t>>();
            p.box.sizes = piece.at("box").get<std::vector<int64_t>>();
          }
          entry.pieces.push_back(std::move(p));
        }
        check_entry(meta_path.string(), kind, key, entry);
        entries_[kind][key] = std::move(entry);
      }
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("checkpoint: ", meta_path.string(), ": ", json_error_text(e.what())));
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

namespace {

int64_t product(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t n = 1;
  for (size_t i = from; i < v.size(); ++i) n *= v[i];
  return n;
}

// The blocks (offset, sizes) of a tensor of `shape` whose row-major flattening, from dimension
// `dim` on at offset `at`, covers [b, e): partial rows recurse one dimension down.
void range_blocks(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t> at, int64_t b, int64_t e,
                  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& out) {
  if (b >= e) return;
  auto block = [&](int64_t row, int64_t rows) {
    std::vector<int64_t> off = at, sizes(shape.size(), 1);
    off[dim] += row;
    sizes[dim] = rows;
    for (size_t d = dim + 1; d < shape.size(); ++d) sizes[d] = shape[d];
    out.emplace_back(std::move(off), std::move(sizes));
  };
  const int64_t inner = product(shape, dim + 1);
  if (dim + 1 == shape.size()) return block(b, e - b);
  int64_t r0 = b / inner;
  const int64_t r1 = e / inner;
  if (b % inner != 0) {
    const int64_t stop = std::min(e, (r0 + 1) * inner);
    std::vector<int64_t> row = at;
    row[dim] += r0;
    range_blocks(shape, dim + 1, row, b - r0 * inner, stop - r0 * inner, out);
    if (stop == e) return;
    ++r0;
  }
  if (r1 > r0) block(r0, r1 - r0);
  if (e > r1 * inner) {
    std::vector<int64_t> row = at;
    row[dim] += r1;
    range_blocks(shape, dim + 1, row, 0, e - r1 * inner, out);
  }
}

bool whole_in(const TensorBox& b, const std::vector<int64_t>& shape) {
  return b.whole() || (b.sizes == b.view && product(b.offset) == 0 && product(b.view) == product(shape));
}

}  // namespace

at::Tensor CheckpointReader::read_box(const std::string& kind, const std::string& name, const TensorBox& box,
                                      int64_t begin, int64_t end) const {
  if (!has(kind, name)) throw Error(cat("checkpoint: '", dir_, "' has no ", kind, " tensor '", name, "'"));
  const Entry& e = entries_.at(kind).at(name);
  const std::vector<int64_t> shape = e.shape.empty() ? std::vector<int64_t>{1} : e.shape;
  bool all_whole = whole_in(box, shape);
  for (const Piece& p : e.pieces) all_whole = all_whole && whole_in(p.box, shape);
  if (all_whole) return read(kind, name, begin, end);
  if (end == begin) return at::empty({0}, e.dtype);
  // The view both sides are expressed in: a whole box fits any view.
  std::vector<int64_t> view = box.whole() ? std::vector<int64_t>{} : box.view;
  for (const Piece& p : e.pieces) {
    if (whole_in(p.box, shape)) continue;
    if (view.empty()) view = p.box.view;
    else if (view != p.box.view)
      throw Error(cat("checkpoint: '", dir_, "': ", kind, " tensor '", name, "' was split as ",
                      c10::IntArrayRef(p.box.view), ", the model splits it as ", c10::IntArrayRef(view)));
  }
  if (view.empty()) view = shape;
  const std::vector<int64_t> want_off = whole_in(box, shape) ? std::vector<int64_t>(view.size(), 0) : box.offset;
  const std::vector<int64_t> want_sizes = whole_in(box, shape) ? view : box.sizes;
  // A whole-box read counts the elements its pieces cover (pieces never overlap); a partial one
  // marks them, to tell which part of the box they fall in.
  const bool whole_read = begin == 0 && end == product(want_sizes);
  int64_t covered_count = 0;
  at::Tensor out, covered = whole_read ? at::Tensor() : at::zeros(want_sizes, at::kBool);
  for (const Piece& p : e.pieces) {
    const bool whole = whole_in(p.box, shape);
    const std::vector<int64_t> p_off = whole ? std::vector<int64_t>(view.size(), 0) : p.box.offset;
    const std::vector<int64_t> p_sizes = whole ? view : p.box.sizes;
    std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> blocks;
    range_blocks(p_sizes, 0, std::vector<int64_t>(view.size(), 0), p.begin, p.end, blocks);
    at::Tensor src;
    int64_t consumed = 0;
    for (const auto& [off, sizes] : blocks) {
      const int64_t n = product(sizes);
      std::vector<int64_t> lo(view.size()), hi(view.size());
      bool empty = false;
      for (size_t d = 0; d < view.size(); ++d) {
        lo[d] = std::max(p_off[d] + off[d], want_off[d]);
        hi[d] = std::min(p_off[d] + off[d] + sizes[d], want_off[d] + want_sizes[d]);
        empty = empty || hi[d] <= lo[d];
      }
      if (!empty) {
        if (!src.defined()) src = piece_data(p, kind, name, e);
        if (!out.defined()) out = at::empty(want_sizes, src.options());
        at::Tensor from = src.narrow(0, consumed, n).view(sizes), to = out, mark = covered;
        int64_t volume = 1;
        for (size_t d = 0; d < view.size(); ++d) {
          const int64_t len = hi[d] - lo[d];
          volume *= len;
          from = from.narrow(static_cast<int64_t>(d), lo[d] - p_off[d] - off[d], len);
          to = to.narrow(static_cast<int64_t>(d), lo[d] - want_off[d], len);
          if (!whole_read) mark = mark.narrow(static_cast<int64_t>(d), lo[d] - want_off[d], len);
        }
        // Copied 64 MiB of the block's rows at a time, each window's mapped pages given back
        // once copied: a reader holds the result, not the result and the pieces' pages too.
        const int64_t row = n / sizes[0], rows = hi[0] - lo[0];
        const int64_t window = std::max<int64_t>(1, (64ll << 20) / std::max<int64_t>(1, row * static_cast<int64_t>(src.element_size())));
        for (int64_t r = 0; r < rows; r += window) {
          const int64_t k = std::min(window, rows - r);
          to.narrow(0, r, k).copy_(from.narrow(0, r, k));
          const at::Tensor done = src.narrow(0, consumed + (lo[0] - p_off[0] - off[0] + r) * row, k * row);
          file(p.file).release(done.data_ptr(), static_cast<size_t>(done.nbytes()));
        }
        if (whole_read) covered_count += volume;
        else mark.fill_(true);
      }
      consumed += n;
    }
  }
  if (!out.defined() || (whole_read ? covered_count != end : !covered.reshape({-1}).narrow(0, begin, end - begin).all().item<bool>()))
    throw Error(cat("checkpoint: '", dir_, "': elements [", begin, ", ", end, ") of a block of ", kind, " tensor '", name,
                    "' are not all in its pieces (a rank's files missing?)"));
  if (whole_read) return out.reshape({-1});
  return out.reshape({-1}).narrow(0, begin, end - begin).clone();
}

at::Tensor CheckpointReader::read(const std::string& kind, const std::string& name, int64_t begin, int64_t end) const {
  if (!has(kind, name)) throw Error(cat("checkpoint: '", dir_, "' has no ", kind, " tensor '", name, "'"));
  const Entry& e = entries_.at(kind).at(name);
  const std::vector<int64_t> shape = e.shape.empty() ? std::vector<int64_t>{1} : e.shape;
  for (const Piece& p : e.pieces)
    if (!whole_in(p.box, shape)) return read_box(kind, name, TensorBox{}, begin, end);  // the whole tensor, in the pieces' view
  at::Tensor out;
  int64_t covered = 0;
  for (const Piece& p : e.pieces) {
    const int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.end);
    if (hi <= lo) continue;
    const st::SafetensorsReader& f = file(p.file);
    at::Tensor src = piece_data(p, kind, name, e);
    if (!out.defined()) out = at::empty({end - begin}, src.options());
    // 64 MiB windows, each one's mapped pages given back once copied: reading a tensor holds
    // the result, not the result and the file's pages too.
    const int64_t window = std::max<int64_t>(1, (64ll << 20) / static_cast<int64_t>(src.element_size()));
    for (int64_t pos = lo; pos < hi; pos += window) {
      const int64_t n = std::min(window, hi - pos);
      const at::Tensor part = src.narrow(0, pos - p.begin, n);
      out.narrow(0, pos - begin, n).copy_(part);
      f.release(part.data_ptr(), static_cast<size_t>(part.nbytes()));
    }
    covered += hi - lo;
  }
  if (end == begin) return at::empty({0}, e.dtype);
  if (covered != end - begin)
    throw Error(cat("checkpoint: '", dir_, "': elements [", begin, ", ", end, ") of ", kind, " tensor '", name,
                    "' are not all in its pieces (a rank's files missing?)"));
  return out;
}

void CheckpointReader::release(const std::string& kind, const std::string& name) const {
  if (!has(kind, name)) return;
  for (const Piece& p : entries_.at(kind).at(name).pieces) {
    const st::SafetensorsReader& f = file(p.file);
    if (!f.has(name)) continue;
    const at::Tensor t = f.get(name);
    f.release(t.data_ptr(), t.nbytes());
  }
}

nlohmann::json CheckpointReader::pieces(const std::string& kind, const std::string& name) const {
  shape(kind, name);  // the error for a missing tensor
  nlohmann::json out = nlohmann::json::array();
  for (const Piece& p : entries_.at(kind).at(name).pieces) {
    nlohmann::json j = {{"file", p.file}, {"begin", p.begin}, {"end", p.end}};
    if (!p.box.whole()) {
      j["view"] = p.box.view;
      j["offset"] = p.box.offset;
      j["box"] = p.box.sizes;
    }
    out.push_back(std::move(j));
  }
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
    throw Error(cat("checkpoint: ", dir_, "/train_state.json: ", json_error_text(e.what())));
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
  st::save_hf_weights(dir, detached(model.named_parameters()), max_shard_bytes, st::weights_stem(hf_config));  // streamed to the host
  st::write_file_atomic((fs::path(dir) / "config.json").string(), hf_config.dump(2) + "\n");
}

void export_hf_streaming(const std::string& dir, const nlohmann::json& hf_config, const std::vector<st::TensorSpec>& specs,
                         const st::TensorFetch& fetch, uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(cat("export: cannot create '", dir, "': ", ec.message()));
  st::save_hf_weights(dir, specs, fetch, max_shard_bytes, st::weights_stem(hf_config));
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
