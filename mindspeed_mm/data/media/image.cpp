// Image decoders. libjpeg and libpng report errors by longjmp: each decode runs in a function
// with no C++ objects alive across setjmp, and turns the library's message into mm::Error.
#include "mindspeed_mm/data/media/image.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/file_io.h"

namespace mm::data {

uint8_t composite_over_white(uint8_t c, uint8_t a) {
  // PIL AlphaComposite.c with dst = (255,255,255,255), PRECISION_BITS 7.
  constexpr int kBits = 7;
  uint32_t blend = 255u * (255u - a);
  uint32_t outa255 = a * 255u + blend;  // 255 * 255
  uint32_t coef1 = a * 255u * 255u * (1u << kBits) / outa255;
  uint32_t coef2 = 255u * (1u << kBits) - coef1;
  uint32_t tmp = c * coef1 + 255u * coef2 + (0x80u << kBits);
  uint32_t v = ((tmp >> 8) + tmp) >> 8;  // SHIFTFORDIV255
  return static_cast<uint8_t>(v >> kBits);
}

namespace {

void check_size(int64_t w, int64_t h, int64_t max_pixels, const std::string& source) {
  if (w <= 0 || h <= 0) throw Error(cat(source, ": image has no pixels (", w, "x", h, ")"));
  if (w * h > max_pixels)
    throw Error(cat(source, ": image is ", w, "x", h, ", more than the ", max_pixels, "-pixel limit"));
}

void rgba_to_rgb(const uint8_t* rgba, size_t pixels, uint8_t* rgb) {
  for (size_t i = 0; i < pixels; ++i) {
    uint8_t a = rgba[4 * i + 3];
    for (int c = 0; c < 3; ++c) rgb[3 * i + c] = a == 255 ? rgba[4 * i + c] : composite_over_white(rgba[4 * i + c], a);
  }
}

// ---- JPEG ----
struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};
void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}
void jpeg_quiet(j_common_ptr, int) {}  // corrupt-data warnings: decode what is there, as PIL does

// Returns nullptr on success or the library's message (valid until the next call).
const char* decode_jpeg_c(const unsigned char* data, size_t size, int64_t max_pixels, int* w, int* h,
                          unsigned char** out, int* too_large, int* cmyk) {
  static thread_local JpegError err;
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.emit_message = jpeg_quiet;
  *out = nullptr;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    std::free(*out);
    *out = nullptr;
    return err.message;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    *cmyk = 1;
    jpeg_destroy_decompress(&cinfo);
    return "CMYK";
  }
  *w = static_cast<int>(cinfo.image_width);
  *h = static_cast<int>(cinfo.image_height);
  if (static_cast<int64_t>(*w) * *h > max_pixels || *w <= 0 || *h <= 0) {
    *too_large = 1;
    jpeg_destroy_decompress(&cinfo);
    return "size";
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  size_t stride = static_cast<size_t>(*w) * 3;
  *out = static_cast<unsigned char*>(std::malloc(stride * *h));
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = *out + cinfo.output_scanline * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return nullptr;
}

Image decode_jpeg(std::string_view bytes, const std::string& source, int64_t max_pixels) {
  int w = 0, h = 0, too_large = 0, cmyk = 0;
  unsigned char* pixels = nullptr;
  const char* msg = decode_jpeg_c(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), max_pixels, &w,
                                  &h, &pixels, &too_large, &cmyk);
  std::unique_ptr<unsigned char, void (*)(void*)> guard(pixels, std::free);
  if (cmyk) throw Error(cat(source, ": CMYK JPEG images are not supported"));
  if (too_large) check_size(w, h, max_pixels, source);
  if (msg) throw Error(cat(source, ": corrupt JPEG (", msg, ")"));
  Image img(w, h);
  std::memcpy(img.rgb.data(), pixels, img.rgb.size());
  return img;
}

// ---- PNG ----
struct PngReader {
  const unsigned char* data;
  size_t size, pos;
  char message[256];
};
void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->size - r->pos < n) png_error(png, "file truncated");
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}
void png_fail(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof(r->message), "%s", msg);
  png_longjmp(png, 1);
}
void png_warn(png_structp, png_const_charp) {}

// Decodes to 8-bit RGBA; nullptr on success or the message.
// `rows` is scratch memory owned by the caller (freed there), so nothing needs cleanup across
// the longjmp but png's own structs and *out.
const char* decode_png_c(PngReader* r, int64_t max_pixels, int* w, int* h, unsigned char** out, int* too_large,
                         png_bytep** rows) {
  *out = nullptr;
  *rows = nullptr;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, r, png_fail, png_warn);
  if (!png) return "out of memory";
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    std::free(*out);
    *out = nullptr;
    return r->message;
  }
  png_set_read_fn(png, r, png_read_mem);
  png_read_info(png, info);
  *w = static_cast<int>(png_get_image_width(png, info));
  *h = static_cast<int>(png_get_image_height(png, info));
  if (static_cast<int64_t>(*w) * *h > max_pixels) {
    *too_large = 1;
    png_destroy_read_struct(&png, &info, nullptr);
    return "size";
  }
  png_set_expand(png);         // palette -> RGB, gray < 8 bits -> 8, tRNS -> alpha
  png_set_strip_16(png);       // 16-bit: keep the high byte
  png_set_gray_to_rgb(png);
  png_set_add_alpha(png, 0xFF, PNG_FILLER_AFTER);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  size_t stride = static_cast<size_t>(*w) * 4;
  *out = static_cast<unsigned char*>(std::malloc(stride * *h));
  *rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * *h));
  for (int y = 0; y < *h; ++y) (*rows)[y] = *out + y * stride;
  png_read_image(png, *rows);
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return nullptr;
}

Image decode_png(std::string_view bytes, const std::string& source, int64_t max_pixels) {
  PngReader r{reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), 0, {0}};
  int w = 0, h = 0, too_large = 0;
  unsigned char* pixels = nullptr;
  png_bytep* rows = nullptr;
  const char* msg = decode_png_c(&r, max_pixels, &w, &h, &pixels, &too_large, &rows);
  std::free(rows);
  std::unique_ptr<unsigned char, void (*)(void*)> guard(pixels, std::free);
  if (too_large) check_size(w, h, max_pixels, source);
  if (msg) throw Error(cat(source, ": corrupt PNG (", msg, ")"));
  check_size(w, h, max_pixels, source);
  Image img(w, h);
  rgba_to_rgb(pixels, static_cast<size_t>(w) * h, img.rgb.data());
  return img;
}

// ---- WebP ----
Image decode_webp(std::string_view bytes, const std::string& source, int64_t max_pixels) {
  int w = 0, h = 0;
  auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (!WebPGetInfo(data, bytes.size(), &w, &h)) throw Error(cat(source, ": corrupt WebP header"));
  check_size(w, h, max_pixels, source);
  std::unique_ptr<uint8_t, void (*)(void*)> rgba(WebPDecodeRGBA(data, bytes.size(), &w, &h), WebPFree);
  if (!rgba) throw Error(cat(source, ": corrupt WebP data"));
  Image img(w, h);
  rgba_to_rgb(rgba.get(), static_cast<size_t>(w) * h, img.rgb.data());
  return img;
}

// ---- BMP (BITMAPINFOHEADER and later; BI_RGB and BI_BITFIELDS) ----
Image decode_bmp(std::string_view b, const std::string& source, int64_t max_pixels) {
  auto u16 = [&](size_t o) -> uint32_t {
    if (o + 2 > b.size()) throw Error(cat(source, ": truncated BMP"));
    return uint8_t(b[o]) | (uint8_t(b[o + 1]) << 8);
  };
  auto u32 = [&](size_t o) -> uint32_t { return u16(o) | (u16(o + 2) << 16); };
  uint32_t data_off = u32(10), header = u32(14);
  if (header < 40) throw Error(cat(source, ": BMP core headers (OS/2) are not supported"));
  int32_t w = static_cast<int32_t>(u32(18)), hs = static_cast<int32_t>(u32(22));
  uint32_t bpp = u16(28), compression = u32(30), colors = u32(46);
  bool top_down = hs < 0;
  int64_t h = top_down ? -int64_t(hs) : hs;
  check_size(w, h, max_pixels, source);
  if (compression != 0 && compression != 3) throw Error(cat(source, ": compressed BMP (RLE) is not supported"));
  if (bpp != 1 && bpp != 4 && bpp != 8 && bpp != 16 && bpp != 24 && bpp != 32)
    throw Error(cat(source, ": BMP with ", bpp, " bits per pixel is not supported"));
  std::vector<uint8_t> palette;  // BGRx entries
  if (bpp <= 8) {
    uint32_t n = colors ? colors : (1u << bpp);
    size_t at = 14 + header;
    if (n > 256 || at + 4 * n > b.size()) throw Error(cat(source, ": BMP palette is malformed"));
    palette.assign(b.begin() + at, b.begin() + at + 4 * n);
  }
  uint32_t masks[3] = {0x7C00, 0x03E0, 0x001F};
  if (bpp == 32) masks[0] = 0xFF0000, masks[1] = 0xFF00, masks[2] = 0xFF;
  if (compression == 3) masks[0] = u32(54), masks[1] = u32(58), masks[2] = u32(62);
  size_t stride = ((static_cast<size_t>(w) * bpp + 31) / 32) * 4;
  if (data_off + stride * h > b.size()) throw Error(cat(source, ": truncated BMP pixel data"));
  auto channel = [](uint32_t v, uint32_t mask) -> uint8_t {
    if (!mask) return 0;
    int shift = 0;
    while (!((mask >> shift) & 1)) ++shift;
    uint32_t max = mask >> shift;
    return static_cast<uint8_t>(((v & mask) >> shift) * 255 / max);
  };
  Image img(w, static_cast<int>(h));
  for (int64_t y = 0; y < h; ++y) {
    const auto* src = reinterpret_cast<const uint8_t*>(b.data()) + data_off + stride * (top_down ? y : h - 1 - y);
    uint8_t* dst = img.row(static_cast<int>(y));
    for (int x = 0; x < w; ++x, dst += 3) {
      if (bpp <= 8) {
        uint32_t bit = static_cast<uint32_t>(x) * bpp;
        uint32_t idx = (src[bit / 8] >> (8 - bpp - bit % 8)) & ((1u << bpp) - 1);
        if (4 * idx + 2 >= palette.size()) throw Error(cat(source, ": BMP pixel uses color ", idx, " beyond the palette"));
        dst[0] = palette[4 * idx + 2], dst[1] = palette[4 * idx + 1], dst[2] = palette[4 * idx];
      } else if (bpp == 24) {
        dst[0] = src[3 * x + 2], dst[1] = src[3 * x + 1], dst[2] = src[3 * x];
      } else {
        uint32_t v = bpp == 16 ? uint32_t(src[2 * x]) | (uint32_t(src[2 * x + 1]) << 8)
                               : uint32_t(src[4 * x]) | (uint32_t(src[4 * x + 1]) << 8) | (uint32_t(src[4 * x + 2]) << 16) |
                                     (uint32_t(src[4 * x + 3]) << 24);
        for (int c = 0; c < 3; ++c) dst[c] = channel(v, masks[c]);
      }
    }
  }
  return img;
}

bool starts_with(std::string_view b, const char* magic, size_t n) { return b.size() >= n && std::memcmp(b.data(), magic, n) == 0; }

}  // namespace

Image decode_image(std::string_view bytes, const std::string& source, int64_t max_pixels) {
  if (starts_with(bytes, "\xFF\xD8\xFF", 3)) return decode_jpeg(bytes, source, max_pixels);
  if (starts_with(bytes, "\x89PNG\r\n\x1A\n", 8)) return decode_png(bytes, source, max_pixels);
  if (starts_with(bytes, "RIFF", 4) && bytes.size() >= 12 && bytes.substr(8, 4) == "WEBP")
    return decode_webp(bytes, source, max_pixels);
  if (starts_with(bytes, "BM", 2)) return decode_bmp(bytes, source, max_pixels);
  if (bytes.empty()) throw Error(cat(source, ": empty file"));
  throw Error(cat(source, ": not a JPEG, PNG, WebP or BMP image"));
}

Image load_image(const std::string& path, int64_t max_pixels) {
  auto bytes = read_file_bytes(path);
  if (!bytes) throw Error(cat(path, ": cannot open image"));
  return decode_image(*bytes, path, max_pixels);
}

namespace {

uint32_t be16(std::string_view b, size_t i) { return (uint8_t(b[i]) << 8) | uint8_t(b[i + 1]); }
uint32_t be32(std::string_view b, size_t i) { return (be16(b, i) << 16) | be16(b, i + 2); }
int32_t le32(std::string_view b, size_t i) {
  return static_cast<int32_t>(uint32_t(uint8_t(b[i])) | uint32_t(uint8_t(b[i + 1])) << 8 |
                              uint32_t(uint8_t(b[i + 2])) << 16 | uint32_t(uint8_t(b[i + 3])) << 24);
}

// JPEG: the frame header (SOFn) holds the size; walk the marker segments until it.
std::optional<std::pair<int, int>> jpeg_size(std::string_view b) {
  size_t i = 2;
  while (i + 9 < b.size()) {
    if (uint8_t(b[i]) != 0xFF) return std::nullopt;
    const uint8_t m = uint8_t(b[i + 1]);
    if (m == 0xFF) { ++i; continue; }  // fill byte
    const bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
    if (sof) return std::make_pair(static_cast<int>(be16(b, i + 7)), static_cast<int>(be16(b, i + 5)));
    if (m == 0xD8 || (m >= 0xD0 && m <= 0xD7) || m == 0x01) { i += 2; continue; }
    i += 2 + be16(b, i + 2);
  }
  return std::nullopt;
}

std::optional<std::pair<int, int>> header_size(std::string_view b) {
  if (starts_with(b, "\xFF\xD8\xFF", 3)) return jpeg_size(b);
  if (starts_with(b, "\x89PNG\r\n\x1A\n", 8) && b.size() >= 24)
    return std::make_pair(static_cast<int>(be32(b, 16)), static_cast<int>(be32(b, 20)));
  if (starts_with(b, "RIFF", 4) && b.size() >= 30 && b.substr(8, 4) == "WEBP") {
    int w = 0, h = 0;
    if (WebPGetInfo(reinterpret_cast<const uint8_t*>(b.data()), b.size(), &w, &h)) return std::make_pair(w, h);
    return std::nullopt;
  }
  if (starts_with(b, "BM", 2) && b.size() >= 26) return std::make_pair(std::abs(le32(b, 18)), std::abs(le32(b, 22)));
  return std::nullopt;
}

}  // namespace

std::pair<int, int> probe_image_size(const std::string& path) {
  if (const std::string why = file_problem(path); !why.empty()) throw Error(cat(path, ": ", why));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(cat(path, ": cannot open image"));
  std::string head(1 << 16, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(f.gcount()));
  auto size = header_size(head);
  if (!size && head.size() == (1u << 16)) {  // a JPEG with large metadata before its frame header
    auto all = read_file_bytes(path);
    if (all) size = header_size(*all);
  }
  if (!size || size->first <= 0 || size->second <= 0) throw Error(cat(path, ": no image size in its header"));
  return *size;
}

namespace {
const char* save_png_c(const Image* img, FILE* fp, char* message) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, message, nullptr, nullptr);
  if (!png) return "out of memory";
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return "libpng write error";
  }
  png_init_io(png, fp);
  png_set_IHDR(png, info, img->width, img->height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < img->height; ++y) png_write_row(png, const_cast<png_bytep>(img->row(y)));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return nullptr;
}
}  // namespace

void save_png(const Image& image, const std::string& path) {
  std::string tmp = path + ".tmp";
  FILE* fp = std::fopen(tmp.c_str(), "wb");
  if (!fp) throw Error(cat(path, ": cannot write PNG"));
  char message[256] = {0};
  const char* err = save_png_c(&image, fp, message);
  bool closed = std::fclose(fp) == 0;
  if (err || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(cat(path, ": writing PNG failed (", err ? err : "I/O error", ")"));
  }
}

std::string encode_png(const Image& image) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* fp = open_memstream(&buf, &size);
  if (!fp) throw Error("encoding a PNG: out of memory");
  char message[256] = {0};
  const char* err = save_png_c(&image, fp, message);
  const bool closed = std::fclose(fp) == 0;
  std::string out = buf && closed && !err ? std::string(buf, size) : std::string();
  std::free(buf);
  if (err || !closed) throw Error(cat("encoding a ", image.width, "x", image.height, " PNG failed (", err ? err : "I/O error", ")"));
  return out;
}

}  // namespace mm::data
