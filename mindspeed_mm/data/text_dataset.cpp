// Text datasets: document readers per format, the content-hashed train/val split, and packing.
#include "mindspeed_mm/data/text_dataset.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/data/sampler.h"
#include "mindspeed_mm/core/strings.h"

namespace mm::data {
namespace fs = std::filesystem;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
}

std::string read_file(const fs::path& path) {
  auto bytes = read_file_bytes(path.string());
  MM_CHECK(bytes, "data: cannot open '", path.string(), "'");
  return std::move(*bytes);
}

// Lines without their '\n' (and without a trailing '\r', so CRLF files parse the same).
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

// Collects documents and stops at max_documents (0 = unlimited).
struct DocSink {
  std::vector<std::string>& docs;
  int64_t max_documents;
  bool full() const { return max_documents > 0 && static_cast<int64_t>(docs.size()) >= max_documents; }
  void add(std::string doc) {
    if (!full()) docs.push_back(std::move(doc));
  }
};

// Documents are runs of lines between separator lines; blank documents are dropped.
template <class IsSeparator>
void read_line_groups(std::string_view text, IsSeparator is_separator, DocSink& sink) {
  std::string doc;
  auto flush = [&] {
    if (!is_blank(doc)) sink.add(doc);
    doc.clear();
  };
  for (std::string_view line : split_lines(text)) {
    if (sink.full()) return;
    if (is_separator(line)) {
      flush();
    } else {
      if (!doc.empty()) doc.push_back('\n');
      doc.append(line);
    }
  }
  flush();
}

bool has_fortune_separator(std::string_view text) {
  for (std::string_view line : split_lines(text))
    if (line == "%") return true;
  return false;
}

// The text of one JSON record, or an empty string with `why` set when it is malformed.
std::string record_text(const nlohmann::json& rec, const std::string& key, std::string& why) {
  if (!rec.is_object()) {
    why = "not a JSON object";
  } else if (!rec.contains(key)) {
    why = cat("no '", key, "' field");
  } else if (!rec.at(key).is_string()) {
    why = cat("'", key, "' is not a string");
  } else {
    return rec.at(key).get<std::string>();
  }
  return {};
}

// JSONL, or a .json file holding one array of records. Malformed records are counted, not fatal.
int64_t read_jsonl(const fs::path& path, std::string_view text, const std::string& key,
                   DocSink& sink) {
  int64_t skipped = 0;
  std::string first_bad;
  auto bad = [&](const std::string& where, const std::string& why) {
    if (skipped++ == 0) first_bad = cat(where, ": ", why);
  };
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '[') {
    nlohmann::json arr;
    try {
      arr = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat("data: '", path.string(), "' starts with '[' but is not valid JSON: ", json_error_text(e.what())));
    }
    for (size_t i = 0; i < arr.size() && !sink.full(); ++i) {
      std::string why;
      std::string doc = record_text(arr[i], key, why);
      if (!why.empty()) bad(cat(path.string(), " element ", i), why);
      else if (!doc.empty()) sink.add(std::move(doc));
    }
  } else {
    const auto lines = split_lines(text);
    for (size_t i = 0; i < lines.size() && !sink.full(); ++i) {
      if (is_blank(lines[i])) continue;
      const std::string where = cat(path.string(), ":", i + 1);
      nlohmann::json rec = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
      if (rec.is_discarded()) {
        bad(where, "not valid JSON");
        continue;
      }
      std::string why;
      std::string doc = record_text(rec, key, why);
      if (!why.empty()) bad(where, why);
      else if (!doc.empty()) sink.add(std::move(doc));
    }
  }
  if (skipped > 0)
    log::warn("data: skipped ", skipped, " malformed record(s) in '", path.string(),
              "'; first at ", first_bad);
  return skipped;
}

// The files a path stands for: itself, or a directory's data files sorted by name.
std::vector<fs::path> expand_path(const std::string& p) {
  std::error_code ec;
  const fs::path path(p);
  MM_CHECK(fs::exists(path, ec), "data: path '", p, "' does not exist");
  if (fs::is_regular_file(path, ec)) return {path};
  MM_CHECK(fs::is_directory(path, ec), "data: '", p, "' is neither a file nor a directory");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  MM_CHECK(!files.empty(), "data: directory '", p, "' holds no data files (.dat/.u8 are skipped)");
  return files;
}

std::string detect_format(const fs::path& path, std::string_view text) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".jsonl" || ext == ".json") return "jsonl";
  return has_fortune_separator(text) ? "fortune" : "text";
}

void validate(const TextDataOptions& o) {
  if (o.paths.empty()) throw ConfigError("data: no paths given");
  if (o.format != "auto" && o.format != "text" && o.format != "fortune" && o.format != "jsonl")
    throw ConfigError(cat("data: format must be auto, text, fortune or jsonl (got '", o.format, "')"));
  if (o.seq_len < 1) throw ConfigError(cat("data: seq_len must be >= 1 (got ", o.seq_len, ")"));
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw ConfigError(cat("data: val_fraction must be in [0, 1) (got ", o.val_fraction, ")"));
  if (o.max_documents < 0)
    throw ConfigError(cat("data: max_documents must be >= 0 (got ", o.max_documents, ")"));
}

std::string joined_paths(const std::vector<std::string>& paths) {
  std::string s;
  for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p;
  return s;
}

// FNV-1a: a fixed, platform-independent content hash (std::hash is implementation-defined).
uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ULL;
  return h;
}

}  // namespace

TextDocuments read_text_documents(const TextDataOptions& opts) {
  validate(opts);
  TextDocuments out;
  DocSink sink{out.docs, opts.max_documents};
  for (const auto& p : opts.paths) {
    for (const fs::path& file : expand_path(p)) {
      if (sink.full()) break;
      const std::string text = read_file(file);
      const std::string format = opts.format == "auto" ? detect_format(file, text) : opts.format;
      if (format == "jsonl") {
        out.skipped_lines += read_jsonl(file, text, opts.text_key, sink);
      } else if (format == "fortune") {
        read_line_groups(text, [](std::string_view l) { return l == "%"; }, sink);
      } else {
        read_line_groups(text, [](std::string_view l) { return is_blank(l); }, sink);
      }
    }
  }
  MM_CHECK(!out.docs.empty(), "data: no documents found in ", joined_paths(opts.paths));
  return out;
}

bool is_validation_document(std::string_view doc, double val_fraction, uint64_t seed) {
  return is_validation_hash(fnv1a64(doc), val_fraction, seed);
}

uint64_t document_hash(std::string_view doc) { return fnv1a64(doc); }

bool is_validation_hash(uint64_t doc_hash, double val_fraction, uint64_t seed) {
  const uint64_t h = splitmix64(doc_hash ^ splitmix64(seed));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < val_fraction;
}

PackedTextDataset::PackedTextDataset(const std::vector<std::string>& docs,
                                     const TextEncoder& encode, int64_t eos_id, int64_t seq_len)
    : seq_len_(seq_len), num_documents_(static_cast<int64_t>(docs.size())) {
  MM_CHECK(seq_len >= 1, "PackedTextDataset: seq_len must be >= 1 (got ", seq_len, ")");
  std::vector<int32_t> stream;
  auto push = [&](int64_t id) {
    MM_CHECK(id >= 0 && id <= INT32_MAX, "PackedTextDataset: token id ", id, " out of range");
    stream.push_back(static_cast<int32_t>(id));
  };
  for (const auto& doc : docs) {
    for (int64_t id : encode(doc)) push(id);
    push(eos_id);
  }
  const auto n = static_cast<int64_t>(stream.size());
  tokens_ = at::from_blob(stream.data(), {n}, at::kInt).clone();
  size_ = n > 0 ? (n - 1) / seq_len_ : 0;
}

at::Tensor PackedTextDataset::row(int64_t i) const {
  MM_CHECK(i >= 0 && i < size_, "PackedTextDataset: row ", i, " out of range [0, ", size_, ")");
  return tokens_.narrow(0, i * seq_len_, seq_len_ + 1).to(at::kLong);
}

std::vector<int64_t> PackedTextDataset::token_counts(int64_t vocab) const {
  MM_CHECK(vocab > 0, "token_counts: vocab must be > 0 (got ", vocab, ")");
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  if (size_ == 0) return counts;
  const int32_t* t = tokens_.data_ptr<int32_t>();
  for (int64_t k = 1; k <= size_ * seq_len_; ++k) {
    MM_CHECK(t[k] < vocab, "token_counts: token id ", t[k], " >= vocab ", vocab);
    ++counts[static_cast<size_t>(t[k])];
  }
  return counts;
}

TextSplits load_text_splits(const TextDataOptions& opts, const ByteTokenizer& tokenizer) {
  return load_text_splits(
      opts, [&tokenizer](std::string_view s) { return tokenizer.encode(s); }, tokenizer.eos_id());
}

TextSplits load_text_splits(const TextDataOptions& opts, const TextEncoder& encode, int64_t eos_id) {
  TextDocuments read = read_text_documents(opts);
  std::vector<std::string> train_docs, val_docs;
  for (auto& doc : read.docs)
    (is_validation_document(doc, opts.val_fraction, opts.seed) ? val_docs : train_docs)
        .push_back(std::move(doc));
  TextSplits s{PackedTextDataset(train_docs, encode, eos_id, opts.seq_len),
               PackedTextDataset(val_docs, encode, eos_id, opts.seq_len), read.skipped_lines};
  MM_CHECK(s.train.size() > 0, "data: the train split of ", joined_paths(opts.paths), " has ",
           s.train.num_tokens(), " tokens, fewer than one row of seq_len + 1 = ", opts.seq_len + 1);
  if (opts.val_fraction > 0 && s.val.size() == 0)
    log::warn("data: the val split has ", s.val.num_documents(), " documents and ",
              s.val.num_tokens(), " tokens, too few for one row of ", opts.seq_len + 1,
              "; raise val_fraction or lower seq_len");
  log::info("data: ", s.train.num_documents() + s.val.num_documents(), " documents -> train ",
            s.train.num_documents(), " docs / ", s.train.num_tokens(), " tokens / ", s.train.size(),
            " rows, val ", s.val.num_documents(), " docs / ", s.val.num_tokens(), " tokens / ",
            s.val.size(), " rows (seq_len ", opts.seq_len, ")");
  return s;
}

LMBatch make_lm_batch(const PackedTextDataset& dataset, const std::vector<int64_t>& indices) {
  MM_CHECK(!indices.empty(), "make_lm_batch: no indices");
  const int64_t S = dataset.seq_len();
  at::Tensor rows = at::empty({static_cast<int64_t>(indices.size()), S + 1}, at::kLong);
  for (size_t b = 0; b < indices.size(); ++b) rows[static_cast<int64_t>(b)].copy_(dataset.row(indices[b]));
  return {rows.narrow(1, 0, S).contiguous(), rows.narrow(1, 1, S).contiguous()};
}

double unigram_entropy_nats(const std::vector<int64_t>& train_counts,
                            const std::vector<int64_t>& eval_counts) {
  MM_CHECK(!train_counts.empty() && train_counts.size() == eval_counts.size(),
           "unigram_entropy_nats: count vectors must be non-empty and of one vocabulary size (got ",
           train_counts.size(), " and ", eval_counts.size(), ")");
  const auto V = static_cast<double>(train_counts.size());
  double n_train = 0, n_eval = 0, nll = 0;
  for (int64_t c : train_counts) n_train += static_cast<double>(c);
  for (size_t v = 0; v < eval_counts.size(); ++v) {
    if (eval_counts[v] == 0) continue;
    const double p = (static_cast<double>(train_counts[v]) + 1.0) / (n_train + V);
    nll -= static_cast<double>(eval_counts[v]) * std::log(p);
    n_eval += static_cast<double>(eval_counts[v]);
  }
  MM_CHECK(n_eval > 0, "unigram_entropy_nats: no eval tokens");
  return nll / n_eval;
}

}  // namespace mm::data
