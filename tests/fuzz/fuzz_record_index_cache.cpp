// The record index's cache file (FILE.mmidx: offsets, lengths, skips, bad records, hashes): any
// bytes in place of the cache of a fixed, valid JSONL file. A cache that does not describe the
// file must be rebuilt, never trusted: the records read through it equal the file's.
// `fuzz_record_index_cache --write-seed DIR` writes the genuine cache as the seed.
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "fuzz_util.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/record_index.h"

namespace {

std::string jsonl_path() { return mm::fuzz::scratch() + "/fixed.jsonl"; }
constexpr const char* kMediaRoot = "/fuzz-media";
mm::data::MllmFile whole;

void write_fixed_file() {
  std::string text;
  for (int i = 0; i < 6; ++i) {
    if (i == 2) text += "{not json\n";
    text += R"({"messages": [{"role": "user", "content": "Question )" + std::to_string(i) +
            R"(?"}, {"role": "assistant", "content": "Answer )" + std::to_string(i) + "\"}]}\n";
  }
  mm::fuzz::write("fixed.jsonl", text);
  // The cache is keyed on the file's size, mtime and the settings (media root included): all fixed,
  // so the seed written by one process is genuine for every later one.
  std::filesystem::last_write_time(jsonl_path(), std::filesystem::file_time_type(std::chrono::seconds(1700000000)));
  whole = mm::data::read_mllm_file(jsonl_path(), {}, kMediaRoot);
  { const mm::data::MllmRecordIndex first(jsonl_path(), {}, kMediaRoot); }  // writes the genuine cache
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  write_fixed_file();
  for (int i = 1; i + 1 < *argc; ++i)
    if (std::strcmp((*argv)[i], "--write-seed") == 0) {
      std::filesystem::create_directories((*argv)[i + 1]);
      std::filesystem::copy_file(jsonl_path() + ".mmidx", std::string((*argv)[i + 1]) + "/genuine.mmidx",
                                 std::filesystem::copy_options::overwrite_existing);
      std::exit(0);
    }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Most inputs get a correct checksum (the last of the header's 8-byte fields: FNV-1a of the
  // body over 8-byte words, the tail byte by byte), so the fuzzer reaches the checks behind it;
  // inputs whose first byte is not the magic's 'M' keep theirs.
  std::string bytes(reinterpret_cast<const char*>(data), size);
  constexpr size_t kBody = 8 + 8 * 8;
  if (bytes.size() >= kBody && bytes[0] == 'M') {
    uint64_t h = 0xCBF29CE484222325ULL;
    size_t i = kBody;
    for (; i + 8 <= bytes.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, bytes.data() + i, 8);
      h = (h ^ w) * 0x100000001B3ULL;
    }
    for (; i < bytes.size(); ++i) h = (h ^ static_cast<unsigned char>(bytes[i])) * 0x100000001B3ULL;
    std::memcpy(bytes.data() + kBody - 8, &h, 8);
  }
  mm::fuzz::write("fixed.jsonl.mmidx", bytes);
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const mm::data::MllmRecordIndex index(jsonl_path(), {}, kMediaRoot);
    if (index.size() != static_cast<int64_t>(whole.records.size()) || index.bad().size() != whole.bad.size())
      __builtin_trap();
    for (int64_t i = 0; i < index.size(); ++i) {
      const mm::data::MllmRecord r = index.record(i);
      const mm::data::MllmRecord& w = whole.records[static_cast<size_t>(i)];
      if (r.messages.size() != w.messages.size() || r.messages.back().content != w.messages.back().content)
        __builtin_trap();
    }
    (void)index.validation_split(0.5, 1);
  });
  return 0;
}
