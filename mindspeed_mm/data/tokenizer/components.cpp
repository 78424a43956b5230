// Normalizers, pre-tokenizers, post-processors and decoders, each ported from the matching
// file of tokenizers/src/{normalizers,pre_tokenizers,processors,decoders}.
#include "mindspeed_mm/data/tokenizer/components.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/unicode_regex.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

using nlohmann::json;

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes take
// the code points 256, 257, ... in byte order.
struct ByteLevelTable {
  std::array<std::string, 256> chars;
  std::unordered_map<char32_t, unsigned char> bytes;
  ByteLevelTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      unicode::append_utf8(chars[b], cp);
      bytes[cp] = static_cast<unsigned char>(b);
    }
  }
};
const ByteLevelTable& table() {
  static const ByteLevelTable t;
  return t;
}

[[noreturn]] void unsupported(const std::string& source, const char* stage, const json& j) {
  std::string type = j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                                  : j.dump();
  throw Error(cat(source, ": ", stage, " type '", type, "' is not supported yet"));
}

std::string type_of(const json& j, const std::string& source, const char* stage) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw Error(cat(source, ": ", stage, " must be an object with a string \"type\" (got ", j.dump().substr(0, 80), ")"));
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->get<bool>();
}

const json& member(const json& j, const char* key, const std::string& source, const char* stage) {
  auto it = j.find(key);
  if (it == j.end()) throw Error(cat(source, ": ", stage, " '", j.value("type", ""), "' has no \"", key, "\""));
  return *it;
}

// ---- normalizers ----

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm f) : form_(f) {}
  std::string normalize(std::string text) const override { return unicode::normalize(text, form_); }

 private:
  unicode::NormalForm form_;
};

class NormalizerSequence : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> stages;
  std::string normalize(std::string text) const override {
    for (const auto& s : stages) text = s->normalize(std::move(text));
    return text;
  }
};

// ---- pre-tokenizers ----

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// NormalizedString::split: matches and the gaps between them, grouped by `behavior`.
void split_by_matches(const std::string& text, const std::vector<std::pair<size_t, size_t>>& found, bool invert,
                      SplitBehavior behavior, std::vector<std::string>& out) {
  struct Part {
    size_t b, e;
    bool is_match;
  };
  std::vector<Part> parts;
  if (text.empty()) {
    parts.push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (auto [s, e] : found) {
      if (prev != s) parts.push_back({prev, s, invert});
      parts.push_back({s, e, !invert});
      prev = e;
    }
    if (prev != text.size()) parts.push_back({prev, text.size(), invert});
  }
  std::vector<std::pair<size_t, size_t>> keep;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const auto& p : parts) keep.emplace_back(p.b, p.e);
      break;
    case SplitBehavior::Removed:
      for (const auto& p : parts)
        if (!p.is_match) keep.emplace_back(p.b, p.e);
      break;
    case SplitBehavior::Contiguous: {
      bool previous = false;
      for (const auto& p : parts) {
        if (p.is_match == previous && !keep.empty()) keep.back().second = p.e;
        else keep.emplace_back(p.b, p.e);
        previous = p.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool previous = false;
      for (const auto& p : parts) {
        if (p.is_match && !previous && !keep.empty()) keep.back().second = p.e;
        else keep.emplace_back(p.b, p.e);
        previous = p.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous && !keep.empty()) keep.back().first = it->b;
        else keep.emplace_back(it->b, it->e);
        previous = it->is_match;
      }
      std::reverse(keep.begin(), keep.end());
      break;
    }
  }
  for (auto [b, e] : keep)
    if (e > b) out.push_back(text.substr(b, e - b));
}

// Literal search for Split's {"String": ...} pattern (HF escapes it into a regex).
std::vector<std::pair<size_t, size_t>> find_literal(const std::string& text, const std::string& lit) {
  std::vector<std::pair<size_t, size_t>> found;
  if (lit.empty()) return found;
  for (size_t pos = text.find(lit); pos != std::string::npos; pos = text.find(lit, pos + lit.size()))
    found.emplace_back(pos, pos + lit.size());
  return found;
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  std::unique_ptr<UnicodeRegex> regex;  // or a literal
  std::string literal;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  void split(const std::string& piece, std::vector<std::string>& out) const override {
    auto found = regex ? regex->find_all(piece) : find_literal(piece, literal);
    split_by_matches(piece, found, invert, behavior, out);
  }
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  bool add_prefix_space = true;
  bool use_regex = true;
  void split(const std::string& piece, std::vector<std::string>& out) const override {
    static const UnicodeRegex gpt2(kGpt2Pattern);
    std::string text = add_prefix_space && (piece.empty() || piece[0] != ' ') ? " " + piece : piece;
    std::vector<std::string> words;
    if (use_regex) split_by_matches(text, gpt2.find_all(text), false, SplitBehavior::Isolated, words);
    else if (!text.empty()) words.push_back(std::move(text));
    const auto& t = table();
    for (const auto& w : words) {
      std::string mapped;
      mapped.reserve(w.size() * 2);
      for (unsigned char b : w) mapped += t.chars[b];
      out.push_back(std::move(mapped));
    }
  }
};

class PreTokenizerSequence : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> stages;
  void split(const std::string& piece, std::vector<std::string>& out) const override {
    std::vector<std::string> cur{piece}, next;
    for (const auto& s : stages) {
      next.clear();
      for (const auto& p : cur) s->split(p, next);
      cur.swap(next);
    }
    for (auto& p : cur)
      if (!p.empty()) out.push_back(std::move(p));
  }
};

// ---- post-processors ----

class NoOpPostProcessor : public PostProcessor {  // ByteLevel: only trims offsets, which we do not track
 public:
  void process(std::vector<int64_t>&, bool) const override {}
};

class TemplatePostProcessor : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence;
    std::vector<int64_t> ids;  // for a special token
  };
  std::vector<Piece> single;
  void process(std::vector<int64_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int64_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& p : single) {
      if (p.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), p.ids.begin(), p.ids.end());
    }
    ids.swap(out);
  }
};

class PostProcessorSequence : public PostProcessor {
 public:
  std::vector<std::unique_ptr<PostProcessor>> stages;
  void process(std::vector<int64_t>& ids, bool add_special_tokens) const override {
    for (const auto& s : stages) s->process(ids, add_special_tokens);
  }
};

// ---- decoders ----

class ByteLevelDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    const auto& bytes = table().bytes;
    std::string raw;
    for (const auto& t : tokens) {
      // A token with any character outside the byte alphabet is taken as its own UTF-8 bytes.
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        auto it = bytes.find(unicode::decode_at(t, i));
        if (it == bytes.end()) all = false;
        else mapped += static_cast<char>(it->second);
        i += unicode::char_len(t, i);
      }
      raw += all ? mapped : t;
    }
    return {unicode::to_valid_utf8(raw)};
  }
};

class DecoderSequence : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> stages;
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& s : stages) tokens = s->decode_chain(std::move(tokens));
    return tokens;
  }
};

}  // namespace

const std::string& byte_level_char(unsigned char b) { return table().chars[b]; }

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  std::string type = type_of(j, source, "normalizer");
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKD);
  if (type == "Sequence") {
    auto seq = std::make_unique<NormalizerSequence>();
    for (const auto& s : member(j, "normalizers", source, "normalizer")) seq->stages.push_back(make_normalizer(s, source));
    return seq;
  }
  unsupported(source, "normalizer", j);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  std::string type = type_of(j, source, "pre_tokenizer");
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = flag(j, "add_prefix_space", true);
    p->use_regex = flag(j, "use_regex", true);
    return p;
  }
  if (type == "Split") {
    auto p = std::make_unique<SplitPreTokenizer>();
    const json& pat = member(j, "pattern", source, "pre_tokenizer");
    if (pat.contains("Regex")) p->regex = std::make_unique<UnicodeRegex>(pat["Regex"].get<std::string>());
    else if (pat.contains("String")) p->literal = pat["String"].get<std::string>();
    else throw Error(cat(source, ": Split pattern must be {\"Regex\": ...} or {\"String\": ...} (got ", pat.dump(), ")"));
    std::string b = member(j, "behavior", source, "pre_tokenizer").get<std::string>();
    static const std::unordered_map<std::string, SplitBehavior> kBehaviors = {
        {"Removed", SplitBehavior::Removed},
        {"Isolated", SplitBehavior::Isolated},
        {"MergedWithPrevious", SplitBehavior::MergedWithPrevious},
        {"MergedWithNext", SplitBehavior::MergedWithNext},
        {"Contiguous", SplitBehavior::Contiguous}};
    auto it = kBehaviors.find(b);
    MM_CHECK(it != kBehaviors.end(), source, ": Split behavior '", b, "' is not one of Removed, Isolated, ",
             "MergedWithPrevious, MergedWithNext, Contiguous");
    p->behavior = it->second;
    p->invert = flag(j, "invert", false);
    return p;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<PreTokenizerSequence>();
    for (const auto& s : member(j, "pretokenizers", source, "pre_tokenizer"))
      seq->stages.push_back(make_pre_tokenizer(s, source));
    return seq;
  }
  unsupported(source, "pre_tokenizer", j);
}

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  std::string type = type_of(j, source, "post_processor");
  if (type == "ByteLevel") return std::make_unique<NoOpPostProcessor>();
  if (type == "TemplateProcessing") {
    auto p = std::make_unique<TemplatePostProcessor>();
    const json& specials = member(j, "special_tokens", source, "post_processor");
    for (const auto& piece : member(j, "single", source, "post_processor")) {
      if (piece.contains("Sequence")) {
        p->single.push_back({true, {}});
      } else if (piece.contains("SpecialToken")) {
        std::string name = piece["SpecialToken"].at("id").get<std::string>();
        MM_CHECK(specials.contains(name), source, ": TemplateProcessing uses special token '", name,
                 "' missing from its special_tokens");
        p->single.push_back({false, specials[name].at("ids").get<std::vector<int64_t>>()});
      } else {
        throw Error(cat(source, ": TemplateProcessing piece ", piece.dump(), " is neither Sequence nor SpecialToken"));
      }
    }
    return p;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<PostProcessorSequence>();
    for (const auto& s : member(j, "processors", source, "post_processor"))
      seq->stages.push_back(make_post_processor(s, source));
    return seq;
  }
  unsupported(source, "post_processor", j);
}

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  std::string type = type_of(j, source, "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Sequence") {
    auto seq = std::make_unique<DecoderSequence>();
    for (const auto& s : member(j, "decoders", source, "decoder")) seq->stages.push_back(make_decoder(s, source));
    return seq;
  }
  unsupported(source, "decoder", j);
}

}  // namespace mm::data
