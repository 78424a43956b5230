// mllm / ShareGPT / LLaVA records: any bytes as a JSONL (or JSON array) file, read the two ways
// training reads it (read_mllm_file, and MllmRecordIndex: offsets kept, records parsed on demand,
// plus its cache on the second open) with the default field names or ShareGPT's
// (conversations/from/value/human/gpt; the first byte's low bit picks). Both must agree record
// for record. The same bytes as a LLaVA JSON file go through `mm data convert-llava`.
#include <filesystem>

#include "fuzz_util.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/record_index.h"

namespace {

bool same(const mm::data::MllmRecord& a, const mm::data::MllmRecord& b) {
  if (a.messages.size() != b.messages.size() || a.images != b.images || a.videos != b.videos ||
      a.answers != b.answers || a.options != b.options)
    return false;
  for (size_t i = 0; i < a.messages.size(); ++i)
    if (a.messages[i].role != b.messages[i].role || a.messages[i].content != b.messages[i].content) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  mm::data::MllmAttr attr;
  if (size > 0 && (data[0] & 1)) {
    attr.messages = "conversations", attr.role_tag = "from", attr.content_tag = "value";
    attr.user_tag = "human", attr.assistant_tag = "gpt";
  }
  const std::string path = mm::fuzz::write("in.jsonl", bytes);
  std::filesystem::remove(path + ".mmidx");
  mm::data::MllmFile whole;
  bool read = false;
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    whole = mm::data::read_mllm_file(path, attr);
    read = true;
  });
  for (int open = 0; open < 2; ++open) {  // the second open reads the cache the first wrote
    bool indexed = false;
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
      const mm::data::MllmRecordIndex index(path, attr);
      indexed = true;
      if (!read || index.size() != static_cast<int64_t>(whole.records.size()) || index.bad().size() != whole.bad.size())
        __builtin_trap();
      for (int64_t i = 0; i < index.size(); ++i)
        if (!same(index.record(i), whole.records[static_cast<size_t>(i)])) __builtin_trap();
      (void)index.validation_split(0.3, 7);
    });
    if (read != indexed) __builtin_trap();  // one reader refused what the other took
  }
  const std::string llava = mm::fuzz::write("in.json", bytes);
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS((void)mm::data::convert_llava(llava, mm::fuzz::scratch() + "/out.jsonl"));
  return 0;
}
