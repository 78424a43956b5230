// Text data for language-model training: read documents (plain text, Debian fortune files, JSONL),
// split them into train/val at document level, tokenize, and pack into fixed-length rows.
//
// Packing: every document's tokens are followed by eos and all are concatenated into one stream
// t[0..T). Row i is t[i*S .. i*S+S] (S+1 tokens, S = seq_len): inputs = row[:-1], labels = row[1:],
// so consecutive rows share one boundary token and every token after t[0] is a label exactly
// once. The last partial row is dropped: rows = floor((T - 1) / S).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "mindspeed_mm/data/byte_tokenizer.h"

namespace mm::data {

struct TextDataOptions {
  // Files or directories. A directory means every regular file directly in it whose name does not
  // end in .dat or .u8 (the index files and symlinks of Debian's fortunes), sorted by name.
  std::vector<std::string> paths;
  // text: paragraphs separated by blank lines are documents.
  // fortune: entries separated by a line holding only '%'.
  // jsonl: one JSON object per line, text under text_key (a .json file holding an array also works).
  // auto (per file): .jsonl/.json -> jsonl; a file with a lone '%' line -> fortune; else text.
  std::string format = "auto";
  std::string text_key = "text";
  int64_t seq_len = 256;
  double val_fraction = 0.05;
  uint64_t seed = 1234;
  int64_t max_documents = 0;  // 0 = all; otherwise the first N documents in path order
};

struct TextDocuments {
  std::vector<std::string> docs;
  int64_t skipped_lines = 0;  // malformed JSONL lines (each file warns once, naming file:line)
};

// Reads every document named by opts.paths, in order. A missing path or an empty result is an
// mm::Error naming the paths; bad options are an mm::ConfigError.
TextDocuments read_text_documents(const TextDataOptions& opts);

// The train/val split of one document: a hash of its content mixed with seed, compared with
// val_fraction. Hashing content rather than position means identical documents always land on
// the same side (no exact-duplicate leakage into val) and the split survives reordering of files.
bool is_validation_document(std::string_view doc, double val_fraction, uint64_t seed);
// The same from the document's content hash (document_hash: FNV-1a, 64 bit), for callers that
// keep hashes instead of documents.
uint64_t document_hash(std::string_view doc);
bool is_validation_hash(uint64_t doc_hash, double val_fraction, uint64_t seed);

using TextEncoder = std::function<std::vector<int64_t>(std::string_view)>;

class PackedTextDataset {
 public:
  PackedTextDataset() = default;
  // Tokenizes docs with encode, appends eos_id after each and packs rows of seq_len + 1 tokens.
  PackedTextDataset(const std::vector<std::string>& docs, const TextEncoder& encode,
                    int64_t eos_id, int64_t seq_len);

  int64_t size() const { return size_; }  // number of rows
  int64_t seq_len() const { return seq_len_; }
  at::Tensor row(int64_t i) const;  // int64 [seq_len + 1]
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return tokens_.defined() ? tokens_.numel() : 0; }  // incl. eos
  // Counts of the label tokens of all rows (t[1 .. size*S]), i.e. exactly the tokens the LM loss
  // scores; for the unigram baseline. A token id >= vocab is an mm::Error.
  std::vector<int64_t> token_counts(int64_t vocab) const;

 private:
  at::Tensor tokens_;  // int32 [num_tokens]: the packed stream (ids fit int32 for any real vocab)
  int64_t seq_len_ = 0, size_ = 0, num_documents_ = 0;
};

struct TextSplits {
  PackedTextDataset train, val;
  int64_t skipped_lines = 0;
};

// Reads, splits and packs. A train split too short for one row is an mm::Error; an empty val
// split (with val_fraction > 0) only warns.
TextSplits load_text_splits(const TextDataOptions& opts, const ByteTokenizer& tokenizer);
TextSplits load_text_splits(const TextDataOptions& opts, const TextEncoder& encode, int64_t eos_id);

struct LMBatch {
  at::Tensor input_ids, labels;  // int64 [B, S]; labels[b, s] = input_ids[b, s + 1] within a row
};
LMBatch make_lm_batch(const PackedTextDataset& dataset, const std::vector<int64_t>& indices);

// Cross-entropy (nats per token) of the eval tokens under the add-one-smoothed unigram
// distribution of the train tokens: p(v) = (c_v + 1) / (N + V). The baseline a language model
// must beat; equals log(V) when both distributions are uniform.
double unigram_entropy_nats(const std::vector<int64_t>& train_counts,
                            const std::vector<int64_t>& eval_counts);

}  // namespace mm::data
