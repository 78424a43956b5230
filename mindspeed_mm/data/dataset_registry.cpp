#include "mindspeed_mm/data/dataset_registry.h"

#include "mindspeed_mm/data/byte_tokenizer.h"

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

// "text": plain text, fortune files or JSONL, byte-level tokens, packed into fixed-length rows.
LMData make_text_data(const config::DataConfig& c) {
  TextDataOptions o;
  o.paths = c.paths;
  o.format = c.format;
  o.text_key = c.text_key;
  o.seq_len = c.seq_len;
  o.val_fraction = c.val_fraction;
  o.seed = static_cast<uint64_t>(c.seed);
  o.max_documents = c.max_documents;
  auto tok = std::make_shared<ByteTokenizer>();
  TextSplits splits = load_text_splits(o, *tok);
  LMData d;
  d.train = std::make_shared<PackedTextDataset>(std::move(splits.train));
  d.val = std::make_shared<PackedTextDataset>(std::move(splits.val));
  d.vocab_size = tok->vocab_size();
  d.eos_id = tok->eos_id();
  d.skipped_lines = splits.skipped_lines;
  d.encode = [tok](std::string_view s) { return tok->encode(s); };
  d.decode = [tok](const std::vector<int64_t>& ids) { return tok->decode(ids, /*skip_special=*/true); };
  return d;
}

Registrar text_dataset(dataset_registry(), "text", make_text_data);
Registrar lm_packed(collator_registry(), "lm_packed", [](const config::DataConfig&) -> Collator {
  return [](const PackedTextDataset& ds, const std::vector<int64_t>& idx) { return make_lm_batch(ds, idx); };
});

}  // namespace
}  // namespace mm::data
