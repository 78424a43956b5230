#include "mindspeed_mm/data/dataset_registry.h"

#include "mindspeed_mm/data/byte_tokenizer.h"
#include "mindspeed_mm/data/mllm/mllm_collator.h"
#include "mindspeed_mm/data/sampler.h"
#include "mindspeed_mm/data/text_dataset.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"

namespace mm::data {

Registry<DatasetFactory>& dataset_registry() {
  static Registry<DatasetFactory> r("dataset");
  return r;
}

Registry<CollatorFactory>& collator_registry() {
  static Registry<CollatorFactory> r("collator");
  return r;
}

namespace {

Batch to_batch(LMBatch b) {
  Batch out;
  out.num_samples = b.input_ids.size(0);
  out.set(kInputIds, std::move(b.input_ids));
  out.set(kLabels, std::move(b.labels));
  return out;
}

// Packed text rows drawn by a seeded, resumable sampler; the state is the sampler's.
class TextStream : public BatchStream {
 public:
  TextStream(std::shared_ptr<PackedTextDataset> ds, ResumableSampler sampler, int64_t batch)
      : ds_(std::move(ds)), sampler_(std::move(sampler)), batch_(batch) {}
  Batch next() override { return to_batch(make_lm_batch(*ds_, sampler_.next_n(batch_))); }
  nlohmann::json state() const override { return sampler_.state(); }
  void load_state(const nlohmann::json& s) override { sampler_.load_state(s); }

 private:
  std::shared_ptr<PackedTextDataset> ds_;
  ResumableSampler sampler_;
  int64_t batch_;
};

// "text": plain text, fortune files or JSONL, packed into fixed-length rows; byte-level ids, or
// an HF tokenizer (data.tokenizer: DIR) whose eos separates the documents.
TrainData make_text_data(const config::DataConfig& c, const DataContext& ctx) {
  if (!c.collator.empty() && c.collator != "lm_packed")
    throw ConfigError(cat("config: data.collator '", c.collator, "' does not apply to the text dataset (it packs rows: lm_packed)"));
  TextDataOptions o;
  o.paths = c.paths;
  o.format = c.format;
  o.text_key = c.text_key;
  o.seq_len = c.seq_len;
  o.val_fraction = c.val_fraction;
  o.seed = static_cast<uint64_t>(c.seed);
  o.max_documents = c.max_documents;
  TrainData d;
  d.fields = {std::string(kInputIds), std::string(kLabels)};
  TextSplits splits;
  if (c.tokenizer == "byte") {
    auto tok = std::make_shared<ByteTokenizer>();
    splits = load_text_splits(o, *tok);
    d.vocab_size = tok->vocab_size();
    d.eos_id = tok->eos_id();
    d.encode = [tok](std::string_view s) { return tok->encode(s); };
    d.decode = [tok](const std::vector<int64_t>& ids) { return tok->decode(ids, /*skip_special=*/true); };
  } else {
    auto tok = std::make_shared<PretrainedTokenizer>(load_pretrained_tokenizer(c.tokenizer));
    auto eos = tok->config.eos_token ? tok->tokenizer.token_to_id(*tok->config.eos_token) : std::nullopt;
    MM_CHECK(eos, "data: tokenizer '", c.tokenizer, "' has no eos_token to separate documents");
    d.vocab_size = tok->tokenizer.vocab_size();
    d.eos_id = *eos;
    d.encode = [tok](std::string_view s) { return tok->tokenizer.encode(s, false); };
    d.decode = [tok](const std::vector<int64_t>& ids) { return tok->tokenizer.decode(ids, true); };
    splits = load_text_splits(o, d.encode, d.eos_id);
  }
  auto train = std::make_shared<PackedTextDataset>(std::move(splits.train));
  auto val = std::make_shared<PackedTextDataset>(std::move(splits.val));
  if (val->size() > 0) {
    d.train_token_counts = train->token_counts(d.vocab_size);
    d.val_token_counts = val->token_counts(d.vocab_size);
    d.val = [val](int64_t batch, int64_t max_batches, int64_t shard, int64_t num_shards,
                  const std::function<void(const Batch&)>& fn) {
      int64_t batches = 0;
      for (int64_t start = 0; start < val->size(); start += batch) {
        if (max_batches > 0 && batches >= max_batches) break;
        if (batches++ % num_shards != shard) continue;
        std::vector<int64_t> idx;
        for (int64_t i = start; i < std::min(val->size(), start + batch); ++i) idx.push_back(i);
        fn(to_batch(make_lm_batch(*val, idx)));
      }
    };
  }
  d.train = std::make_unique<TextStream>(
      train, ResumableSampler(train->size(), static_cast<uint64_t>(c.seed), /*shuffle=*/true, ctx.rank, ctx.world),
      ctx.micro_batch_size);
  return d;
}

Registrar text_dataset(dataset_registry(), "text", make_text_data);

Registrar padded(collator_registry(), "padded", [](const config::DataConfig& c, int64_t pad_id) -> SampleCollator {
  CollatorOptions o{false, c.pad_to_multiple_of, pad_id};
  return [o](const std::vector<EncodedSample>& s) { return collate_samples(s, o); };
});
Registrar packed(collator_registry(), "packed", [](const config::DataConfig& c, int64_t pad_id) -> SampleCollator {
  CollatorOptions o{true, c.pad_to_multiple_of, pad_id};
  return [o](const std::vector<EncodedSample>& s) { return collate_samples(s, o); };
});

}  // namespace
}  // namespace mm::data
