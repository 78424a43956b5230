// The "mllm" dataset of `mm train`: data.paths (with data.weights) indexed as mllm records, a
// validation split (data.val_paths, or data.val_fraction of the records by content hash), the
// sample encoder and collator, and the threaded DataLoader sharded by data-parallel rank.
#include <filesystem>

#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/core/parallel_for.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/data/loader.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/mllm_options.h"
#include "mindspeed_mm/data/mllm/record_index.h"
#include "mindspeed_mm/data/text_dataset.h"
#include "mindspeed_mm/data/tokenizer/byte_chat_tokenizer.h"

namespace fs = std::filesystem;

namespace mm::data {

SampleEncoderOptions encoder_options(const config::DataConfig& c) {
  SampleEncoderOptions o;
  o.chat_template = c.chat_template;
  o.chat.train_on_prompt = c.train_on_prompt;
  o.chat.mask_history = c.mask_history;
  o.chat.system = c.system;
  o.cutoff_len = c.cutoff_len;
  o.truncation = c.truncation;
  o.media = c.processor;
  image_processor_config(o.media);  // checks image_mean / image_std now, as a ConfigError
  return o;
}

PretrainedTokenizer mllm_tokenizer(const config::DataConfig& c) {
  return c.tokenizer == "byte" ? byte_chat_tokenizer() : load_pretrained_tokenizer(c.tokenizer);
}

namespace {

// Logs the first few malformed records of a file and a count for the rest.
void report_bad_records(const std::string& path, const std::vector<BadRecord>& bad) {
  constexpr size_t kShown = 5;
  for (size_t i = 0; i < bad.size() && i < kShown; ++i)
    log::warn("data: skipping bad sample ", bad[i].source, ": ", bad[i].reason);
  if (bad.size() > kShown) log::warn("data: ... and ", bad.size() - kShown, " more bad records in ", path);
}

// Records of several indexed files, each referred to by (file, record) in one 64-bit number.
struct RecordTable {
  std::vector<std::unique_ptr<MllmRecordIndex>> files;
  static int64_t ref(size_t file, int64_t record) { return (static_cast<int64_t>(file) << 40) | record; }
  size_t add(const std::string& path, const MllmAttr& attr, const std::string& media_root) {
    files.push_back(std::make_unique<MllmRecordIndex>(path, attr, media_root));
    return files.size() - 1;
  }
  MllmRecord get(int64_t ref) const { return files[static_cast<size_t>(ref >> 40)]->record(ref & ((int64_t(1) << 40) - 1)); }
};

class MllmStream : public BatchStream {
 public:
  MllmStream(std::unique_ptr<DataLoader> loader, int64_t bad_records)
      : loader_(std::move(loader)), bad_records_(bad_records) {}
  Batch next() override { return loader_->next(); }
  nlohmann::json state() const override { return loader_->state(); }
  void load_state(const nlohmann::json& s) override { loader_->load_state(s); }
  int64_t skipped_samples() const override {
    return bad_records_ + static_cast<int64_t>(loader_->stats().bad.size());
  }

 private:
  std::unique_ptr<DataLoader> loader_;
  int64_t bad_records_;
};

TrainData make_mllm_data(const config::DataConfig& c, const DataContext& ctx) {
  auto encoder = std::make_shared<const SampleEncoder>(mllm_tokenizer(c), encoder_options(c));
  const MllmAttr& attr = c.attr;
  const std::string collator_id = c.collator.empty() ? "padded" : c.collator;
  SampleCollator collate = collator_registry().get(collator_id, "data.collator")(c, encoder->pad_id());

  // Records: every path is one dataset of the mixture, indexed rather than read: a file keeps
  // its good records' offsets, a record is parsed when the loader asks for it (record_index.h).
  auto table = std::make_shared<RecordTable>();
  std::vector<std::vector<int64_t>> sets;  // per file: its training records, as table references
  auto val = std::make_shared<std::vector<int64_t>>();
  int64_t bad_records = 0, good_records = 0;
  for (const auto& path : c.paths) {
    const size_t f = table->add(path, attr, c.media_root);
    const MllmRecordIndex& index = *table->files[f];
    report_bad_records(path, index.bad());
    bad_records += static_cast<int64_t>(index.bad().size());
    good_records += index.size();
    const std::vector<bool> is_val = c.val_paths.empty() ? index.validation_split(c.val_fraction, static_cast<uint64_t>(c.seed))
                                                         : std::vector<bool>(static_cast<size_t>(index.size()), false);
    std::vector<int64_t> train;
    for (int64_t r = 0; r < index.size(); ++r) (is_val[static_cast<size_t>(r)] ? *val : train).push_back(RecordTable::ref(f, r));
    sets.push_back(std::move(train));
  }
  for (const auto& path : c.val_paths) {
    const size_t f = table->add(path, attr, c.media_root);
    report_bad_records(path, table->files[f]->bad());
    for (int64_t r = 0; r < table->files[f]->size(); ++r) val->push_back(RecordTable::ref(f, r));
  }
  const int64_t read = bad_records + good_records;
  if (read > 0 && bad_records > c.max_bad_fraction * static_cast<double>(read))
    throw Error(cat("data: ", bad_records, " of ", read, " records in data.paths are malformed, more than data.max_bad_fraction ",
                    c.max_bad_fraction));

  std::vector<int64_t> sizes;
  for (auto& s : sets) sizes.push_back(static_cast<int64_t>(s.size()));
  // The epoch's entries as table references: a repeated record keeps its reference, which is
  // also its key for the loader's bad-sample bookkeeping.
  auto mix = std::make_shared<std::vector<int64_t>>();
  for (const MixEntry& e : build_mixture(sizes, c.weights, static_cast<uint64_t>(c.seed)))
    mix->push_back(sets[e.dataset][static_cast<size_t>(e.index)]);
  std::vector<std::vector<int64_t>>().swap(sets);
  const int64_t n = static_cast<int64_t>(mix->size());
  log::info("data: ", n, " training samples from ", c.paths.size(), " file(s), ", val->size(), " validation samples, ",
            bad_records, " malformed record(s) skipped");

  ResumableSampler sampler(n, static_cast<uint64_t>(c.seed), /*shuffle=*/true, ctx.rank, ctx.world);
  if (c.group_by_length) {
    std::vector<int64_t> lengths(static_cast<size_t>(n));
    parallel_for(static_cast<size_t>(n), static_cast<int>(std::max<int64_t>(1, c.num_workers)),
                 [&](size_t i) { lengths[i] = encoder->estimate_length(table->get((*mix)[i])); });
    sampler.group_by_length(std::move(lengths), ctx.world * ctx.micro_batch_size * 50);
  }
  LoaderOptions lo;
  lo.batch_size = ctx.micro_batch_size;
  lo.num_workers = static_cast<int>(c.num_workers);
  lo.prefetch = c.prefetch;
  lo.max_bad_fraction = c.max_bad_fraction;
  lo.min_samples_for_bad_check = std::min<int64_t>(lo.min_samples_for_bad_check, n);
  lo.sample_key = [mix](int64_t i) { return (*mix)[static_cast<size_t>(i)]; };
  auto loader = std::make_unique<DataLoader>(
      n, [encoder, table, mix](int64_t i) { return encoder->encode(table->get((*mix)[static_cast<size_t>(i)])); },
      collate, std::move(sampler), lo);

  TrainData d;
  d.train = std::make_unique<MllmStream>(std::move(loader), bad_records);
  for (auto f : {kInputIds, kLabels, kAttentionMask, kPositionIds, kPixelValues, kImageGridThw, kPixelValuesVideos,
                 kVideoGridThw, kVideoSecondPerGrid})
    d.fields.emplace_back(f);
  if (collator_id == "packed")
    for (auto f : {kSegmentIds, kCuSeqlens, kMaxSeqlen}) d.fields.emplace_back(f);
  d.vocab_size = encoder->tokenizer().vocab_size();
  d.eos_id = encoder->eos_id();
  d.encode = [encoder](std::string_view s) { return encoder->tokenizer().encode(s, false); };
  d.decode = [encoder](const std::vector<int64_t>& ids) { return encoder->tokenizer().decode(ids, true); };
  if (!val->empty()) {
    const int threads = static_cast<int>(std::max<int64_t>(1, c.num_workers));
    d.val = [encoder, table, val, collate, threads](int64_t batch, int64_t max_batches, int64_t shard, int64_t num_shards,
                                             const std::function<void(const Batch&)>& fn) {
      // In file order; bad samples are left out (warned once each per pass).
      const int64_t total = static_cast<int64_t>(val->size());
      int64_t batches = 0;
      for (int64_t start = 0; start < total; start += batch) {
        if (max_batches > 0 && batches >= max_batches) break;
        if (batches++ % num_shards != shard) continue;
        const int64_t count = std::min(batch, total - start);
        std::vector<EncodedSample> enc(static_cast<size_t>(count));
        std::vector<std::string> errors(static_cast<size_t>(count));
        parallel_for(static_cast<size_t>(count), threads, [&](size_t i) {
          try {
            enc[i] = encoder->encode(table->get((*val)[start + i]));
          } catch (const std::exception& e) {
            errors[i] = e.what();
          }
        });
        std::vector<EncodedSample> good;
        for (int64_t i = 0; i < count; ++i) {
          if (errors[i].empty()) good.push_back(std::move(enc[i]));
          else log::warn("data: validation: skipping bad sample ", errors[i]);
        }
        if (!good.empty()) fn(collate(good));
      }
    };
  }
  return d;
}

Registrar mllm_dataset(dataset_registry(), "mllm", make_mllm_data);

}  // namespace
}  // namespace mm::data
