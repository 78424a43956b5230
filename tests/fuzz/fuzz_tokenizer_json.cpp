// tokenizer.json: any bytes as Hugging Face's serialized tokenizer (normalizers, pre-tokenizers,
// BPE / WordPiece / WordLevel / Unigram models, post-processors, decoders, added tokens). What
// loads then encodes fixed texts and the input's own bytes, and decodes the ids back.
#include "fuzz_util.h"
#include "mindspeed_mm/data/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const mm::data::Tokenizer t = mm::data::Tokenizer::from_json_text(text, "fuzz/tokenizer.json");
    for (const std::string_view s : {std::string_view("Hello world! 你好，世界 <|im_start|>user\n\t  x"),
                                     std::string_view(text).substr(0, 256)}) {
      for (const bool special : {false, true}) {
        const std::vector<int64_t> ids = t.encode(s, special);
        for (const int64_t id : ids)
          if (id < 0 || id >= t.vocab_size()) __builtin_trap();
        (void)t.decode(ids, false);
        (void)t.decode(ids, true);
      }
    }
  });
  return 0;
}
