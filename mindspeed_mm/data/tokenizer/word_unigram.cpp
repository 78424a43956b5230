#include "mindspeed_mm/data/tokenizer/word_unigram.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <sstream>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"

namespace mm::data {
namespace {

const char* kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's word-start mark

nlohmann::json special(int id, const std::string& content) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

nlohmann::json metaspace() {
  return {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "always"}, {"split", true}};
}

}  // namespace

std::vector<std::string> caption_words(const std::vector<std::string>& captions) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& c : captions) {
    std::istringstream in(c);
    for (std::string w; in >> w;) {
      for (char& ch : w) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (seen.insert(w).second) out.push_back(w);
    }
  }
  return out;
}

nlohmann::json word_unigram_tokenizer_json(const std::vector<std::string>& words) {
  nlohmann::json vocab = nlohmann::json::array({{"<pad>", 0.0}, {"</s>", 0.0}, {"<unk>", 0.0}});
  std::set<std::string> pieces;
  // Whole words: a log-probability that beats spelling them out from single characters (-10 each).
  for (const std::string& w : words) {
    const std::string piece = kSpace + w;
    if (pieces.insert(piece).second) vocab.push_back({piece, -1.0 - 0.01 * static_cast<double>(vocab.size())});
  }
  std::string fallback = "abcdefghijklmnopqrstuvwxyz0123456789";
  for (const std::string& w : words)
    for (char c : w)
      if (fallback.find(c) == std::string::npos) fallback += c;
  for (const std::string p : {std::string(kSpace)}) pieces.insert(p), vocab.push_back({p, -10.0});
  for (char c : fallback) {
    const std::string p(1, c);
    if (pieces.insert(p).second) vocab.push_back({p, -10.0});
  }
  nlohmann::json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = {special(0, "<pad>"), special(1, "</s>"), special(2, "<unk>")};
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "Lowercase"}}, {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}}}};
  j["pre_tokenizer"] = metaspace();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"</s>", {{"id", "</s>"}, {"ids", {1}}, {"tokens", {"</s>"}}}}}}};
  j["decoder"] = metaspace();
  j["model"] = {{"type", "Unigram"}, {"unk_id", 2}, {"vocab", vocab}, {"byte_fallback", false}};
  return j;
}

void write_word_unigram_tokenizer(const std::vector<std::string>& words, const std::string& dir, int64_t max_length) {
  if (words.empty()) throw Error(cat("tokenizer: ", dir, ": no words to make a vocabulary of"));
  std::filesystem::create_directories(dir);
  st::write_file_atomic(dir + "/tokenizer.json", word_unigram_tokenizer_json(words).dump(2));
  const nlohmann::json config = {{"tokenizer_class", "T5Tokenizer"}, {"model_max_length", max_length},
                                 {"pad_token", "<pad>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"},
                                 {"extra_ids", 0}, {"additional_special_tokens", nlohmann::json::array()}};
  st::write_file_atomic(dir + "/tokenizer_config.json", config.dump(2));
  st::write_file_atomic(dir + "/special_tokens_map.json",
                        nlohmann::json({{"pad_token", "<pad>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}}).dump(2));
}

}  // namespace mm::data
