// SentencePiece .model files (a serialized ModelProto): any bytes through both readers, our own
// (the protobuf walk that turns the model into a Unigram tokenizer.json) and Debian's library
// behind the shim, then encode and decode.
#include "fuzz_util.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_model.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_tokenizer.h"
#include "mindspeed_mm/data/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string sample = "Hello world, this is a test. 你好";
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const mm::data::SentencePieceModel m = mm::data::SentencePieceModel::parse(bytes, "fuzz.model");
    const mm::data::Tokenizer t = mm::data::Tokenizer::from_json_text(m.unigram_tokenizer_json("fuzz.model"), "fuzz.model");
    (void)t.decode(t.encode(sample, true), true);
  });
  const std::string path = mm::fuzz::write("in.model", bytes);
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const auto t = mm::data::SentencePieceTokenizer::from_file(path);
    (void)t.decode(t.encode(sample, false, false));
  });
  return 0;
}
