#include "mindspeed_mm/tools/tensorboard.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/image.h"

namespace mm::tools {
namespace {

// Protocol buffer wire format, only what Event needs.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire); }
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_int(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}
void put_double(std::string& out, int field, double v) {
  put_key(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);  // little-endian hosts (x86-64, aarch64)
  out.append(b, 8);
}
void put_float(std::string& out, int field, float v) {
  put_key(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

// Summary { repeated Value value = 1; }
std::string summary_of(const std::string& value) {
  std::string s;
  put_bytes(s, 1, value);
  return s;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(cat(dir, ": cannot create the TensorBoard directory (", ec.message(), ")"));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  static std::atomic<int> counter{0};
  path_ = cat(dir, "/events.out.tfevents.", static_cast<long long>(now_s()), ".", host, ".", getpid(), ".",
              counter++);
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) throw Error(cat(path_, ": cannot write the TensorBoard event file"));
  write_event(0, "brain.Event:2", true);
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::write_event(int64_t step, const std::string& payload, bool is_version) {
  std::string event;
  put_double(event, 1, now_s());
  put_int(event, 2, step);
  if (is_version) put_bytes(event, 3, payload);
  else put_bytes(event, 5, payload);
  // TFRecord framing.
  const uint64_t len = event.size();
  char header[12];
  std::memcpy(header, &len, 8);
  const uint32_t len_crc = masked_crc32c(header, 8);
  std::memcpy(header + 8, &len_crc, 4);
  const uint32_t data_crc = masked_crc32c(event.data(), event.size());
  const bool ok = std::fwrite(header, 1, 12, file_) == 12 && std::fwrite(event.data(), 1, event.size(), file_) == event.size() &&
                  std::fwrite(&data_crc, 1, 4, file_) == 4 && std::fflush(file_) == 0;
  if (!ok) throw Error(cat(path_, ": writing a TensorBoard event failed"));
}

void EventWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  put_bytes(v, 1, tag);
  put_float(v, 2, static_cast<float>(value));
  write_event(step, summary_of(v), false);
}

void EventWriter::add_image(const std::string& tag, const data::Image& image, int64_t step) {
  std::string img;
  put_int(img, 1, image.height);
  put_int(img, 2, image.width);
  put_int(img, 3, 3);  // RGB
  put_bytes(img, 4, data::encode_png(image));
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 4, img);
  write_event(step, summary_of(v), false);
}

void EventWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  // SummaryMetadata { PluginData plugin_data = 1 { plugin_name = 1 } }: the text plugin.
  std::string plugin, metadata;
  put_bytes(plugin, 1, "text");
  put_bytes(metadata, 1, plugin);
  // TensorProto { dtype = 1 (DT_STRING = 7), tensor_shape = 2 (a scalar: empty), string_val = 8 }
  std::string tensor;
  put_int(tensor, 1, 7);
  put_bytes(tensor, 2, "");
  put_bytes(tensor, 8, text);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 9, metadata);
  put_bytes(v, 8, tensor);
  write_event(step, summary_of(v), false);
}

}  // namespace mm::tools
