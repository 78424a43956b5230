// tokenizer.json loading and the encode/decode pipeline (tokenizers/src/tokenizer/mod.rs).
#include "mindspeed_mm/data/tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/added_vocabulary.h"
#include "mindspeed_mm/data/tokenizer/bpe_model.h"
#include "mindspeed_mm/data/tokenizer/components.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

using nlohmann::json;

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
};

namespace {

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(cat(path, ": cannot open ", what));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(cat(source, ": not valid JSON (", e.what(), ")"));
  }
}

std::optional<std::string> opt_string(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return it->get<std::string>();
}

std::unique_ptr<BpeModel> make_model(const json& m, const std::string& source) {
  if (!m.is_object()) throw Error(cat(source, ": \"model\" is missing or not an object"));
  std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
  if (type.empty()) throw Error(cat(source, ": model has no \"type\""));
  if (type != "BPE") throw Error(cat(source, ": model type '", type, "' is not supported yet"));
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    throw Error(cat(source, ": BPE dropout ", m["dropout"].dump(), " is not supported (training tokenizers use none)"));
  BpeOptions o;
  o.unk_token = opt_string(m, "unk_token");
  o.continuing_subword_prefix = opt_string(m, "continuing_subword_prefix");
  o.end_of_word_suffix = opt_string(m, "end_of_word_suffix");
  o.fuse_unk = m.value("fuse_unk", false);
  o.byte_fallback = m.value("byte_fallback", false);
  o.ignore_merges = m.value("ignore_merges", false);
  if (!m.contains("vocab") || !m["vocab"].is_object()) throw Error(cat(source, ": BPE model has no \"vocab\" object"));
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(m["vocab"].size());
  for (const auto& [tok, id] : m["vocab"].items()) vocab.emplace(tok, id.get<int64_t>());
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

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  return from_json_text(read_text(path, "tokenizer.json"), path);
}

Tokenizer Tokenizer::from_json_text(const std::string& text, const std::string& source) {
  json j = parse_json(text, source);
  if (!j.is_object()) throw Error(cat(source, ": top level must be a JSON object"));
  auto impl = std::make_shared<Impl>();
  try {
    if (!j.contains("model")) throw Error(cat(source, ": no \"model\" section"));
    impl->model = make_model(j["model"], source);
    auto section = [&](const char* key) -> const json& {
      static const json null_json;
      return j.contains(key) ? j[key] : null_json;
    };
    impl->normalizer = make_normalizer(section("normalizer"), source);
    impl->pre_tokenizer = make_pre_tokenizer(section("pre_tokenizer"), source);
    impl->post_processor = make_post_processor(section("post_processor"), source);
    impl->decoder = make_decoder(section("decoder"), source);
    const json& at = section("added_tokens");
    if (!at.is_null() && !at.is_array()) throw Error(cat(source, ": \"added_tokens\" must be a list"));
    std::vector<AddedToken> tokens;
    for (const auto& t : at) {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      // HF re-derives ids: a token already in the model's vocabulary keeps the model's id.
      auto model_id = impl->model->token_to_id(a.content);
      a.id = model_id ? *model_id : t.at("id").get<int64_t>();
      a.special = t.value("special", false);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.single_word = t.value("single_word", false);
      a.normalized = t.value("normalized", !a.special);
      tokens.push_back(std::move(a));
    }
    const Normalizer* n = impl->normalizer.get();
    impl->added = AddedVocabulary(std::move(tokens), [n](const std::string& s) { return n ? n->normalize(s) : s; });
  } catch (const json::exception& e) {
    throw Error(cat(source, ": unexpected structure (", e.what(), ")"));
  }
  return Tokenizer(std::move(impl));
}

std::string Tokenizer::gpt2_tokenizer_json(const std::string& vocab_json, const std::string& merges_txt) {
  json vocab = parse_json(read_text(vocab_json, "vocab.json"), vocab_json);
  if (!vocab.is_object()) throw Error(cat(vocab_json, ": must be a JSON object of token -> id"));
  std::istringstream in(read_text(merges_txt, "merges.txt"));
  json merges = json::array();
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("#version", 0) == 0) continue;
    if (line.empty() && in.peek() == EOF) break;  // a trailing newline
    size_t sp = line.find(' ');
    MM_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos, merges_txt, ":", n,
             ": a merge must be two tokens separated by one space (got '", line, "')");
    merges.push_back(line);
  }
  json added = json::array();
  if (vocab.contains("<|endoftext|>"))
    added.push_back({{"id", vocab["<|endoftext|>"]}, {"content", "<|endoftext|>"}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", byte_level},
            {"post_processor", byte_level},
            {"decoder", byte_level},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
              {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
              {"vocab", vocab}, {"merges", merges}}}};
  return j.dump();
}

Tokenizer Tokenizer::from_gpt2_files(const std::string& vocab_json, const std::string& merges_txt) {
  return from_json_text(gpt2_tokenizer_json(vocab_json, merges_txt), vocab_json);
}

std::vector<int64_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& t = *impl_;
  std::string text = unicode::to_valid_utf8(input);
  std::vector<Segment> raw, segments;
  t.added.split(text, /*normalized_pass=*/false, raw);
  for (auto& seg : raw) {
    if (seg.id >= 0) {
      segments.push_back(std::move(seg));
      continue;
    }
    std::string normalized = t.normalizer ? t.normalizer->normalize(std::move(seg.text)) : std::move(seg.text);
    t.added.split(normalized, /*normalized_pass=*/true, segments);
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string> words;
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    words.clear();
    if (t.pre_tokenizer) t.pre_tokenizer->split(seg.text, words);
    else words.push_back(seg.text);
    for (const auto& w : words) t.model->tokenize(w, ids);
  }
  if (t.post_processor) t.post_processor->process(ids, add_special_tokens);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    std::string tok = id_to_token(id);
    if (skip_special_tokens && t.added.is_special(tok)) continue;
    tokens.push_back(std::move(tok));
  }
  if (!t.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  std::string out;
  for (const auto& s : t.decoder->decode_chain(std::move(tokens))) out += s;
  return out;
}

int64_t Tokenizer::vocab_size() const { return std::max(impl_->model->id_bound(), impl_->added.id_bound()); }

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.token_to_id(token)) return id;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int64_t id) const {
  if (const AddedToken* a = impl_->added.by_id(id)) return a->content;
  if (const std::string* s = impl_->model->id_to_token(id)) return *s;
  throw Error(cat("tokenizer: id ", id, " is not in the vocabulary (size ", vocab_size(), ")"));
}

}  // namespace mm::data
