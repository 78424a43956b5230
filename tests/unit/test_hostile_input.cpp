// One regression test per fuzzer finding (tests/fuzz/, inputs kept in tests/fuzz/regressions/),
// run in the ordinary build: each input that once escaped as a foreign exception, a crash or a
// silently trusted corrupt file is now an mm::Error naming the file, or is handled.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/checkpoint/train_checkpoint.h"
#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/record_index.h"
#include "mindspeed_mm/data/tokenizer/pretrained_tokenizer.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_model.h"
#include "mindspeed_mm/data/tokenizer/sentencepiece_tokenizer.h"
#include "mindspeed_mm/data/tokenizer/tokenizer.h"
#include "mindspeed_mm/data/tokenizer/tokenizer_config.h"
#include "mindspeed_mm/models/llava/llava.h"
#include "mindspeed_mm/models/qwen2vl/qwen2vl.h"
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

// Deep nesting: yaml-cpp's depth guard is reported as too deep (it read "bad file"); nlohmann's
// parser is not recursive, and a deeply nested tokenizer.json is an ordinary error.
TEST(HostileInput, DeepNestingIsAnErrorNotAStackOverflow) {
  const std::string yaml = "a: " + std::string(50000, '[') + std::string(50000, ']') + "\n";
  const std::string e = error_of([&] { mm::config::parse_config(yaml, "deep.yaml", {}, false); });
  EXPECT_NE(e.find("deep.yaml line 1: invalid YAML (nested too deeply"), std::string::npos) << e;
  const std::string json = "{\"model\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  const std::string t = error_of([&] { mm::data::Tokenizer::from_json_text(json, "deep/tokenizer.json"); });
  EXPECT_EQ(t.rfind("deep/tokenizer.json: ", 0), 0u) << t;
}

// A directory or an empty file given as a config is named as such (a directory read as an empty
// config of defaults; reading one threw libstdc++'s "basic_filebuf::underflow").
TEST(HostileInput, DirectoryOrEmptyConfigIsNamed) {
  const std::string dir = mm::test::fresh_dir("hostile_config");
  fs::create_directories(dir + "/c.yaml");
  EXPECT_EQ(error_of([&] { mm::config::load_config(dir + "/c.yaml", {}); }),
            "config: " + dir + "/c.yaml: is a directory, not a file");
  mm::test::write_file(dir + "/e.yaml", "\n  \n");
  EXPECT_EQ(error_of([&] { mm::config::load_config(dir + "/e.yaml", {}); }),
            "config: " + dir + "/e.yaml: empty (a config holds at least its data and model sections)");
}

// fuzz_tokenizer_json: a TemplateProcessing post-processor may name any id for [CLS] / [SEP];
// one past the vocabulary reached the model as an out-of-range index. Refused at load.
TEST(HostileInput, PostProcessorIdsOutsideTheVocabularyAreRefused) {
  const std::string text = regression("fuzz_tokenizer_json", "post_processor_id_outside_vocab.json");
  const std::string e = error_of([&] { mm::data::Tokenizer::from_json_text(text, "fuzz/tokenizer.json"); });
  EXPECT_EQ(e.rfind("fuzz/tokenizer.json: post_processor adds token id 9, outside the vocabulary of ", 0), 0u) << e;
}

// fuzz_model_config: a text_config holding its own "text_config" was copied into the object it
// was being read from: a use after free (AddressSanitizer). The nested object is copied first.
TEST(HostileInput, NestedTextConfigIsReadFromACopy) {
  const nlohmann::json j = nlohmann::json::parse(regression("fuzz_model_config", "nested_text_config.json"));
  for (const bool strict : {false, true})
    for (const bool q25 : {false, true}) {
      const std::string e = error_of([&] { mm::models::Qwen2VLConfig::from_json(j, "fuzz/config.json", strict, q25); });
      EXPECT_NE(e.find("fuzz/config.json"), std::string::npos) << e;
    }
}

// fuzz_sentencepiece: a charsmap whose trie is empty (or whose nodes point past its end) made
// SentencePiece's normalizer read out of bounds (SEGV in Normalizer::NormalizePrefix). The trie
// is walked and bounds-checked before the library sees it.
TEST(HostileInput, SentencePieceCharsmapTrieIsCheckedBeforeTheLibrary) {
  const std::string dir = mm::test::fresh_dir("hostile_spm_trie");
  mm::test::write_file(dir + "/t.model", regression("fuzz_sentencepiece", "empty_charsmap_trie.model"));
  const std::string e = error_of([&] { mm::data::SentencePieceTokenizer::from_file(dir + "/t.model"); });
  EXPECT_EQ(e, dir + "/t.model: precompiled_charsmap is not a usable trie (0 units, not whole 256-unit blocks)");
}

// fuzz_checkpoint_metadata: a metadata.json whose piece range ran past the shard's tensor reached
// libtorch's narrow() ("start (0) + length (2081) exceeds dimension size (2080)"). Ranges, boxes,
// file names and overlaps are checked when metadata.json is read; a piece's file must hold what
// metadata.json says it does.
TEST(HostileInput, CheckpointMetadataIsCheckedAgainstItsShards) {
  const std::string dir = mm::test::fresh_dir("hostile_metadata");
  // The same tiny run and two-shard resplit as tests/fuzz/make_seeds.sh (the input was found on it).
  mm::test::write_file(dir + "/tiny.yaml",
                       "data:\n  dataset: text\n  paths: [/usr/share/games/fortunes]\n  format: fortune\n  seq_len: 16\n"
                       "model:\n  id: qwen2\n  config: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, "
                       "num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 32, tie_word_embeddings: true}\n"
                       "training:\n  train_iters: 1\n  micro_batch_size: 2\n  optimizer: {id: adamw, lr: 1.0e-3}\n  save_interval: 1\n");
  const std::string mm = mm::test::mm_binary();
  ASSERT_EQ(mm::test::run_command(mm + " train " + dir + "/tiny.yaml training.save_dir=" + dir + "/ck").exit_code, 0);
  ASSERT_EQ(mm::test::run_command(mm + " convert resplit --in " + dir + "/ck --out " + dir + "/sharded --dp 2 --quiet").exit_code, 0);
  const std::string meta = dir + "/sharded/metadata.json";
  const std::string good = mm::test::read_file(meta);
  auto all_reads = [&] {
    const mm::checkpoint::CheckpointReader r(dir + "/sharded");
    for (const std::string kind : {"model", "optimizer"})
      for (const std::string& name : r.names(kind)) (void)r.read_full(kind, name);
  };
  EXPECT_EQ(error_of(all_reads), "");  // the genuine metadata reads

  mm::test::write_file(meta, regression("fuzz_checkpoint_metadata", "range_past_piece.json"));
  std::string e = error_of(all_reads);
  EXPECT_EQ(e.rfind("checkpoint: ", 0), 0u) << e;
  EXPECT_EQ(e.find("exceeds dimension size"), std::string::npos) << e;

  // Hand-made breakages of the genuine file, each refused with the tensor named.
  nlohmann::json j = nlohmann::json::parse(good);
  const std::string t = j["tensors"]["model"].begin().key();
  auto with = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json k = j;
    change(k["tensors"]["model"][t]);
    mm::test::write_file(meta, k.dump());
    return error_of(all_reads);
  };
  e = with([](nlohmann::json& x) { x["shards"][0]["file"] = "../../outside.safetensors"; });
  EXPECT_NE(e.find("is not a file name in the checkpoint folder"), std::string::npos) << e;
  e = with([](nlohmann::json& x) { x["shards"][1]["begin"] = 0; });
  EXPECT_NE(e.find("two pieces overlap"), std::string::npos) << e;
  e = with([](nlohmann::json& x) { x["shape"][0] = -3; });
  EXPECT_NE(e.find("shape is not a valid shape"), std::string::npos) << e;
  e = with([](nlohmann::json& x) { x["dtype"] = "F64"; });
  EXPECT_NE(e.find("metadata.json says"), std::string::npos) << e;
}

// fuzz_mllm_records: nlohmann's parser stops at a NUL byte as at the end of its input, so an
// array element "777<NUL>..." was a valid number to the record index (a bad record) but broke
// the whole-file reader's array (an error): the two readers disagreed. A NUL byte now makes a
// record not JSON in both, and an array holding one broken in both.
TEST(HostileInput, NulBytesAreNotJsonInEitherDatasetReader) {
  const std::string dir = mm::test::fresh_dir("hostile_nul");
  const std::string arr = dir + "/a.jsonl";
  mm::test::write_file(arr, regression("fuzz_mllm_records", "nul_inside_array.json"));
  const std::string whole = error_of([&] { mm::data::read_mllm_file(arr); });
  const std::string index = error_of([&] { mm::data::MllmRecordIndex i(arr); });
  EXPECT_EQ(whole, "data: '" + arr + "' starts with '[' but is not a valid JSON array");
  EXPECT_EQ(index, whole);
  const std::string lines = dir + "/l.jsonl";
  mm::test::write_file(lines, std::string(R"({"messages": [{"role": "user", "content": "Q"}, )") +
                                  R"({"role": "assistant", "content": "A"}]})" + std::string(1, '\0') + "junk\n");
  const mm::data::MllmFile f = mm::data::read_mllm_file(lines);
  const mm::data::MllmRecordIndex i(lines);
  EXPECT_EQ(f.records.size(), 0u);
  ASSERT_EQ(f.bad.size(), 1u);
  EXPECT_EQ(f.bad[0].reason, "not valid JSON");
  EXPECT_EQ(i.size(), 0);
  ASSERT_EQ(i.bad().size(), 1u);
  EXPECT_EQ(i.bad()[0].reason, "not valid JSON");
}

// fuzz_tokenizer_json (UBSan): nlohmann's get<size_t>() of a float such as 1e26 is an
// out-of-range float-to-integer cast, undefined behaviour. Integer fields are read checked.
TEST(HostileInput, FloatWhereAnIntegerBelongsIsAnError) {
  const std::string text = regression("fuzz_tokenizer_json", "float_where_integer.json");
  const std::string e = error_of([&] { mm::data::Tokenizer::from_json_text(text, "fuzz/tokenizer.json"); });
  EXPECT_NE(e.find("fuzz/tokenizer.json: \"max_input_chars_per_word\" must be an integer in range"), std::string::npos) << e;
}

// fuzz_model_config: text_config.model_type given as a number made nlohmann's value() throw its
// own type_error out of LlavaConfig::from_json. String members are read with hf_string.
TEST(HostileInput, NonStringModelTypeIsAConfigError) {
  const nlohmann::json j = nlohmann::json::parse(regression("fuzz_model_config", "text_model_type_number.json"));
  for (const bool strict : {false, true}) {
    const std::string e = error_of([&] { mm::models::LlavaConfig::from_json(j, "fuzz/config.json", strict); });
    EXPECT_NE(e.find("fuzz/config.json"), std::string::npos) << e;
  }
  nlohmann::json k = {{"text_config", {{"model_type", 7}}}};
  const std::string e = error_of([&] { mm::models::LlavaConfig::from_json(k, "c.json", false); });
  EXPECT_EQ(e, "config: text_config.model_type must be llama or qwen2 (got '(7)') in c.json");
}
