// ModelProto fields read here (sentencepiece_model.proto): 1 pieces {1 piece, 2 score, 3 type},
// 2 trainer_spec {3 model_type, 35 byte_fallback, 40 unk_id, 41 bos_id, 42 eos_id, 43 pad_id},
// 3 normalizer_spec {1 name, 2 precompiled_charsmap, 3 add_dummy_prefix,
// 4 remove_extra_whitespaces}. Every other field is skipped by its wire type.
#include "mindspeed_mm/data/tokenizer/sentencepiece_model.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"
#include "mindspeed_mm/data/tokenizer/precompiled_charsmap.h"
#include "mindspeed_mm/data/tokenizer/unicode_text.h"

namespace mm::data {

namespace {

using nlohmann::json;

// A protobuf message being read: fields one at a time, with bounds checks.
class WireReader {
 public:
  WireReader(std::string_view data, const std::string& source) : d_(data), source_(source) {}
  bool done() const { return pos_ >= d_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= d_.size()) fail("truncated varint");
      uint8_t b = static_cast<uint8_t>(d_[pos_++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("varint longer than 10 bytes");
  }
  // Reads a field key; returns the field number and sets wire_type.
  uint32_t key(int& wire_type) {
    uint64_t k = varint();
    wire_type = static_cast<int>(k & 7);
    return static_cast<uint32_t>(k >> 3);
  }
  std::string_view bytes() {
    uint64_t n = varint();
    if (n > d_.size() - pos_) fail("length-delimited field runs past the end");
    std::string_view s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  float fixed32_float() {
    if (d_.size() - pos_ < 4) fail("truncated fixed32");
    uint32_t u = 0;
    for (int k = 3; k >= 0; --k) u = (u << 8) | static_cast<uint8_t>(d_[pos_ + k]);
    pos_ += 4;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  void skip(int wire_type) {
    switch (wire_type) {
      case 0: varint(); return;
      case 1: advance(8); return;
      case 2: bytes(); return;
      case 5: advance(4); return;
      default: fail(cat("unsupported wire type ", wire_type));
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(cat(source_, ": not a SentencePiece model (", what, " at byte ", pos_, ")"));
  }

 private:
  void advance(size_t n) {
    if (d_.size() - pos_ < n) fail("truncated field");
    pos_ += n;
  }
  std::string_view d_;
  const std::string& source_;
  size_t pos_ = 0;
};

void expect(WireReader& r, int wire_type, int want, const char* field) {
  if (wire_type != want) r.fail(cat("field ", field, " has wire type ", wire_type));
}

}  // namespace

SentencePieceModel SentencePieceModel::parse(const std::string& data, const std::string& source) {
  SentencePieceModel m;
  WireReader r(data, source);
  while (!r.done()) {
    int wt = 0;
    uint32_t field = r.key(wt);
    if (field == 1) {
      expect(r, wt, 2, "pieces");
      WireReader p(r.bytes(), source);
      Piece piece;
      while (!p.done()) {
        int pwt = 0;
        uint32_t f = p.key(pwt);
        if (f == 1 && pwt == 2) piece.piece = std::string(p.bytes());
        else if (f == 2 && pwt == 5) piece.score = p.fixed32_float();
        else if (f == 3 && pwt == 0) piece.type = static_cast<PieceType>(p.varint());
        else p.skip(pwt);
      }
      if (!unicode::is_valid_utf8(piece.piece)) r.fail(cat("piece ", m.pieces.size(), " is not valid UTF-8"));
      m.pieces.push_back(std::move(piece));
    } else if (field == 2) {
      expect(r, wt, 2, "trainer_spec");
      WireReader t(r.bytes(), source);
      while (!t.done()) {
        int twt = 0;
        uint32_t f = t.key(twt);
        if (twt != 0) {
          t.skip(twt);
          continue;
        }
        uint64_t v = t.varint();
        switch (f) {
          case 3: m.model_type = static_cast<ModelType>(v); break;
          case 35: m.byte_fallback = v != 0; break;
          case 40: m.unk_id = static_cast<int32_t>(v); break;
          case 41: m.bos_id = static_cast<int32_t>(v); break;
          case 42: m.eos_id = static_cast<int32_t>(v); break;
          case 43: m.pad_id = static_cast<int32_t>(v); break;
          default: break;
        }
      }
    } else if (field == 5) {
      expect(r, wt, 2, "denormalizer_spec");
      WireReader n(r.bytes(), source);
      while (!n.done()) {
        int nwt = 0;
        const uint32_t f = n.key(nwt);
        if (f == 2 && nwt == 2) m.denormalizer_charsmap = std::string(n.bytes());
        else n.skip(nwt);
      }
    } else if (field == 3) {
      expect(r, wt, 2, "normalizer_spec");
      WireReader n(r.bytes(), source);
      while (!n.done()) {
        int nwt = 0;
        uint32_t f = n.key(nwt);
        if (f == 1 && nwt == 2) m.normalizer_name = std::string(n.bytes());
        else if (f == 2 && nwt == 2) m.precompiled_charsmap = std::string(n.bytes());
        else if (f == 3 && nwt == 0) m.add_dummy_prefix = n.varint() != 0;
        else if (f == 4 && nwt == 0) m.remove_extra_whitespaces = n.varint() != 0;
        else n.skip(nwt);
      }
    } else {
      r.skip(wt);
    }
  }
  if (m.pieces.empty()) throw Error(cat(source, ": not a SentencePiece model (no pieces)"));
  // SentencePiece's own loader keeps pieces in a trie of NUL-terminated keys and throws on an
  // empty one: a piece that is empty or holds a NUL byte is refused here (no trained model has one).
  for (size_t i = 0; i < m.pieces.size(); ++i)
    if (m.pieces[i].piece.empty() || m.pieces[i].piece.find('\0') != std::string::npos)
      throw Error(cat(source, ": not a SentencePiece model (piece ", i, " is empty or holds a NUL byte)"));
  return m;
}

SentencePieceModel SentencePieceModel::from_file(const std::string& path) {
  auto bytes = read_file_bytes(path);
  if (!bytes) throw Error(cat(path, ": cannot open SentencePiece model"));
  return parse(*bytes, path);
}

std::string SentencePieceModel::unigram_tokenizer_json(const std::string& source) const {
  if (model_type != ModelType::Unigram)
    throw Error(cat(source, ": only Unigram SentencePiece models convert to tokenizer.json here (this one is type ",
                    static_cast<int>(model_type), "); load BPE models through the SentencePiece library instead"));
  const std::string meta = "\xE2\x96\x81";
  json vocab = json::array(), added = json::array();
  for (size_t id = 0; id < pieces.size(); ++id) {
    const Piece& p = pieces[id];
    vocab.push_back(json::array({p.piece, p.score}));
    bool special = p.type == PieceType::Control || p.type == PieceType::Unknown;
    if (special || p.type == PieceType::UserDefined)
      added.push_back({{"id", id}, {"content", p.piece}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", special}});
  }
  json norms = json::array();
  if (!precompiled_charsmap.empty())
    norms.push_back({{"type", "Precompiled"}, {"precompiled_charsmap", encode_base64(precompiled_charsmap)}});
  norms.push_back({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}});
  norms.push_back({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", meta}});
  std::string scheme = add_dummy_prefix ? "always" : "never";
  json metaspace = {{"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", scheme}, {"split", true}};
  json decoder = metaspace;
  if (byte_fallback)
    decoder = {{"type", "Sequence"},
               {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}, metaspace})}};
  json post = nullptr;
  if (eos_id >= 0 && eos_id < static_cast<int32_t>(pieces.size())) {
    const std::string& eos = pieces[eos_id].piece;
    post = {{"type", "TemplateProcessing"},
            {"single", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                    {{"SpecialToken", {{"id", eos}, {"type_id", 0}}}}})},
            {"pair", json::array()},
            {"special_tokens", {{eos, {{"id", eos}, {"ids", {eos_id}}, {"tokens", {eos}}}}}}};
  }
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", {{"type", "Sequence"}, {"normalizers", norms}}},
            {"pre_tokenizer", metaspace},
            {"post_processor", post},
            {"decoder", decoder},
            {"model", {{"type", "Unigram"}, {"unk_id", unk_id}, {"vocab", vocab}, {"byte_fallback", byte_fallback}}}};
  return j.dump();
}

}  // namespace mm::data
