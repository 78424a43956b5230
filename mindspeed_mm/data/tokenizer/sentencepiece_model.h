// SentencePieceModel: what a SentencePiece `.model` file (a serialized ModelProto) holds, read
// with a small protobuf wire-format decoder (no libprotobuf), and its conversion to a Hugging
// Face tokenizer.json for Unigram models, the way transformers' SpmConverter writes one for
// T5/ALBERT-style tokenizers:
//   normalizer     Sequence[Precompiled(charsmap), Strip(right), Replace(" {2,}" -> "▁")]
//   pre_tokenizer  Metaspace("▁", prepend "always" when add_dummy_prefix, else "never")
//   model          Unigram(pieces and scores, unk_id, byte_fallback)
//   post_processor $A </s> (when the model has an eos piece)
//   decoder        Metaspace (with ByteFallback + Fuse first when byte_fallback)
// Control and unknown pieces become special added tokens, user-defined pieces plain ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mm::data {

struct SentencePieceModel {
  enum class PieceType { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };
  struct Piece {
    std::string piece;
    float score = 0.0f;
    PieceType type = PieceType::Normal;
  };
  enum class ModelType { Unigram = 1, Bpe = 2, Word = 3, Char = 4 };

  std::vector<Piece> pieces;
  ModelType model_type = ModelType::Unigram;
  bool byte_fallback = false;
  int32_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  std::string normalizer_name;
  std::string precompiled_charsmap;  // raw bytes
  std::string denormalizer_charsmap;  // raw bytes (denormalizer_spec's; most models have none)
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;

  // mm::Error naming the path for an unreadable file or a malformed ModelProto.
  static SentencePieceModel from_file(const std::string& path);
  static SentencePieceModel parse(const std::string& bytes, const std::string& source);

  // The tokenizer.json text described above; mm::Error for models other than Unigram.
  std::string unigram_tokenizer_json(const std::string& source) const;
};

}  // namespace mm::data
