// tokenizer.json loading and the encode/decode pipeline (tokenizers/src/tokenizer/mod.rs).
#include "mindspeed_mm/data/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <unordered_map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/data/tokenizer/added_vocabulary.h"
#include "mindspeed_mm/data/tokenizer/components.h"
#include "mindspeed_mm/data/tokenizer/json_fields.h"
#include "mindspeed_mm/data/tokenizer/model.h"
#include "mindspeed_mm/core/parallel_for.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"
#include "mindspeed_mm/core/strings.h"

namespace mm::data {

using nlohmann::json;

// Stages are shared (immutable) so that with_bos_eos can copy a tokenizer cheaply.
struct Tokenizer::Impl {
  std::shared_ptr<const Normalizer> normalizer;
  std::shared_ptr<const PreTokenizer> pre_tokenizer;
  std::shared_ptr<const Model> model;
  std::shared_ptr<const PostProcessor> post_processor;
  std::shared_ptr<const Decoder> decoder;
  AddedVocabulary added;
  // tokenizer.json's "truncation" and "padding" (HF applies both inside encode).
  struct Truncation {
    size_t max_length = 0;
    bool left = false;
  };
  struct Padding {
    std::optional<size_t> fixed;  // else BatchLongest
    std::optional<size_t> multiple;
    bool left = false;
    int64_t pad_id = 0;
  };
  std::optional<Truncation> truncation;
  std::optional<Padding> padding;
};

namespace {

std::string read_text(const std::string& path, const char* what) {
  auto bytes = read_file_bytes(path);
  if (!bytes) throw Error(cat(path, ": cannot open ", what));
  return std::move(*bytes);
}

json parse_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(cat(source, ": not valid JSON (", json_error_text(e.what()), ")"));
  }
}

// Right or Left, as HF writes the direction enums.
bool is_left(const json& j, const char* key, const std::string& source, const char* section) {
  std::string d = json_fields::string_or(j, key, "Right");
  if (d != "Right" && d != "Left") throw Error(cat(source, ": ", section, " direction '", d, "' is not Right or Left"));
  return d == "Left";
}

void parse_truncation_padding(const json& j, const std::string& source, Tokenizer::Impl& impl) {
  if (j.contains("truncation") && !j["truncation"].is_null()) {
    const json& t = j["truncation"];
    Tokenizer::Impl::Truncation tr;
    tr.max_length = json_fields::integer<size_t>(t.at("max_length"), source, "max_length");
    tr.left = is_left(t, "direction", source, "truncation");
    size_t stride = json_fields::integer_or(t, "stride", size_t{0}, source);
    size_t room = impl.post_processor ? impl.post_processor->added_tokens() : 0;
    if (tr.max_length < room)
      throw Error(cat(source, ": truncation max_length ", tr.max_length, " leaves no room for the ", room,
                      " special tokens the post-processor adds"));
    if (tr.max_length > room && stride >= tr.max_length - room)
      throw Error(cat(source, ": truncation stride ", stride, " must be below max_length minus the special tokens (",
                      tr.max_length - room, ")"));
    impl.truncation = tr;
  }
  if (j.contains("padding") && !j["padding"].is_null()) {
    const json& p = j["padding"];
    Tokenizer::Impl::Padding pd;
    const json& strategy = p.at("strategy");
    if (strategy.is_object() && strategy.contains("Fixed")) pd.fixed = json_fields::integer<size_t>(strategy["Fixed"], source, "Fixed");
    else if (!(strategy.is_string() && strategy.get<std::string>() == "BatchLongest"))
      throw Error(cat(source, ": padding strategy ", strategy.dump(), " is neither \"BatchLongest\" nor {\"Fixed\": n}"));
    if (p.contains("pad_to_multiple_of") && !p["pad_to_multiple_of"].is_null())
      pd.multiple = json_fields::integer<size_t>(p["pad_to_multiple_of"], source, "pad_to_multiple_of");
    pd.left = is_left(p, "direction", source, "padding");
    pd.pad_id = json_fields::integer_or(p, "pad_id", int64_t{0}, source);
    impl.padding = pd;
  }
}

// HF's pad_encodings: to `length` rounded up to pad_to_multiple_of, never shortening.
void pad_to(std::vector<int64_t>& ids, size_t length, const Tokenizer::Impl::Padding& p) {
  if (p.multiple && *p.multiple > 0 && length % *p.multiple) length += *p.multiple - length % *p.multiple;
  if (ids.size() >= length) return;
  ids.insert(p.left ? ids.begin() : ids.end(), length - ids.size(), p.pad_id);
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
    // HF re-derives the ids (AddedVocabulary::add_tokens): a token already in the model's
    // vocabulary keeps the model's id, the others take ids from the model's vocabulary size
    // on, in file order; the "id" written in the file is only checked for presence. A
    // repeated content keeps its first id and takes the later flags.
    std::vector<AddedToken> tokens;
    std::unordered_map<std::string, size_t> seen;
    int64_t next_id = static_cast<int64_t>(impl->model->vocab_len());
    for (const auto& t : at) {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      json_fields::integer<int64_t>(t.at("id"), source, "id");
      a.special = t.value("special", false);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.single_word = t.value("single_word", false);
      a.normalized = t.value("normalized", !a.special);
      if (a.content.empty()) continue;  // HF ignores empty tokens
      auto it = seen.find(a.content);
      if (it != seen.end()) {
        a.id = tokens[it->second].id;
        tokens[it->second] = std::move(a);
        continue;
      }
      auto model_id = impl->model->token_to_id(a.content);
      a.id = model_id ? *model_id : next_id++;
      seen.emplace(a.content, tokens.size());
      tokens.push_back(std::move(a));
    }
    parse_truncation_padding(j, source, *impl);
    const Normalizer* n = impl->normalizer.get();
    impl->added = AddedVocabulary(std::move(tokens), [n](const std::string& s) { return n ? n->normalize(s) : s; });
  } catch (const json::exception& e) {
    throw Error(cat(source, ": unexpected structure (", json_error_text(e.what()), ")"));
  }
  // The ids the post-processor adds (a template's [CLS] / [SEP]) must be in the vocabulary: a
  // file may state any number, and an id past the embedding table fails only inside the model.
  if (impl->post_processor) {
    std::vector<int64_t> added;
    impl->post_processor->process(added, /*add_special_tokens=*/true);
    const int64_t bound = std::max(impl->model->id_bound(), impl->added.id_bound());
    for (const int64_t id : added)
      if (id < 0 || id >= bound)
        throw Error(cat(source, ": post_processor adds token id ", id, ", outside the vocabulary of ", bound));
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

std::string Tokenizer::bert_tokenizer_json(const std::string& vocab_txt, bool lowercase) {
  std::istringstream in(read_text(vocab_txt, "vocab.txt"));
  json vocab = json::object();
  std::string line;
  int64_t id = 0;
  for (; std::getline(in, line); ++id) {
    // HF's WordPiece::read_file: each line, trailing whitespace trimmed, is the token with
    // that line's number.
    line = unicode::to_valid_utf8(line);
    while (!line.empty()) {
      size_t p = line.size() - 1;
      while (p > 0 && (static_cast<unsigned char>(line[p]) & 0xC0) == 0x80) --p;
      if (!unicode::is_whitespace(unicode::decode_at(line, p))) break;
      line.erase(p);
    }
    vocab[line] = id;
  }
  if (id == 0) throw Error(cat(vocab_txt, ": empty vocab.txt"));
  json added = json::array();
  for (const char* tok : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})
    if (vocab.contains(tok))
      added.push_back({{"id", vocab[tok]}, {"content", tok}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
  if (!vocab.contains("[UNK]")) throw Error(cat(vocab_txt, ": has no [UNK] token"));
  json post = nullptr;
  if (vocab.contains("[CLS]") && vocab.contains("[SEP]"))
    post = {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                    {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}})},
            {"pair", json::array({{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                  {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}},
                                  {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 1}}}}})},
            {"special_tokens",
             {{"[CLS]", {{"id", "[CLS]"}, {"ids", {vocab["[CLS]"]}}, {"tokens", {"[CLS]"}}}},
              {"[SEP]", {{"id", "[SEP]"}, {"ids", {vocab["[SEP]"]}}, {"tokens", {"[SEP]"}}}}}}};
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer",
             {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
              {"strip_accents", nullptr}, {"lowercase", lowercase}}},
            {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
            {"post_processor", post},
            {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
            {"model",
             {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
              {"max_input_chars_per_word", 100}, {"vocab", vocab}}}};
  return j.dump();
}

Tokenizer Tokenizer::from_bert_vocab(const std::string& vocab_txt, bool lowercase) {
  return from_json_text(bert_tokenizer_json(vocab_txt, lowercase), vocab_txt);
}

Tokenizer Tokenizer::with_bos_eos(const std::optional<std::string>& bos, const std::optional<std::string>& eos) const {
  json single = json::array(), specials = json::object();
  auto special = [&](const std::string& tok) {
    auto id = token_to_id(tok);
    if (!id) throw Error(cat("tokenizer: special token '", tok, "' is not in the vocabulary"));
    single.push_back({{"SpecialToken", {{"id", tok}, {"type_id", 0}}}});
    specials[tok] = {{"id", tok}, {"ids", {*id}}, {"tokens", {tok}}};
  };
  if (bos) special(*bos);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (eos) special(*eos);
  auto impl = std::make_shared<Impl>(*impl_);
  impl->post_processor = make_post_processor(
      {{"type", "TemplateProcessing"}, {"single", single}, {"pair", json::array()}, {"special_tokens", specials}},
      "tokenizer_config.json");
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_gpt2_files(const std::string& vocab_json, const std::string& merges_txt) {
  return from_json_text(gpt2_tokenizer_json(vocab_json, merges_txt), vocab_json);
}

std::vector<int64_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& t = *impl_;
  std::string text = unicode::to_valid_utf8(input);
  std::vector<Segment> raw, segments;
  t.added.split(text, /*normalized_pass=*/false, raw, /*at_start=*/true);
  for (auto& seg : raw) {
    if (seg.id >= 0) {
      segments.push_back(std::move(seg));
      continue;
    }
    bool at_start = seg.at_start;
    std::string normalized = t.normalizer ? t.normalizer->apply(std::move(seg.text), at_start) : std::move(seg.text);
    t.added.split(normalized, /*normalized_pass=*/true, segments, at_start);
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Piece> words;
  for (auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    words.clear();
    if (t.pre_tokenizer) t.pre_tokenizer->split(Piece{std::move(seg.text), seg.at_start}, words);
    else words.push_back(Piece{std::move(seg.text), seg.at_start});
    for (const auto& w : words) t.model->tokenize(w.text, ids);
  }
  if (t.truncation) {
    size_t room = add_special_tokens && t.post_processor ? t.post_processor->added_tokens() : 0;
    size_t keep = t.truncation->max_length - room;
    if (ids.size() > keep) {
      if (t.truncation->left) ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(keep));
      else ids.resize(keep);
    }
  }
  if (t.post_processor) t.post_processor->process(ids, add_special_tokens);
  if (t.padding) pad_to(ids, t.padding->fixed.value_or(ids.size()), *t.padding);
  return ids;
}

std::vector<std::vector<int64_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts, bool add_special_tokens,
                                                          int num_threads) const {
  std::vector<std::vector<int64_t>> out(texts.size());
  parallel_for(texts.size(), num_threads, [&](size_t i) { out[i] = encode(texts[i], add_special_tokens); });
  if (impl_->padding && !out.empty()) {  // BatchLongest: every sequence to the batch's longest
    size_t longest = 0;
    for (const auto& ids : out) longest = std::max(longest, ids.size());
    for (auto& ids : out) pad_to(ids, impl_->padding->fixed.value_or(longest), *impl_->padding);
  }
  return out;
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
  if (const std::string* a = impl_->added.text_of(id)) return *a;
  if (const std::string* s = impl_->model->id_to_token(id)) return *s;
  throw Error(cat("tokenizer: id ", id, " is not in the vocabulary (size ", vocab_size(), ")"));
}

}  // namespace mm::data
