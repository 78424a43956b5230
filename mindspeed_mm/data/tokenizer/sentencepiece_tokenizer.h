// SentencePieceTokenizer: a SentencePiece `.model` file (LLaMA 1/2, Mistral, Gemma's
// tokenizer.model), encoded and decoded by Debian's libsentencepiece, so ids are exactly those
// of `spm_encode --output_format=id` with the same model.
//
// Input that is not valid UTF-8 is not an error: like spm_encode, every byte that is not part
// of a valid UTF-8 sequence becomes U+FFFD before normalization, so the ids equal those of the
// text with that replacement made (with byte_fallback models, U+FFFD's pieces or its bytes).
//
// The library's headers stay out of this one (pimpl). Encode and decode are const and safe to
// call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mm::data {

class SentencePieceTokenizer {
 public:
  // Loads a serialized ModelProto. A missing, unreadable or corrupt file is an mm::Error that
  // names the path.
  static SentencePieceTokenizer from_file(const std::string& model_path);

  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;
  ~SentencePieceTokenizer();

  // add_bos / add_eos wrap the ids in bos_id() / eos_id(), as spm_encode's
  // --extra_options=bos:eos does; asking for one the model lacks (id -1) is an mm::Error.
  std::vector<int64_t> encode(std::string_view text, bool add_bos, bool add_eos) const;
  // As spm_decode: control tokens (bos, eos, pad) decode to nothing, unk to " ⁇ ", byte pieces
  // <0xNN> back to their bytes. Ids outside [0, vocab_size()) are an mm::Error.
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const;
  // -1 where the model disables the token.
  int64_t bos_id() const;
  int64_t eos_id() const;
  int64_t unk_id() const;
  // The id of a piece of the vocabulary ("▁the", "<0x0A>", "<s>"); nullopt when it has none.
  std::optional<int64_t> piece_to_id(std::string_view piece) const;

  const std::string& path() const;

 private:
  struct Impl;
  explicit SentencePieceTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mm::data
