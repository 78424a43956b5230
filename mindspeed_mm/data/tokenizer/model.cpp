// make_model: the tokenizer.json "model" object to a Model.
#include "mindspeed_mm/data/tokenizer/model.h"

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/bpe_model.h"
#include "mindspeed_mm/data/tokenizer/json_fields.h"

namespace mm::data {

using nlohmann::json;

namespace {

std::optional<std::string> opt_string(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return it->get<std::string>();
}

std::unordered_map<std::string, int64_t> vocab_map(const json& m, const std::string& source, const std::string& type) {
  if (!m.contains("vocab") || !m["vocab"].is_object())
    throw Error(cat(source, ": ", type, " model has no \"vocab\" object"));
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(m["vocab"].size());
  for (const auto& [tok, id] : m["vocab"].items()) {
    if (!id.is_number_integer()) throw Error(cat(source, ": ", type, " vocab entry '", tok, "' has a non-integer id ", id.dump()));
    vocab.emplace(tok, id.get<int64_t>());
  }
  return vocab;
}

std::unique_ptr<Model> make_bpe(const json& m, const std::string& source) {
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    throw Error(cat(source, ": BPE dropout ", m["dropout"].dump(), " is not supported (training tokenizers use none)"));
  BpeOptions o;
  o.unk_token = opt_string(m, "unk_token");
  o.continuing_subword_prefix = opt_string(m, "continuing_subword_prefix");
  o.end_of_word_suffix = opt_string(m, "end_of_word_suffix");
  o.fuse_unk = m.value("fuse_unk", false);
  o.byte_fallback = m.value("byte_fallback", false);
  o.ignore_merges = m.value("ignore_merges", false);
  auto vocab = vocab_map(m, source, "BPE");
  std::vector<std::pair<std::string, std::string>> merges;
  if (m.contains("merges")) {
    const json& ms = m["merges"];
    merges.reserve(ms.size());
    for (size_t i = 0; i < ms.size(); ++i) {
      const json& e = ms[i];
      if (e.is_string()) {
        std::string s = e.get<std::string>();
        size_t sp = s.find(' ');
        MM_CHECK(sp != std::string::npos, source, ": merge ", i, " '", s, "' is not two tokens separated by a space");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2) {
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        throw Error(cat(source, ": merge ", i, " is neither \"a b\" nor [a, b] (got ", e.dump(), ")"));
      }
    }
  }
  try {
    return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(o));
  } catch (const Error& e) {
    throw Error(cat(source, ": ", e.what()));
  }
}

std::unique_ptr<Model> make_unigram(const json& m, const std::string& source) {
  if (!m.contains("vocab") || !m["vocab"].is_array()) throw Error(cat(source, ": Unigram model has no \"vocab\" list"));
  std::vector<std::pair<std::string, double>> pieces;
  pieces.reserve(m["vocab"].size());
  for (size_t i = 0; i < m["vocab"].size(); ++i) {
    const json& e = m["vocab"][i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      throw Error(cat(source, ": Unigram vocab entry ", i, " must be [piece, score] (got ", e.dump().substr(0, 80), ")"));
    pieces.emplace_back(e[0].get<std::string>(), e[1].get<double>());
  }
  std::optional<int64_t> unk_id;
  if (m.contains("unk_id") && !m["unk_id"].is_null()) unk_id = json_fields::integer<int64_t>(m["unk_id"], source, "unk_id");
  return make_unigram_model(std::move(pieces), unk_id, m.value("byte_fallback", false), source);
}

}  // namespace

std::unique_ptr<Model> make_model(const json& m, const std::string& source) {
  if (!m.is_object()) throw Error(cat(source, ": \"model\" is missing or not an object"));
  std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
  if (type.empty()) {  // files from before "type" was written: HF tells the model by its fields
    if (m.contains("merges")) type = "BPE";
    else if (m.contains("vocab") && m["vocab"].is_array()) type = "Unigram";
    else if (m.contains("continuing_subword_prefix") || m.contains("max_input_chars_per_word")) type = "WordPiece";
    else throw Error(cat(source, ": model has no \"type\""));
  }
  if (type == "BPE") return make_bpe(m, source);
  if (type == "Unigram") return make_unigram(m, source);
  if (type == "WordPiece") {
    return make_wordpiece_model(Vocab(vocab_map(m, source, type), source), json_fields::string_or(m, "unk_token", "[UNK]"),
                                json_fields::string_or(m, "continuing_subword_prefix", "##"),
                                json_fields::integer_or(m, "max_input_chars_per_word", size_t{100}, source));
  }
  if (type == "WordLevel")
    return make_wordlevel_model(Vocab(vocab_map(m, source, type), source), json_fields::string_or(m, "unk_token", "<unk>"));
  throw Error(cat(source, ": model type '", type, "' is not supported (BPE, WordPiece, WordLevel, Unigram are)"));
}

}  // namespace mm::data
