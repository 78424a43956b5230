// TensorBoard event files written directly (no TensorFlow, no protobuf library): the record
// framing of TFRecord (length, masked CRC-32C of the length, the bytes, masked CRC-32C of the
// bytes) around hand-encoded `Event` protos (tensorflow/core/util/event.proto): scalars as
// `simple_value`, images as PNG `Summary.Image`, text as a string tensor with the text plugin's
// metadata. PyPI's tensorboard reads them (tests/conformance/tensorboard_reference.py).
//
//   DIR/events.out.tfevents.<unix time>.<host>.<pid>.<n>
//
// Every write is flushed: a run that dies keeps what it logged. A resumed run opens a new file
// in the same DIR; TensorBoard merges a directory's files by step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace mm::data {
struct Image;
}

namespace mm::tools {

class EventWriter {
 public:
  // Creates DIR (mm::Error naming it when it cannot) and the event file, whose first record
  // is the file version ("brain.Event:2").
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  void add_image(const std::string& tag, const data::Image& image, int64_t step);
  void add_text(const std::string& tag, const std::string& text, int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write_event(int64_t step, const std::string& summary_or_version, bool is_version);
  std::string path_;
  FILE* file_ = nullptr;
};

// CRC-32C (Castagnoli), as TFRecord frames use it, and its masked form.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace mm::tools
