// The reader fed through the writer and back, as `mm export` / `mm convert` do with a stranger's
// weights: whatever the reader accepts, the writer writes, and reading that gives the same names,
// dtypes, shapes, bytes and metadata.
#include <cstring>

#include "fuzz_util.h"
#include "mindspeed_mm/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = mm::fuzz::write("in.safetensors", {reinterpret_cast<const char*>(data), size});
  const std::string out = mm::fuzz::scratch() + "/out.safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> metadata;
  try {
    const mm::st::SafetensorsReader r(in);
    for (const std::string& k : r.keys()) tensors.emplace_back(k, r.get_copy(k));
    metadata = r.metadata();
  } catch (const mm::Error&) {
    return 0;  // refused: nothing to round-trip
  }
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    mm::st::save_safetensors(out, tensors, metadata);
    const mm::st::SafetensorsReader back(out);
    if (back.keys().size() != tensors.size() || back.metadata() != metadata) __builtin_trap();
    for (const auto& [name, t] : tensors) {
      const at::Tensor b = back.get(name);
      if (b.scalar_type() != t.scalar_type() || b.sizes() != t.sizes()) __builtin_trap();
      if (t.numel() > 0 &&
          std::memcmp(b.contiguous().data_ptr(), t.contiguous().data_ptr(), t.numel() * t.element_size()) != 0)
        __builtin_trap();
    }
  });
  return 0;
}
