// Decoders, each ported from tokenizers/src/decoders/*.rs (Metaspace's and Replace's decoders
// live beside their pre-tokenizer and normalizer there).
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/tokenizer/components.h"
#include "mindspeed_mm/data/tokenizer/json_fields.h"
#include "mindspeed_mm/data/tokenizer/text_split.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

using nlohmann::json;
using namespace json_fields;

namespace {

// Replaces every occurrence of `from` by `to` (Rust's str::replace).
std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty() || s.find(from) == std::string::npos) return s;
  std::string out;
  size_t prev = 0;
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, prev)) {
    out.append(s, prev, pos - prev);
    out += to;
    prev = pos + from.size();
  }
  out.append(s, prev, std::string::npos);
  return out;
}

// wordpiece::cleanup: the spaces a WordPiece join leaves before punctuation and contractions.
std::string cleanup(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},     {" !", "!"},           {" ,", ","},     {" ' ", "'"},    {" n't", "n't"},
      {" 'm", "'m"},   {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) s = replace_all(s, from, to);
  return s;
}

class ByteLevelDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string raw;
    for (const auto& t : tokens) {
      // A token with any character outside the byte alphabet is taken as its own UTF-8 bytes.
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        int b = byte_level_byte(unicode::decode_at(t, i));
        if (b < 0) all = false;
        else mapped += static_cast<char>(b);
        i += unicode::char_len(t, i);
      }
      raw += all ? mapped : t;
    }
    return {unicode::to_valid_utf8(raw)};
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceOptions o;
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string& t = tokens[i];
      if (t.find(o.replacement) == std::string::npos) continue;
      bool drop = i == 0 && o.prepend != MetaspaceOptions::Prepend::Never;
      tokens[i] = replace_all(t, o.replacement, drop ? "" : " ");
    }
    return tokens;
  }
};

class WordPieceDecoder : public Decoder {
 public:
  std::string prefix = "##";
  bool cleanup_text = true;
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (t.compare(0, prefix.size(), prefix) == 0) t.erase(0, prefix.size());
        else t = " " + t;
      }
      if (cleanup_text) t = cleanup(std::move(t));
    }
    return tokens;
  }
};

// Runs of <0xNN> tokens become the text of their bytes, or one U+FFFD per byte when the
// bytes are not valid UTF-8.
class ByteFallbackDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (unicode::is_valid_utf8(bytes)) out.push_back(bytes);
      else
        for (size_t k = 0; k < bytes.size(); ++k) out.push_back("\xEF\xBF\xBD");
      bytes.clear();
    };
    for (auto& t : tokens) {
      int byte = parse_byte(t);
      if (byte >= 0) {
        bytes += static_cast<char>(byte);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_byte(const std::string& t) {  // "<0xNN>", as u8::from_str_radix(.., 16)
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int h = hex(t[3]), l = hex(t[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

// Strip: up to `start` leading and `stop` trailing `content` characters of each token.
class StripDecoder : public Decoder {
 public:
  char32_t content = ' ';
  size_t start = 0, stop = 0;
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      std::vector<size_t> at;  // char starts
      for (size_t i = 0; i < t.size(); i += unicode::char_len(t, i)) at.push_back(i);
      size_t n = at.size(), start_cut = 0, stop_cut = n;
      for (size_t i = 0; i < n && i < start; ++i) {
        if (unicode::decode_at(t, at[i]) != content) break;
        start_cut = i + 1;
      }
      for (size_t i = 0; i < stop && i < n; ++i) {
        size_t index = n - i - 1;
        if (unicode::decode_at(t, at[index]) != content) break;
        stop_cut = index;
      }
      if (start_cut >= stop_cut) {
        t.clear();
        continue;
      }
      size_t b = at[start_cut], e = stop_cut < n ? at[stop_cut] : t.size();
      t = t.substr(b, e - b);
    }
    return tokens;
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(TextPattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) t = pattern_.replace(t, content_);
    return tokens;
  }

 private:
  TextPattern pattern_;
  std::string content_;
};

// BPEDecoder: the end-of-word suffix becomes a space, except on the last token.
class BpeSuffixDecoder : public Decoder {
 public:
  std::string suffix = "</w>";
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = replace_all(tokens[i], suffix, i + 1 == tokens.size() ? "" : " ");
    return tokens;
  }
};

class CtcDecoder : public Decoder {
 public:
  std::string pad_token = "<pad>", word_delimiter_token = "|";
  bool cleanup_text = true;
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 && tokens[i] == tokens[i - 1]) continue;  // dedup consecutive repeats
      std::string r = replace_all(tokens[i], pad_token, "");
      if (cleanup_text) r = replace_all(cleanup(std::move(r)), word_delimiter_token, " ");
      if (!r.empty()) out.push_back(std::move(r));
    }
    return out;
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

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  std::string type = type_of(j, source, "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->o = parse_metaspace(j, source);
    return d;
  }
  if (type == "WordPiece") {
    auto d = std::make_unique<WordPieceDecoder>();
    d->prefix = string_or(j, "prefix", "##");
    d->cleanup_text = flag(j, "cleanup", true);
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    std::string c = member(j, "content", source, "decoder").get<std::string>();
    MM_CHECK(!c.empty() && unicode::char_len(c, 0) == c.size(), source, ": Strip decoder content '", c,
             "' must be one character");
    d->content = unicode::decode_at(c, 0);
    d->start = json_fields::integer<size_t>(member(j, "start", source, "decoder"), source, "start");
    d->stop = json_fields::integer<size_t>(member(j, "stop", source, "decoder"), source, "stop");
    return d;
  }
  if (type == "Replace")
    return std::make_unique<ReplaceDecoder>(
        TextPattern::parse(member(j, "pattern", source, "decoder"), source, "Replace pattern"),
        member(j, "content", source, "decoder").get<std::string>());
  if (type == "BPEDecoder") {
    auto d = std::make_unique<BpeSuffixDecoder>();
    d->suffix = string_or(j, "suffix", "</w>");
    return d;
  }
  if (type == "CTC") {
    auto d = std::make_unique<CtcDecoder>();
    d->pad_token = string_or(j, "pad_token", "<pad>");
    d->word_delimiter_token = string_or(j, "word_delimiter_token", "|");
    d->cleanup_text = flag(j, "cleanup", true);
    return d;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<DecoderSequence>();
    for (const auto& s : member(j, "decoders", source, "decoder")) seq->stages.push_back(make_decoder(s, source));
    return seq;
  }
  unsupported(source, "decoder", j);
}

}  // namespace mm::data
