// Safetensors header and offsets: any bytes as a .safetensors file. The reader must accept the
// file only if every tensor lies inside the data section, tiles it without overlap, and its
// bytes match dtype x shape; then every tensor is read (zero-copy view and owned copy, first and
// last element touched).
#include "fuzz_util.h"
#include "mindspeed_mm/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mm::fuzz::write("in.safetensors", {reinterpret_cast<const char*>(data), size});
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const mm::st::SafetensorsReader r(path);
    for (const std::string& k : r.keys()) {
      const mm::st::TensorInfo& info = r.info(k);
      at::Tensor v = r.get(k);
      const at::Tensor c = r.get_copy(k);
      if (static_cast<uint64_t>(v.numel()) * v.element_size() != info.end - info.begin) __builtin_trap();
      if (v.numel() > 0) {
        v = v.flatten();
        (void)v[0].item();
        (void)v[v.numel() - 1].item();
        if (!at::equal(v.view(at::kByte), c.flatten().view(at::kByte))) __builtin_trap();
      }
    }
    (void)r.metadata();
  });
  return 0;
}
