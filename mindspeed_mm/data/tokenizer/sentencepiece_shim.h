// The function table between SentencePieceTokenizer and libmm_sentencepiece.so, the one module
// that links Debian's libsentencepiece.
//
// Why a separate module: Debian's libsentencepiece.so.0 carries its own copy of protobuf-lite
// and exports its symbols. Linked into mm next to libtorch (which pulls in libprotobuf.so.32),
// one copy's symbols replace the other's and mm segfaults before main. So mm never links
// libsentencepiece; SentencePieceTokenizer dlopen()s this module with RTLD_LOCAL |
// RTLD_DEEPBIND, which makes libsentencepiece resolve protobuf to its own copy and keeps its
// symbols out of the global scope.
//
// Both sides are built from this tree with the same compiler and libstdc++, so std types may
// cross; only the entry point needs a C name for dlsym.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mm::data::spm_shim {

inline constexpr int kApiVersion = 1;
inline constexpr const char* kEntryPoint = "mm_sentencepiece_api";

// `processor` is an opaque sentencepiece::SentencePieceProcessor. Functions that can fail
// return false and set `error` to the library's status text.
struct Api {
  int version;
  void* (*create)();
  void (*destroy)(void* processor);
  bool (*load)(void* processor, const std::string& serialized_model, std::string* error);
  bool (*encode)(const void* processor, std::string_view text, std::vector<int>* ids, std::string* error);
  bool (*decode)(const void* processor, const std::vector<int>& ids, std::string* text, std::string* error);
  int (*piece_size)(const void* processor);
  int (*piece_to_id)(const void* processor, std::string_view piece);
  std::string (*id_to_piece)(const void* processor, int id);
  int (*unk_id)(const void* processor);
  int (*bos_id)(const void* processor);
  int (*eos_id)(const void* processor);
};

}  // namespace mm::data::spm_shim
