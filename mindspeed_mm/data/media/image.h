// Image: 8-bit RGB pixels, row-major, 3 bytes per pixel, and its decoders. JPEG (libjpeg-turbo,
// the library PIL uses, so pixels are identical), PNG (libpng: 1-16 bit, gray, palette,
// tRNS, alpha), WebP (libwebp) and BMP (1/4/8-bit palette, 16/24/32-bit) become RGB the way
// transformers' convert_to_rgb does it: anything with alpha is composited over white.
// 16-bit samples keep their high byte (PIL's RGB;16B rawmode).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mm::data {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3

  Image() = default;
  Image(int w, int h) : width(w), height(h), rgb(static_cast<size_t>(w) * h * 3) {}
  uint8_t* row(int y) { return rgb.data() + static_cast<size_t>(y) * width * 3; }
  const uint8_t* row(int y) const { return rgb.data() + static_cast<size_t>(y) * width * 3; }
};

// Decodes the bytes of an image file; the format comes from the magic bytes, not the name.
// mm::Error naming `source` for an unknown format, a corrupt or truncated file, or an image
// with more than `max_pixels` pixels (a decompression bomb guard).
Image decode_image(std::string_view bytes, const std::string& source, int64_t max_pixels = int64_t(1) << 28);
Image load_image(const std::string& path, int64_t max_pixels = int64_t(1) << 28);

// (width, height) from the file's header alone (JPEG frame header, PNG IHDR, WebP, BMP), without
// decoding: lets the loader know a sample's token count up front. mm::Error when unreadable.
std::pair<int, int> probe_image_size(const std::string& path);

// Writes an 8-bit RGB PNG (for `mm data fashion-mnist` and tests); mm::Error on failure.
void save_png(const Image& image, const std::string& path);
// The same PNG's bytes, in memory (TensorBoard image summaries, HTML reports).
std::string encode_png(const Image& image);

// transformers' convert_to_rgb for one pixel with alpha: PIL's alpha_composite over opaque
// white, in its integer arithmetic.
uint8_t composite_over_white(uint8_t channel, uint8_t alpha);

}  // namespace mm::data
