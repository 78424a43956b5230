// Image decoding (PNG, JPEG, WebP, BMP, GIF by magic bytes) and the header probe the loader
// sizes samples with: any bytes, a 4-megapixel cap (the decompression-bomb guard). A decoded image
// has the size the probe reported and a full RGB buffer.
#include "fuzz_util.h"
#include "mindspeed_mm/data/media/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const mm::data::Image im = mm::data::decode_image(bytes, "fuzz", int64_t(1) << 22);
    if (im.width <= 0 || im.height <= 0 || im.rgb.size() != static_cast<size_t>(im.width) * im.height * 3)
      __builtin_trap();
    volatile uint8_t last = im.rgb.back();
    (void)last;
  });
  const std::string path = mm::fuzz::write("in.img", bytes);
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const auto [w, h] = mm::data::probe_image_size(path);
    if (w <= 0 || h <= 0) __builtin_trap();
  });
  return 0;
}
