#include "mindspeed_mm/data/features.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "mindspeed_mm/checkpoint/hf_weights.h"
#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/data/sampler.h"
#include "mindspeed_mm/core/strings.h"

namespace fs = std::filesystem;

namespace mm::data {

namespace {

constexpr const char* kIndexName = "features.safetensors.index.json";

std::string shard_name(size_t k) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "features-%05zu.safetensors", k + 1);
  return buf;
}

uint64_t bytes_of(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

}  // namespace

FeatureWriter::FeatureWriter(std::string dir, uint64_t max_shard_bytes) : dir_(std::move(dir)), max_bytes_(max_shard_bytes) {
  std::error_code ec;
  if (fs::exists(fs::path(dir_) / kIndexName, ec))
    throw Error(cat("features: ", dir_, " already holds features (", kIndexName, "); write to a new directory"));
  fs::create_directories(dir_, ec);
  if (ec) throw Error(cat("features: cannot create ", dir_, ": ", ec.message()));
}

void FeatureWriter::add(const FeatureSample& s) {
  MM_CHECK(s.latents.defined() && s.latents.dim() == 4, "features: sample ", next_, " latents must be [C, F, H, W], got ",
           s.latents.defined() ? s.latents.sizes() : at::IntArrayRef{});
  MM_CHECK(s.prompt_embeds.defined() && s.prompt_embeds.dim() == 2, "features: sample ", next_,
           " prompt_embeds must be [L, D]");
  const std::string i = std::to_string(next_++);
  pending_.emplace_back("latents." + i, s.latents.contiguous().cpu());
  pending_.emplace_back("prompt_embeds." + i, s.prompt_embeds.contiguous().cpu());
  pending_bytes_ += bytes_of(s.latents) + bytes_of(s.prompt_embeds);
  captions_.push_back(s.caption);
  if (pending_bytes_ >= max_bytes_) flush();
}

void FeatureWriter::flush() {
  if (pending_.empty()) return;
  const std::string name = shard_name(shard_files_.size());
  st::save_safetensors((fs::path(dir_) / name).string(), pending_, {{"format", "pt"}});
  std::vector<std::string> keys;
  for (auto& [k, _] : pending_) keys.push_back(k);
  shard_files_.push_back(name);
  shard_keys_.push_back(std::move(keys));
  pending_.clear();
  pending_bytes_ = 0;
}

void FeatureWriter::finish(const at::Tensor& null_prompt_embeds) {
  if (null_prompt_embeds.defined()) {
    MM_CHECK(null_prompt_embeds.dim() == 2, "features: null_prompt_embeds must be [L, D]");
    pending_.emplace_back(std::string(kNullPromptEmbeds), null_prompt_embeds.contiguous().cpu());
  }
  flush();
  nlohmann::ordered_json index;
  index["metadata"] = {{"format", "mm-features"}, {"samples", next_}};
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shard_files_.size(); ++k)
    for (const auto& key : shard_keys_[k]) map[key] = shard_files_[k];
  index["weight_map"] = map;
  index["captions"] = captions_;
  st::write_file_atomic((fs::path(dir_) / kIndexName).string(), index.dump(1));
}

void write_features(const std::string& dir, const std::vector<FeatureSample>& samples, const at::Tensor& null_prompt_embeds,
                    uint64_t max_shard_bytes) {
  FeatureWriter w(dir, max_shard_bytes);
  for (const auto& s : samples) w.add(s);
  w.finish(null_prompt_embeds);
}

namespace {

// The opened directory: lazily mapped shards, each sample's latent shape from the headers.
struct FeatureSet {
  std::string dir;
  std::unique_ptr<st::HFWeights> weights;
  int64_t samples = 0;
  std::vector<std::vector<int64_t>> shapes;  // latents' shape per sample
  at::Tensor null_prompt_embeds;

  explicit FeatureSet(const std::string& d) : dir(d) {
    const std::string index_path = (fs::path(d) / kIndexName).string();
    std::ifstream in(index_path);
    if (!in) throw Error(cat("data: ", d, " is not a features directory (no ", kIndexName, "; mm data extract-features writes one)"));
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat("data: ", index_path, ": not valid JSON (", json_error_text(e.what()), ")"));
    }
    if (!index.contains("metadata") || index["metadata"].value("format", "") != "mm-features" ||
        !index["metadata"].contains("samples") || !index["metadata"]["samples"].is_number_integer())
      throw Error(cat("data: ", index_path, ": metadata must hold format \"mm-features\" and an integer sample count"));
    samples = index["metadata"]["samples"].get<int64_t>();
    weights = std::make_unique<st::HFWeights>(index_path);
    for (int64_t i = 0; i < samples; ++i) {
      const std::string n = std::to_string(i);
      for (const char* f : {"latents.", "prompt_embeds."})
        if (!weights->has(f + n)) throw Error(cat("data: ", index_path, ": sample ", i, " has no tensor ", f, n));
      const st::TensorInfo li = weights->info("latents." + n), pi = weights->info("prompt_embeds." + n);
      if (li.shape.size() != 4 || pi.shape.size() != 2)
        throw Error(cat("data: ", index_path, ": sample ", i, " latents must be [C, F, H, W] and prompt_embeds [L, D]"));
      shapes.push_back(li.shape);
      if (i > 0 && (li.shape[0] != shapes[0][0] || pi.shape[1] != weights->info("prompt_embeds.0").shape[1]))
        throw Error(cat("data: ", index_path, ": sample ", i, " has ", li.shape[0], " latent channels and text width ",
                        pi.shape[1], ", sample 0 other ones"));
    }
    if (weights->has(std::string(kNullPromptEmbeds))) null_prompt_embeds = weights->get(std::string(kNullPromptEmbeds));
  }

  Batch batch(const std::vector<int64_t>& idx) const {
    std::vector<at::Tensor> lat, text;
    int64_t longest = 0;
    for (int64_t i : idx) {
      const std::string n = std::to_string(i);
      lat.push_back(weights->get("latents." + n));
      text.push_back(weights->get("prompt_embeds." + n));
      longest = std::max(longest, text.back().size(0));
    }
    for (auto& t : text)
      if (t.size(0) < longest) t = at::constant_pad_nd(t, {0, 0, 0, longest - t.size(0)});
    Batch b;
    b.num_samples = static_cast<int64_t>(idx.size());
    b.set(kLatents, at::stack(lat));
    b.set(kPromptEmbeds, at::stack(text));
    b.set(kSampleIds, at::tensor(idx, at::kLong), /*host=*/true);
    if (null_prompt_embeds.defined()) {
      at::Tensor null = null_prompt_embeds;
      if (null.size(0) < longest) null = at::constant_pad_nd(null, {0, 0, 0, longest - null.size(0)});
      b.set(kNullPromptEmbeds, null.narrow(0, 0, longest).unsqueeze(0).clone());
    }
    for (int64_t i : idx) b.sources.push_back(cat(dir, ":", i));
    return b;
  }
};

// Consecutive runs of `order` with equal latent shapes, cut into batches of at most `size`.
std::vector<std::vector<int64_t>> shape_batches(const FeatureSet& set, std::vector<int64_t> order, int64_t size) {
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return set.shapes[static_cast<size_t>(a)] < set.shapes[static_cast<size_t>(b)];
  });
  std::vector<std::vector<int64_t>> out;
  for (int64_t i : order) {
    if (out.empty() || static_cast<int64_t>(out.back().size()) == size ||
        set.shapes[static_cast<size_t>(out.back().front())] != set.shapes[static_cast<size_t>(i)])
      out.emplace_back();
    out.back().push_back(i);
  }
  return out;
}

class FeatureStream : public BatchStream {
 public:
  // Uniform shapes: samples drawn one by one (the same global batches for any layout).
  FeatureStream(std::shared_ptr<FeatureSet> set, std::vector<int64_t> items, ResumableSampler sampler, int64_t batch)
      : set_(std::move(set)), items_(std::move(items)), sampler_(std::move(sampler)), batch_(batch) {}
  // Several shapes: whole same-shape batches drawn.
  FeatureStream(std::shared_ptr<FeatureSet> set, std::vector<std::vector<int64_t>> units, ResumableSampler sampler)
      : set_(std::move(set)), units_(std::move(units)), sampler_(std::move(sampler)) {}

  Batch next() override {
    std::vector<int64_t> idx;
    if (units_.empty()) {
      for (int64_t k : sampler_.next_n(batch_)) idx.push_back(items_[static_cast<size_t>(k)]);
    } else {
      idx = units_[static_cast<size_t>(sampler_.next())];
    }
    return set_->batch(idx);
  }
  nlohmann::json state() const override { return sampler_.state(); }
  void load_state(const nlohmann::json& s) override { sampler_.load_state(s); }

 private:
  std::shared_ptr<FeatureSet> set_;
  std::vector<int64_t> items_;
  std::vector<std::vector<int64_t>> units_;
  ResumableSampler sampler_;
  int64_t batch_ = 1;
};

}  // namespace

TrainData make_features_data(const config::DataConfig& c, const DataContext& ctx) {
  if (c.paths.size() != 1)
    throw ConfigError(cat("config: data.paths must name one features directory for data.dataset features (got ",
                          c.paths.size(), ")"));
  auto set = std::make_shared<FeatureSet>(c.paths[0]);
  std::vector<int64_t> train, val;
  for (int64_t i = 0; i < set->samples; ++i) {
    (held_out(static_cast<uint64_t>(c.seed), i, c.val_fraction) ? val : train).push_back(i);
  }
  if (static_cast<int64_t>(train.size()) < ctx.world)
    throw ConfigError(cat("data: ", c.paths[0], " has ", train.size(), " training samples, fewer than the ", ctx.world,
                          " data-parallel ranks"));
  bool uniform = true;
  for (int64_t i : train) uniform = uniform && set->shapes[static_cast<size_t>(i)] == set->shapes[static_cast<size_t>(train[0])];
  TrainData d;
  d.fields = {std::string(kLatents), std::string(kPromptEmbeds), std::string(kSampleIds)};
  if (set->null_prompt_embeds.defined()) d.fields.emplace_back(kNullPromptEmbeds);
  const auto seed = static_cast<uint64_t>(c.seed);
  if (uniform) {
    ResumableSampler sampler(static_cast<int64_t>(train.size()), seed, /*shuffle=*/true, ctx.rank, ctx.world);
    d.train = std::make_unique<FeatureStream>(set, train, std::move(sampler), ctx.micro_batch_size);
  } else {
    auto units = shape_batches(*set, epoch_permutation(static_cast<int64_t>(train.size()), seed, 0), ctx.micro_batch_size);
    for (auto& u : units)
      for (auto& i : u) i = train[static_cast<size_t>(i)];
    if (static_cast<int64_t>(units.size()) < ctx.world)
      throw ConfigError(cat("data: ", c.paths[0], " makes ", units.size(), " same-shape batches, fewer than the ",
                            ctx.world, " data-parallel ranks"));
    ResumableSampler sampler(static_cast<int64_t>(units.size()), seed, /*shuffle=*/true, ctx.rank, ctx.world);
    d.train = std::make_unique<FeatureStream>(set, std::move(units), std::move(sampler));
  }
  std::map<std::vector<int64_t>, int64_t> buckets;
  for (int64_t i : train) ++buckets[set->shapes[static_cast<size_t>(i)]];
  std::string shapes;
  for (const auto& [s, n] : buckets) shapes += cat(shapes.empty() ? "" : ", ", n, " of ", s[1], "x", s[2], "x", s[3]);
  log::info("data: ", c.paths[0], ": ", train.size(), " training and ", val.size(), " validation samples; latents (frames x height x width) ",
            shapes);
  if (!val.empty()) {
    d.val = [set, val](int64_t batch, int64_t max_batches, int64_t shard, int64_t num_shards,
                       const std::function<void(const Batch&)>& fn) {
      int64_t k = 0;
      for (const auto& idx : shape_batches(*set, val, batch)) {
        if (max_batches > 0 && k >= max_batches) break;
        if (k++ % num_shards == shard) fn(set->batch(idx));
      }
    };
  }
  return d;
}

namespace {
Registrar features_dataset(dataset_registry(), "features", make_features_data);
}  // namespace

}  // namespace mm::data
