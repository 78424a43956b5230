// The "videos" dataset (data.dataset: videos): JSONL records {"path": clip, "cap": text} (data.paths;
// paths relative to data.media_root, default the JSONL's folder), each decoded into a clip of
// data.video.frames frames at data.video.fps, resized to cover data.video.height x width and
// centre-cropped, in [-1, 1]: batches of kVideo [B, 3, F, H, W] and kSampleIds (what a VAE
// trains on), plus each sample's caption (Batch::captions, field kCaptions) when every record
// has one (what frozen encoders turn into text features: model.encoders). Validation clips
// are data.val_paths' records, or else data.val_fraction of data.paths' (seeded by data.seed).
// A clip that cannot be read or is too short is skipped (the next one takes its place), named
// once in a warning and counted; more than data.max_bad_fraction of the clips tried stops the run.
#include <mutex>
#include <set>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/data/media/video_clip.h"
#include "mindspeed_mm/data/sampler.h"

namespace mm::data {
namespace {

struct ClipSet {
  std::vector<std::string> paths, sources;  // resolved path, "file.jsonl:line" per record
  std::vector<std::string> captions;        // per record ("" without one)
  bool captioned = false;                   // every record has a caption: batches carry them
  config::VideoClipConfig clip;
  double max_bad_fraction = 0.1;
  std::set<int64_t> bad;
  int64_t tried = 0;
  std::mutex mu;

  // The clip of record i, or undefined when it is bad (named once, counted).
  at::Tensor load(int64_t i) {
    try {
      ++tried;
      return load_video_clip(paths[static_cast<size_t>(i)], clip.height, clip.width, clip.frames, clip.fps);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (bad.insert(i).second) log::warn("data: skipped ", sources[static_cast<size_t>(i)], ": ", e.what());
      if (tried >= 20 && static_cast<double>(bad.size()) > max_bad_fraction * static_cast<double>(tried))
        throw Error(cat("data: ", bad.size(), " of ", tried, " clips tried were bad, more than data.max_bad_fraction ",
                        max_bad_fraction));
      return {};
    }
  }

  Batch batch(const std::vector<int64_t>& idx, const std::vector<at::Tensor>& clips) const {
    Batch b;
    b.num_samples = static_cast<int64_t>(idx.size());
    b.set(kVideo, at::stack(clips));
    b.set(kSampleIds, at::tensor(idx, at::kLong), /*host=*/true);
    for (int64_t i : idx) b.sources.push_back(sources[static_cast<size_t>(i)]);
    if (captioned)
      for (int64_t i : idx) b.captions.push_back(captions[static_cast<size_t>(i)]);
    return b;
  }
};

class ClipStream : public BatchStream {
 public:
  ClipStream(std::shared_ptr<ClipSet> set, std::vector<int64_t> items, ResumableSampler sampler, int64_t batch)
      : set_(std::move(set)), items_(std::move(items)), sampler_(std::move(sampler)), batch_(batch) {}

  Batch next() override {
    std::vector<int64_t> idx;
    std::vector<at::Tensor> clips;
    while (static_cast<int64_t>(idx.size()) < batch_) {
      const int64_t i = items_[static_cast<size_t>(sampler_.next())];
      at::Tensor c = set_->load(i);
      if (!c.defined()) continue;
      idx.push_back(i);
      clips.push_back(c);
    }
    return set_->batch(idx, clips);
  }
  nlohmann::json state() const override { return sampler_.state(); }
  void load_state(const nlohmann::json& s) override { sampler_.load_state(s); }
  int64_t skipped_samples() const override { return static_cast<int64_t>(set_->bad.size()); }

 private:
  std::shared_ptr<ClipSet> set_;
  std::vector<int64_t> items_;
  ResumableSampler sampler_;
  int64_t batch_;
};

TrainData make_video_data(const config::DataConfig& c, const DataContext& ctx) {
  if (c.paths.empty()) throw ConfigError("config: data.paths must name the JSONL files of data.dataset videos");
  auto set = std::make_shared<ClipSet>();
  set->clip = c.video;
  set->max_bad_fraction = c.max_bad_fraction;
  int64_t with_caption = 0;
  std::string uncaptioned;  // the first record without a caption
  // data.paths' records first, then data.val_paths' (the validation clips when given).
  std::vector<std::string> files = c.paths;
  files.insert(files.end(), c.val_paths.begin(), c.val_paths.end());
  int64_t first_val = -1;
  for (size_t k = 0; k < files.size(); ++k) {
    if (k == c.paths.size()) first_val = static_cast<int64_t>(set->paths.size());
    for (VideoRecord& r : read_video_records(files[k], c.media_root)) {
      set->paths.push_back(r.path);
      set->sources.push_back(r.source);
      set->captions.push_back(r.caption);
      if (r.has_caption) ++with_caption;
      else if (uncaptioned.empty()) uncaptioned = r.source;
    }
  }
  const auto records = static_cast<int64_t>(set->paths.size());
  if (with_caption > 0 && with_caption < records)
    log::warn("data: ", records - with_caption, " of ", records, " records have no \"cap\" (or \"caption\") string, the first ",
              uncaptioned, ": the batches carry no captions");
  std::vector<int64_t> train, val;
  for (int64_t i = 0; i < records; ++i) {
    if (first_val >= 0) (i < first_val ? train : val).push_back(i);
    else (held_out(static_cast<uint64_t>(c.seed), i, c.val_fraction) ? val : train).push_back(i);
  }
  if (static_cast<int64_t>(train.size()) < ctx.world)
    throw ConfigError(cat("data: data.paths hold ", train.size(), " training clips, fewer than the ", ctx.world,
                          " data-parallel ranks"));
  log::info("data: ", train.size(), " training and ", val.size(), " validation clips of ", c.video.frames, " frames at ",
            c.video.fps, " fps, ", c.video.height, "x", c.video.width);
  TrainData d;
  d.fields = {std::string(kVideo), std::string(kSampleIds)};
  set->captioned = records > 0 && with_caption == records;
  if (set->captioned) d.fields.emplace_back(kCaptions);
  ResumableSampler sampler(static_cast<int64_t>(train.size()), static_cast<uint64_t>(c.seed), true, ctx.rank, ctx.world);
  d.train = std::make_unique<ClipStream>(set, train, std::move(sampler), ctx.micro_batch_size);
  if (!val.empty()) {
    d.val = [set, val](int64_t batch, int64_t max_batches, int64_t shard, int64_t num_shards,
                       const std::function<void(const Batch&)>& fn) {
      int64_t k = 0;
      std::vector<int64_t> idx;
      std::vector<at::Tensor> clips;
      auto flush = [&] {
        if (idx.empty()) return;
        if (k++ % num_shards == shard) fn(set->batch(idx, clips));
        idx.clear();
        clips.clear();
      };
      for (int64_t i : val) {
        if (max_batches > 0 && k >= max_batches) break;
        at::Tensor clip = set->load(i);
        if (!clip.defined()) continue;
        idx.push_back(i);
        clips.push_back(clip);
        if (static_cast<int64_t>(idx.size()) == batch) flush();
      }
      if (max_batches == 0 || k < max_batches) flush();
    };
  }
  return d;
}

Registrar videos_dataset(dataset_registry(), "videos", make_video_data);

}  // namespace
}  // namespace mm::data
