// PrecompiledCharsmap: SentencePiece's `precompiled_charsmap` (a Darts double-array trie from
// UTF-8 sequences to replacement strings, as built by spm_train's normalization rules such as
// nmt_nfkc), applied the way Hugging Face's Precompiled normalizer applies it: per extended
// grapheme cluster, then per character (tokenizers/src/normalizers/precompiled.rs and the
// spm_precompiled crate).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mm::data {

class PrecompiledCharsmap {
 public:
  // The raw blob: u32 little-endian trie size in bytes, the trie's u32 units, then the
  // NUL-separated replacement strings. mm::Error (naming `source`) on a malformed blob.
  PrecompiledCharsmap(std::string blob, const std::string& source);

  // The replacement of the shortest key that prefixes `chunk`, if any (HF's `transform`).
  std::optional<std::string_view> transform(std::string_view chunk) const;

  // HF's Precompiled::normalize: each grapheme shorter than 6 bytes is replaced whole when it
  // has a replacement, otherwise each of its characters is.
  std::string normalize(std::string_view text) const;

  bool empty() const { return trie_.empty(); }

  // What SentencePiece's own library assumes of a charsmap and never checks (its Darts lookups
  // index without bounds): a trie of whole 256-unit blocks in which every node reachable from
  // the root, and every child and replacement it leads to, lies inside the blob. mm::Error
  // naming `source` otherwise; a real nmt_nfkc charsmap passes.
  static void check_for_sentencepiece(const std::string& blob, const std::string& source);

 private:
  std::vector<uint32_t> trie_;
  std::string normalized_;
};

// Standard base64 (with padding), as serde's precompiled_charsmap field stores the blob.
// mm::Error naming `source` on invalid input.
std::string decode_base64(std::string_view text, const std::string& source);
std::string encode_base64(std::string_view bytes);

}  // namespace mm::data
