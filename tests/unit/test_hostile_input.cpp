// One regression test per fuzzer finding (tests/fuzz/, inputs kept in tests/fuzz/regressions/),
// run in the ordinary build: each input that once escaped as a foreign exception, a crash or a
// silently trusted corrupt file is now an mm::Error naming the file, or is handled.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/record_index.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_model.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_tokenizer.h"
#include "mindspeed_mm/data/tokenizer/tokenizer.h"
#include "mindspeed_mm/data/tokenizer/tokenizer_config.h"
#include "run_command.h"

namespace fs = std::filesystem;

namespace {

std::string regression(const std::string& harness, const std::string& name) {
  return mm::test::read_file(std::string(MM_SOURCE_DIR) + "/tests/fuzz/regressions/" + harness + "/" + name);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const mm::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// fuzz_tokenizer_json: a number too large for a double is nlohmann's out_of_range (406), not a
// parse_error; the catch took only parse errors, so it escaped as "[json.exception...]".
TEST(HostileInput, JsonNumberOverflowIsAnErrorNamingTheFile) {
  const std::string text = regression("fuzz_tokenizer_json", "number_overflow.json");
  const std::string e = error_of([&] { mm::data::Tokenizer::from_json_text(text, "fuzz/tokenizer.json"); });
  EXPECT_EQ(e.rfind("fuzz/tokenizer.json: not valid JSON (number overflow parsing '1000", 0), 0u) << e;
  EXPECT_EQ(e.find("[json.exception"), std::string::npos) << e;
  EXPECT_LE(e.size(), 260u) << "the number is not echoed whole: " << e;

  // The same for tokenizer_config.json and a checkpoint's JSON files.
  const std::string dir = mm::test::fresh_dir("hostile_json");
  mm::test::write_file(dir + "/tokenizer_config.json", R"({"model_max_length": 1e999})");
  const std::string c = error_of([&] { mm::data::load_tokenizer_config(dir); });
  EXPECT_NE(c.find(dir + "/tokenizer_config.json: not valid JSON"), std::string::npos) << c;
  mm::test::write_file(dir + "/config.json", R"({"hidden_size": 1e999})");
  const std::string k = error_of([&] { mm::checkpoint::read_hf_config(dir); });
  EXPECT_NE(k.find(dir + "/config.json' is not valid JSON"), std::string::npos) << k;
}

// fuzz_sentencepiece: a model with an empty piece made SentencePiece's trie throw
// Darts::Exception ("zero-length key") out of the loader. Our own reader refuses it first.
TEST(HostileInput, SentencePieceModelWithAnEmptyPieceIsRefused) {
  const std::string bytes = regression("fuzz_sentencepiece", "empty_piece.model");
  const std::string e = error_of([&] { mm::data::SentencePieceModel::parse(bytes, "x.model"); });
  EXPECT_NE(e.find("x.model: not a SentencePiece model"), std::string::npos) << e;
  const std::string dir = mm::test::fresh_dir("hostile_spm");
  mm::test::write_file(dir + "/tokenizer.model", bytes);
  const std::string t = error_of([&] { mm::data::SentencePieceTokenizer::from_file(dir + "/tokenizer.model"); });
  EXPECT_NE(t.find(dir + "/tokenizer.model: not a SentencePiece model"), std::string::npos) << t;
}

// fuzz_record_index_cache: a cache whose header still matched the data file but whose counts or
// offsets were changed was trusted: wrong records, or a vector sized by a count from the file.
// The cache now carries a checksum of its body, and every count and offset is checked against
// the file before anything is allocated; a rejected cache is rebuilt and the records are right.
TEST(HostileInput, CorruptRecordIndexCacheIsRebuiltNotTrusted) {
  const std::string dir = mm::test::fresh_dir("hostile_mmidx");
  const std::string path = dir + "/data.jsonl";
  std::string text;
  for (int i = 0; i < 5; ++i)
    text += R"({"messages": [{"role": "user", "content": "Q)" + std::to_string(i) +
            R"("}, {"role": "assistant", "content": "A)" + std::to_string(i) + "\"}]}\n";
  mm::test::write_file(path, text);
  const mm::data::MllmFile whole = mm::data::read_mllm_file(path);
  { const mm::data::MllmRecordIndex first(path); }
  const std::string genuine = mm::test::read_file(path + ".mmidx");
  ASSERT_GT(genuine.size(), 72u);
  {
    const mm::data::MllmRecordIndex again(path);
    EXPECT_TRUE(again.from_cache());
  }
  auto check = [&](const std::string& cache, const std::string& what) {
    SCOPED_TRACE(what);
    mm::test::write_file(path + ".mmidx", cache);
    const mm::data::MllmRecordIndex index(path);
    EXPECT_FALSE(index.from_cache());
    ASSERT_EQ(index.size(), static_cast<int64_t>(whole.records.size()));
    for (int64_t i = 0; i < index.size(); ++i)
      EXPECT_EQ(index.record(i).messages.back().content, whole.records[static_cast<size_t>(i)].messages.back().content);
  };
  // The fuzzer's input (a version-1 cache with a changed count), then version-2 caches with one
  // offset moved, a huge record count, and the body cut short, each keeping the header's fields.
  check(regression("fuzz_record_index_cache", "v01_changed_count.bin"), "the fuzzer's input");
  std::string moved = genuine;
  moved[72] = static_cast<char>(moved[72] + 1);  // record 0's offset
  check(moved, "an offset moved");
  std::string huge = genuine;
  const uint64_t count = uint64_t(1) << 60;
  std::memcpy(huge.data() + 8 + 32, &count, 8);  // Header::good
  check(huge, "a count of 2^60");
  check(genuine.substr(0, genuine.size() - 3), "truncated");
}

// Strings from a file never reach a message raw: control bytes become '?', and the text is cut.
TEST(HostileInput, PrintableKeepsMessagesOnOneLine) {
  EXPECT_EQ(mm::printable("ab\ncd\x01\xff"), "ab?cd??");
  EXPECT_EQ(mm::printable(std::string(100, 'x'), 10), "xxxxxxxxxx...");
  EXPECT_EQ(mm::json_error_text("[json.exception.parse_error.101] parse error at line 1: x"),
            "parse error at line 1: x");
}
