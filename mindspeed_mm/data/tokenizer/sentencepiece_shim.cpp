// libmm_sentencepiece.so: the function table of sentencepiece_shim.h over
// sentencepiece::SentencePieceProcessor. Built as its own module (see CMakeLists.txt), never
// part of mm_lib; sentencepiece_shim.h says why.
#include "mindspeed_mm/data/tokenizer/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

namespace {

using sentencepiece::SentencePieceProcessor;

const SentencePieceProcessor& sp(const void* p) { return *static_cast<const SentencePieceProcessor*>(p); }

bool report(const sentencepiece::util::Status& status, std::string* error) {
  if (!status.ok() && error) *error = status.ToString();
  return status.ok();
}

const mm::data::spm_shim::Api kApi = {
    mm::data::spm_shim::kApiVersion,
    []() -> void* { return new SentencePieceProcessor(); },
    [](void* p) { delete static_cast<SentencePieceProcessor*>(p); },
    [](void* p, const std::string& serialized, std::string* error) {
      return report(static_cast<SentencePieceProcessor*>(p)->LoadFromSerializedProto(serialized), error);
    },
    [](const void* p, std::string_view text, std::vector<int>* ids, std::string* error) {
      return report(sp(p).Encode(text, ids), error);
    },
    [](const void* p, const std::vector<int>& ids, std::string* text, std::string* error) {
      return report(sp(p).Decode(ids, text), error);
    },
    [](const void* p) { return sp(p).GetPieceSize(); },
    [](const void* p, std::string_view piece) { return sp(p).PieceToId(piece); },
    [](const void* p, int id) { return sp(p).IdToPiece(id); },
    [](const void* p) { return sp(p).unk_id(); },
    [](const void* p) { return sp(p).bos_id(); },
    [](const void* p) { return sp(p).eos_id(); },
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const mm::data::spm_shim::Api* mm_sentencepiece_api() {
  return &kApi;
}
