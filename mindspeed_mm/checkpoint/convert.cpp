#include "mindspeed_mm/checkpoint/convert.h"

#include <sys/resource.h>
#include <csignal>
#include <cstdlib>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/core/param_init.h"
#include "mindspeed_mm/models/model_registry.h"
#include "mindspeed_mm/training/pipeline.h"
#include "mindspeed_mm/training/lora.h"
#include "mindspeed_mm/training/tensor_parallel_plan.h"

namespace fs = std::filesystem;

namespace mm::checkpoint {

std::string ConvertLayout::describe() const {
  return cat("tp ", tp, " x pp ", pp, vp > 1 ? cat(" (", vp, " virtual chunks)") : std::string(), " x dp ", dp, " (",
             world(), world() == 1 ? " rank)" : " ranks)");
}

StagedOutput::StagedOutput(const std::string& out) : out_(out), tmp_(out + ".partial") {
  std::error_code ec;
  if (fs::exists(out_) && !(fs::is_directory(out_) && fs::is_empty(out_, ec)))
    throw Error(cat("convert: --out '", out_, "' exists and is not empty (nothing was written): remove it or choose another"));
  fs::remove_all(tmp_, ec);
  fs::create_directories(tmp_, ec);
  if (ec) throw Error(cat("convert: cannot create '", tmp_, "': ", ec.message()));
}

StagedOutput::~StagedOutput() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void StagedOutput::commit() {
  std::error_code ec;
  if (fs::exists(out_)) fs::remove(out_, ec);  // an empty directory
  fs::rename(tmp_, out_, ec);
  if (ec) throw Error(cat("convert: cannot rename '", tmp_, "' to '", out_, "': ", ec.message()));
  committed_ = true;
}

int64_t peak_rss_bytes() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

std::string model_type_of(const nlohmann::json& hf, const std::string& source) {
  if (hf.contains("model_type") && hf.at("model_type").is_string()) return hf.at("model_type").get<std::string>();
  static const std::map<std::string, std::string> kDiffusers = {{"WanTransformer3DModel", "wan_dit"},
                                                                {"AutoencoderKLWan", "wan_vae"}};
  if (hf.contains("_class_name") && hf.at("_class_name").is_string()) {
    auto it = kDiffusers.find(hf.at("_class_name").get<std::string>());
    if (it != kDiffusers.end()) return it->second;
  }
  throw Error(cat("convert: ", source, " names no model_type (or a diffusers _class_name mm knows): pass --model-type"));
}

namespace {

constexpr int64_t kWindowBytes = 64ll << 20;  // the input's mapped pages held at once

int64_t product(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t n = 1;
  for (size_t i = from; i < v.size(); ++i) n *= v[i];
  return n;
}

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32") return at::kFloat;
  if (s == "bf16") return at::kBFloat16;
  if (s == "fp16") return at::kHalf;
  throw ConfigError(cat("convert: --dtype '", s, "': expected keep, fp32, bf16 or fp16"));
}

// The dtype a tensor is written in: floating-point tensors take --dtype, others keep theirs.
at::ScalarType out_dtype(at::ScalarType stored, const ConvertOptions& o) {
  if (o.dtype == "keep" || !at::isFloatingType(stored)) return stored;
  return parse_dtype(o.dtype);
}

// Elements [begin, end) of `box` (flattened) of `full`, a contiguous tensor that may view a
// file's mapping, a window of whole rows (of the box's view) at a time: each window's part goes
// to emit (contiguous, in order), then the window's pages are given back through `release`.
void for_each_window(const at::Tensor& full, const TensorBox& box, int64_t begin, int64_t end,
                     const std::function<void(const at::Tensor&)>& emit,
                     const std::function<void(const void*, size_t)>& release) {
  if (end <= begin) return;
  const int64_t n = full.numel();
  const std::vector<int64_t> view = box.whole() ? std::vector<int64_t>{n} : box.view;
  const std::vector<int64_t> off = box.whole() ? std::vector<int64_t>{0} : box.offset;
  const std::vector<int64_t> sizes = box.whole() ? std::vector<int64_t>{n} : box.sizes;
  const at::Tensor v = full.view(view);
  const int64_t box_row = product(sizes, 1);              // elements of the box per row of dim 0
  const int64_t src_row_bytes = product(view, 1) * static_cast<int64_t>(full.element_size());
  const int64_t rows_per_window = std::max<int64_t>(1, kWindowBytes / std::max<int64_t>(1, src_row_bytes));
  const int64_t r0 = begin / box_row, r1 = (end + box_row - 1) / box_row;
  for (int64_t r = r0; r < r1; r += rows_per_window) {
    const int64_t k = std::min(rows_per_window, r1 - r);
    const at::Tensor rows = v.narrow(0, off[0] + r, k);
    at::Tensor blk = rows;
    for (size_t d = 1; d < view.size(); ++d) blk = blk.narrow(static_cast<int64_t>(d), off[d], sizes[d]);
    const int64_t lo = std::max(begin, r * box_row), hi = std::min(end, (r + k) * box_row);
    emit(blk.reshape({-1}).narrow(0, lo - r * box_row, hi - lo));
    if (release) release(rows.data_ptr(), static_cast<size_t>(k * src_row_bytes));
  }
}

// The same pushed to a byte sink in `dtype` (what a streamed writer takes).
void stream_block(const at::Tensor& full, const TensorBox& box, int64_t begin, int64_t end, at::ScalarType dtype,
                  const std::function<void(const void*, size_t)>& sink,
                  const std::function<void(const void*, size_t)>& release) {
  for_each_window(full, box, begin, end, [&](const at::Tensor& part) {
    const at::Tensor c = part.to(dtype).contiguous();
    if (c.nbytes() > 0) sink(c.data_ptr(), c.nbytes());
  }, release);
}

// A progress bar on stderr: redrawn in place on a terminal, a line per 10% otherwise.
class ProgressBar {
 public:
  ProgressBar(std::string what, int64_t total, bool enabled)
      : what_(std::move(what)), total_(std::max<int64_t>(1, total)), enabled_(enabled), tty_(::isatty(2) != 0),
        start_(std::chrono::steady_clock::now()) {}
  void add(int64_t bytes) {
    done_ += bytes;
    if (!enabled_) return;
    const int pct = static_cast<int>(100.0 * static_cast<double>(done_) / static_cast<double>(total_));
    if (tty_) {
      const int bar = pct * 30 / 100;
      std::fprintf(stderr, "\r%s [%s%s] %3d%% %.2f/%.2f GB %.0f s", what_.c_str(), std::string(bar, '#').c_str(),
                   std::string(30 - bar, '.').c_str(), pct, gb(done_), gb(total_), seconds());
      std::fflush(stderr);
    } else if ((pct / 10 > shown_ / 10 && seconds() - last_ >= 5) || (done_ >= total_ && shown_ >= 0)) {
      // Not a terminal (a log): a line per 10% at most every 5 s, and the last one.
      shown_ = pct;
      last_ = seconds();
      std::fprintf(stderr, "%s: %d%% (%.2f/%.2f GB, %.0f s)\n", what_.c_str(), pct, gb(done_), gb(total_), last_);
    }
  }
  void finish() {
    if (enabled_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  static double gb(int64_t b) { return static_cast<double>(b) / 1e9; }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  std::string what_;
  int64_t total_, done_ = 0;
  bool enabled_, tty_;
  int shown_ = -1;
  double last_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// Files of an HF directory that are neither weights nor config.json nor a checkpoint's own: the
// tokenizer, processor, chat template and generation config, which travel with the weights.
bool travels(const std::string& name) {
  static const std::set<std::string> kOwn = {"config.json", "metadata.json", "train_state.json", "latest",
                                             "rng.safetensors", "model.safetensors", "optimizer.safetensors"};
  if (kOwn.count(name) || name.empty() || name[0] == '.') return false;
  for (const char* ext : {".safetensors", ".bin", ".pth", ".pt", ".ckpt", ".index.json", ".partial", ".tmp"})
    if (ends_with(name, ext)) return false;
  if (name.rfind("loader.rank", 0) == 0) return false;
  return true;
}

int copy_travelling_files(const std::string& from, const std::string& to) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(from, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || !travels(name) || fs::exists(fs::path(to) / name)) continue;
    fs::copy_file(e.path(), fs::path(to) / name, ec);
    if (ec) throw Error(cat("convert: cannot copy '", e.path().string(), "': ", ec.message()));
    ++n;
  }
  return n;
}

void write_text(const std::string& path, const std::string& text) { st::write_file_atomic(path, text); }

std::shared_ptr<models::Model> build_deferred(const std::string& model_type, const nlohmann::json& hf,
                                              const std::string& source) {
  mm::nn::DeferredInitGuard deferred;
  return models::model_registry().get(model_type, "--model-type")(hf, source, false);
}

// Where every tensor goes in a layout: each rank's pieces, as training writes them
// (DataParallelModel::checkpoint_part): a tensor-parallel slice on its TP rank (a whole tensor
// on TP rank 0), on the first pipeline stage that holds it, its flattened slice cut into equal
// data-parallel ranges (FSDP's shards).
struct Piece {
  std::string kind, name;  // "model" / "optimizer"
  std::vector<int64_t> shape;
  TensorBox box;
  int64_t begin = 0, end = 0;
};

class LayoutPlan {
 public:
  LayoutPlan(models::Model& model, const ConvertLayout& layout) : layout_(layout) {
    if (layout.tp < 1 || layout.pp < 1 || layout.dp < 1 || layout.vp < 1)
      throw ConfigError(cat("convert: layout sizes must be >= 1 (", layout.describe(), ")"));
    if (layout.vp > 1 && layout.pp == 1)
      throw ConfigError("convert: --vpp > 1 needs --pp > 1");
    const models::PlanTable plans = model.plans();
    if (layout.tp > 1) {
      if (plans.tensor_parallel.empty())
        throw ConfigError(cat("convert: --tp ", layout.tp, ": model ", model.type_name(), " has no tensor-parallel plan"));
      training::check_tensor_parallel_plan(model, plans.tensor_parallel, layout.tp);
      tp_ = training::tensor_parallel_splits(model, plans.tensor_parallel, layout.tp);
    }
    if (layout.pp > 1)
      pipeline_ = std::make_unique<training::PipelineLayout>(
          training::make_pipeline_layout(model, layout.pipeline_num_layers, layout.pp, layout.vp));
    for (auto& [name, p] : model.named_parameters()) params_.emplace_back(name, mm::nn::full_shape(p));
  }

  const std::vector<std::pair<std::string, std::vector<int64_t>>>& params() const { return params_; }
  bool has_param(const std::string& name) const {
    for (const auto& [n, _] : params_)
      if (n == name) return true;
    return false;
  }
  const training::PipelineLayout* pipeline() const { return pipeline_.get(); }

  // rank = (stage * dp + d) * tp + t, the device mesh's order (pp outermost, tp innermost).
  int rank_of(int stage, int d, int t) const { return (stage * layout_.dp + d) * layout_.tp + t; }
  nlohmann::json placement(int rank) const {
    const int t = rank % layout_.tp, d = rank / layout_.tp % layout_.dp, s = rank / (layout_.tp * layout_.dp);
    return {{"pp", s}, {"dp", d}, {"cp", 0}, {"tp", t}};
  }
  nlohmann::json mesh() const {
    return {{"pp", layout_.pp}, {"dp_replicate", 1}, {"dp_shard", layout_.dp}, {"cp", 1}, {"tp", layout_.tp}};
  }

  // Rank `rank`'s pieces of parameter `param` stored as (kind, name), in the parameter's order.
  void add_pieces(int rank, const std::string& kind, const std::string& name, const std::string& param,
                  const std::vector<int64_t>& shape, std::vector<Piece>& out) const {
    const int t = rank % layout_.tp, d = rank / layout_.tp % layout_.dp, s = rank / (layout_.tp * layout_.dp);
    if (pipeline_ && !(pipeline_->held_by(param, s) && pipeline_->first_holder(param, s))) return;
    const bool split = tp_.split(param);
    if (!split && t != 0) return;
    Piece p{kind, name, shape, {}, 0, 0};
    int64_t local = product(shape);
    if (split) {
      training::TpLayout mine = tp_;
      mine.rank = t;
      p.box = mine.box(param);
      local = product(p.box.sizes);
    }
    const int64_t chunk = (local + layout_.dp - 1) / layout_.dp;
    p.begin = std::min(local, d * chunk);
    p.end = std::min(local, (d + 1) * chunk);
    if (p.end > p.begin) out.push_back(std::move(p));
  }

 private:
  ConvertLayout layout_;
  training::TpLayout tp_;
  std::unique_ptr<training::PipelineLayout> pipeline_;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params_;
};

// Reads a piece (kind, name, box, [begin, end)) of the input in `dtype`; done(kind, name) after
// each rank file's use of a tensor gives its pages back.
struct PieceSource {
  std::function<at::Tensor(const Piece&, at::ScalarType)> read;
  // When set, used instead of read: the piece's bytes pushed to a sink, a window at a time.
  std::function<void(const Piece&, at::ScalarType, const std::function<void(const void*, size_t)>&)> stream;
  std::function<at::ScalarType(const std::string& kind, const std::string& name)> dtype;
};

// Writes every rank's files (model, and optimizer when `with_optimizer`) and metadata.json into
// dir. Returns tensors and bytes written.
ConvertSummary write_layout(const std::string& dir, const LayoutPlan& plan, const ConvertLayout& layout,
                            const std::vector<std::vector<Piece>>& model_pieces,
                            const std::vector<std::vector<Piece>>& optimizer_pieces, const PieceSource& source,
                            const ConvertOptions& options, const std::string& what) {
  ConvertSummary summary;
  int64_t total = 0;
  auto piece_bytes = [&](const Piece& p) {
    return (p.end - p.begin) * static_cast<int64_t>(c10::elementSize(out_dtype(source.dtype(p.kind, p.name), options)));
  };
  for (const auto* all : {&model_pieces, &optimizer_pieces})
    for (const auto& rank : *all)
      for (const Piece& p : rank) total += piece_bytes(p);
  ProgressBar bar(what, total, options.progress);
  // MM_DEBUG_KILL_IN_CONVERT=N: the process kills itself (SIGKILL) after N pieces (the
  // interrupted-conversion test).
  const char* kill_env = std::getenv("MM_DEBUG_KILL_IN_CONVERT");
  const int64_t kill_after = kill_env ? std::atoll(kill_env) : -1;
  nlohmann::json meta = {{"format", "mm-sharded-v1"}, {"world", layout.world()}, {"mesh", plan.mesh()},
                         {"tensors", {{"model", nlohmann::json::object()}, {"optimizer", nlohmann::json::object()}}}};
  for (int rank = 0; rank < layout.world(); ++rank) {
    for (const char* kind : {"model", "optimizer"}) {
      const std::vector<Piece>& pieces = std::string(kind) == "model" ? model_pieces[rank] : optimizer_pieces[rank];
      const std::string file = rank_file_name(kind, rank, "safetensors");
      std::vector<st::TensorSpec> specs;
      nlohmann::json placement = nlohmann::json::object();
      std::map<std::string, const Piece*> by_name;
      for (const Piece& p : pieces) {
        const at::ScalarType dt = out_dtype(source.dtype(p.kind, p.name), options);
        specs.push_back({p.name, dt, {p.end - p.begin}});
        by_name[p.name] = &p;
        nlohmann::json where = {{"shape", p.shape}, {"begin", p.begin}, {"end", p.end}};
        nlohmann::json shard = {{"file", file}, {"begin", p.begin}, {"end", p.end}};
        if (!p.box.whole())
          for (auto* j : {&where, &shard}) {
            (*j)["view"] = p.box.view;
            (*j)["offset"] = p.box.offset;
            (*j)["box"] = p.box.sizes;
          }
        placement[p.name] = where;
        shard["placement"] = plan.placement(rank);
        nlohmann::json& e = meta["tensors"][kind][p.name];
        e["shape"] = p.shape;
        e["dtype"] = st::dtype_to_safetensors(dt);
        e["shards"].push_back(std::move(shard));
      }
      const std::map<std::string, std::string> file_meta = {{"mm_placement", placement.dump()},
                                                             {"mm_rank_placement", plan.placement(rank).dump()},
                                                             {"mm_mesh", plan.mesh().dump()}};
      st::save_safetensors_streamed((fs::path(dir) / file).string(), specs,
                                    [&](const std::string& name, const std::function<void(const void*, size_t)>& sink) {
                                      const Piece& p = *by_name.at(name);
                                      if (summary.tensors == kill_after) std::raise(SIGKILL);
                                      const at::ScalarType dt = out_dtype(source.dtype(p.kind, p.name), options);
                                      if (source.stream) {
                                        source.stream(p, dt, sink);
                                      } else {
                                        const at::Tensor t = source.read(p, dt).contiguous();
                                        if (t.nbytes() > 0) sink(t.data_ptr(), t.nbytes());
                                      }
                                      bar.add(piece_bytes(p));
                                      summary.bytes += piece_bytes(p);
                                      ++summary.tensors;
                                    },
                                    file_meta);
      ++summary.files;
    }
  }
  bar.finish();
  write_text((fs::path(dir) / "metadata.json").string(), meta.dump(1) + "\n");
  return summary;
}

std::vector<std::vector<Piece>> model_pieces_of(const LayoutPlan& plan, const ConvertLayout& layout) {
  std::vector<std::vector<Piece>> out(static_cast<size_t>(layout.world()));
  for (int r = 0; r < layout.world(); ++r)
    for (const auto& [name, shape] : plan.params()) plan.add_pieces(r, "model", name, name, shape, out[r]);
  return out;
}

std::string resolve_checkpoint_dir(const std::string& in) {
  if (!fs::is_directory(in)) throw Error(cat("convert: --in '", in, "' is not a directory"));
  if (fs::exists(fs::path(in) / "config.json")) return in;
  const std::string latest = resolve_resume_dir("auto", in);
  if (latest.empty()) throw Error(cat("convert: --in '", in, "' holds neither a checkpoint (config.json) nor a save dir's latest"));
  return latest;
}

// The model the checkpoint at dir holds (from its config.json), checked against its tensors.
std::shared_ptr<models::Model> checkpoint_model(const CheckpointReader& reader) {
  const nlohmann::json hf = read_hf_config(reader.dir());
  const std::string source = (fs::path(reader.dir()) / "config.json").string();
  auto model = build_deferred(model_type_of(hf, source), hf, source);
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (auto& [name, p] : model->named_parameters()) wanted.emplace_back(name, mm::nn::full_shape(p));
  match_checkpoint_names(wanted, reader.names("model"),
                         [&](const std::string& k) { return reader.shape("model", k); }, reader.dir(),
                         model->optional_checkpoint_tensors());
  return model;
}

}  // namespace

ConvertSummary convert_hf_to_mm(const std::string& model_type, const std::string& hf_dir, const std::string& out,
                                const ConvertLayout& layout, const ConvertOptions& options) {
  if (!fs::is_directory(hf_dir)) throw Error(cat("convert: --in '", hf_dir, "' is not a directory"));
  if (options.dtype != "keep") parse_dtype(options.dtype);
  const nlohmann::json hf = read_hf_config(hf_dir);
  const std::string source = (fs::path(hf_dir) / "config.json").string();
  const std::string id = model_type.empty() ? model_type_of(hf, source) : model_type;
  auto model = build_deferred(id, hf, source);
  const LayoutPlan plan(*model, layout);
  st::HFWeights weights(hf_dir);
  const std::map<std::string, std::string> hf_name = match_checkpoint_names(
      plan.params(), weights.keys(), [&](const std::string& k) { return weights.info(k).shape; }, hf_dir,
      model->optional_checkpoint_tensors(), [&](const std::string& k) { return model->parameter_name(k); });

  StagedOutput staged(out);
  PieceSource src;
  src.dtype = [&](const std::string&, const std::string& name) { return weights.info(hf_name.at(name)).dtype; };
  src.stream = [&](const Piece& p, at::ScalarType dt, const std::function<void(const void*, size_t)>& sink) {
    const std::string& k = hf_name.at(p.name);
    stream_block(weights.get(k), p.box, p.begin, p.end, dt, sink,
                 [&](const void* ptr, size_t bytes) { weights.release(k, ptr, bytes); });
  };
  const std::vector<std::vector<Piece>> none(static_cast<size_t>(layout.world()));
  ConvertSummary s = write_layout(staged.dir(), plan, layout, model_pieces_of(plan, layout), none, src, options,
                                  "hf-to-mm");
  write_text((fs::path(staged.dir()) / "config.json").string(), hf.dump(2) + "\n");
  copy_travelling_files(hf_dir, staged.dir());
  staged.commit();
  return s;
}

ConvertSummary convert_mm_to_hf(const std::string& in, const std::string& out, const ConvertOptions& options) {
  if (options.dtype != "keep") parse_dtype(options.dtype);
  const std::string dir = resolve_checkpoint_dir(in);
  CheckpointReader reader(dir);
  auto model = checkpoint_model(reader);
  std::vector<st::TensorSpec> specs;
  int64_t total = 0;
  for (auto& [name, p] : model->named_parameters()) {
    const at::ScalarType dt = out_dtype(reader.dtype("model", name), options);
    specs.push_back({name, dt, reader.shape("model", name)});
    total += product(specs.back().shape) * static_cast<int64_t>(c10::elementSize(dt));
  }
  StagedOutput staged(out);
  ProgressBar bar("mm-to-hf", total, options.progress);
  ConvertSummary s;
  const nlohmann::json hf = read_hf_config(dir);
  st::save_hf_weights(staged.dir(), specs,
                      [&](const std::string& name) {
                        at::Tensor t = reader.read_full("model", name);  // a copy: the pieces' pages go back now
                        reader.release("model", name);
                        const at::ScalarType dt = out_dtype(t.scalar_type(), options);
                        if (dt != t.scalar_type()) t = t.to(dt);
                        bar.add(static_cast<int64_t>(t.nbytes()));
                        s.bytes += static_cast<int64_t>(t.nbytes());
                        ++s.tensors;
                        return t;
                      },
                      options.max_shard_bytes, st::weights_stem(hf));
  bar.finish();
  for (const auto& e : fs::directory_iterator(staged.dir()))
    if (ends_with(e.path().filename().string(), ".safetensors")) ++s.files;
  write_text((fs::path(staged.dir()) / "config.json").string(), hf.dump(2) + "\n");
  copy_travelling_files(dir, staged.dir());
  if (!options.copy_from.empty()) {
    if (!fs::is_directory(options.copy_from))
      throw Error(cat("convert: --copy-from '", options.copy_from, "' is not a directory"));
    copy_travelling_files(options.copy_from, staged.dir());
  }
  staged.commit();
  return s;
}

ConvertSummary resplit_checkpoint(const std::string& in, const std::string& out, const ConvertLayout& layout,
                                  const ConvertOptions& options) {
  if (options.dtype != "keep") parse_dtype(options.dtype);
  const std::string dir = resolve_checkpoint_dir(in);
  CheckpointReader reader(dir);
  auto model = checkpoint_model(reader);
  const LayoutPlan plan(*model, layout);
  // Optimizer state follows its parameter ("exp_avg.<param>"); scalars ("step") go to rank 0 whole.
  std::vector<std::vector<Piece>> opt(static_cast<size_t>(layout.world()));
  for (const auto& name : reader.names("optimizer")) {
    const std::vector<int64_t> shape = reader.shape("optimizer", name);
    if (shape.empty()) {
      opt[0].push_back({"optimizer", name, shape, {}, 0, 1});
      continue;
    }
    const auto dot = name.find('.');
    const std::string param = dot == std::string::npos ? "" : name.substr(dot + 1);
    if (!plan.has_param(param))
      throw Error(cat("convert: '", dir, "': optimizer state '", name, "' names no parameter of the model"));
    for (int r = 0; r < layout.world(); ++r) plan.add_pieces(r, "optimizer", name, param, shape, opt[r]);
  }
  StagedOutput staged(out);
  PieceSource src;
  src.dtype = [&](const std::string& kind, const std::string& name) { return reader.dtype(kind, name); };
  src.read = [&](const Piece& p, at::ScalarType dt) {
    at::Tensor t = reader.read_box(p.kind, p.name, p.box, p.begin, p.end);  // a copy
    reader.release(p.kind, p.name);
    return t.scalar_type() == dt ? t : t.to(dt);
  };
  ConvertSummary s = write_layout(staged.dir(), plan, layout, model_pieces_of(plan, layout), opt, src, options, "resplit");
  // What resumes a run besides the tensors: copied as they are (a loader position per old
  // data-parallel rank; a run with another data-parallel size reshards from the sampler's state).
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file()) continue;
    if (name == "config.json" || name == "train_state.json" || name == "rng.safetensors" ||
        (name.rfind("loader.rank", 0) == 0 && ends_with(name, ".json")))
      fs::copy_file(e.path(), fs::path(staged.dir()) / name);
  }
  copy_travelling_files(dir, staged.dir());
  staged.commit();
  return s;
}

ConvertSummary merge_lora(const std::string& base, const std::string& adapter, const std::string& out,
                          const ConvertOptions& options) {
  if (options.dtype != "keep") parse_dtype(options.dtype);
  if (!fs::is_directory(base)) throw Error(cat("convert: --base '", base, "' is not a directory"));
  const nlohmann::json hf = read_hf_config(base);
  const std::string source = (fs::path(base) / "config.json").string();
  auto model = build_deferred(model_type_of(hf, source), hf, source);
  const config::LoraConfig lc = training::read_peft_adapter_config(adapter);
  const double scaling = lc.alpha / static_cast<double>(lc.rank);
  const std::string file = (fs::path(adapter) / "adapter_model.safetensors").string();
  if (!fs::exists(file)) throw Error(cat("convert: no adapter_model.safetensors in '", adapter, "'"));
  st::SafetensorsReader lora(file);
  std::map<std::string, std::string> adapter_key;  // our parameter name -> the adapter's key
  for (const auto& k : lora.keys()) adapter_key[training::parameter_of_peft_key(*model, k)] = k;
  st::HFWeights weights(base);
  std::set<std::string> used;
  std::vector<st::TensorSpec> specs;
  std::map<std::string, std::string> ours;  // base key -> our name
  int64_t total = 0;
  for (const auto& k : weights.keys()) {
    const st::TensorInfo info = weights.info(k);
    specs.push_back({k, out_dtype(info.dtype, options), info.shape});
    ours[k] = model->parameter_name(k);
    total += product(info.shape) * static_cast<int64_t>(c10::elementSize(specs.back().dtype));
  }
  for (const auto& [name, key] : adapter_key) {
    const bool adapts = training::LoraLayout::is_adapter(name);
    const std::string weight = adapts ? name.substr(0, name.size() - 14) + ".weight" : name;
    bool found = false;
    for (const auto& [k, n] : ours) found = found || n == weight;
    if (!found)
      throw Error(cat("convert: adapter tensor '", key, "' (", name, ") has no weight '", weight, "' in the base '", base, "'"));
  }
  StagedOutput staged(out);
  ProgressBar bar("merge-lora", total, options.progress);
  ConvertSummary s;
  st::save_hf_weights(staged.dir(), specs,
                      [&](const std::string& k) {
                        const std::string& name = ours.at(k);
                        at::Tensor w = weights.get(k);
                        const std::string module = name.size() > 7 ? name.substr(0, name.size() - 7) : name;
                        if (adapter_key.count(name)) {
                          w = lora.get_copy(adapter_key.at(name));  // modules_to_save: trained whole
                        } else if (adapter_key.count(module + ".lora_A.weight") && adapter_key.count(module + ".lora_B.weight")) {
                          const at::Tensor a = lora.get(adapter_key.at(module + ".lora_A.weight"));
                          const at::Tensor b = lora.get(adapter_key.at(module + ".lora_B.weight"));
                          // peft's get_delta_weight: (B @ A) * scaling in the adapter's dtype, cast to W's.
                          w = w + (at::matmul(b, a) * scaling).to(w.scalar_type());
                          used.insert(module);
                        }
                        const at::ScalarType dt = out_dtype(w.scalar_type(), options);
                        if (dt != w.scalar_type()) w = w.to(dt);
                        bar.add(static_cast<int64_t>(w.nbytes()));
                        s.bytes += static_cast<int64_t>(w.nbytes());
                        ++s.tensors;
                        return w;
                      },
                      options.max_shard_bytes, st::weights_stem(hf));
  bar.finish();
  ++s.files;
  write_text((fs::path(staged.dir()) / "config.json").string(), hf.dump(2) + "\n");
  copy_travelling_files(base, staged.dir());
  staged.commit();
  return s;
}

}  // namespace mm::checkpoint
