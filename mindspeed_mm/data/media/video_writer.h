// Writing generated videos: H.264 in MP4 through FFmpeg's libraries (libx264 when libavcodec has
// it, else its own H.264 encoder), yuv420p, constant frame rate; and a PNG contact sheet of frames.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

namespace mm::data {

// Frames go in one at a time (so a long video never sits in memory whole); the file appears at
// `path` only after close(): written to path + ".tmp" and renamed. A writer destroyed without
// close() removes its temporary file. mm::Error naming the path on any failure.
class Mp4Writer {
 public:
  // width and height must be even (yuv420p); crf: x264's quality (lower is better; 18 is near
  // transparent).
  Mp4Writer(std::string path, int width, int height, double fps = 16.0, int crf = 18);
  ~Mp4Writer();
  Mp4Writer(const Mp4Writer&) = delete;
  Mp4Writer& operator=(const Mp4Writer&) = delete;

  // frame: uint8 RGB [height, width, 3].
  void add(const at::Tensor& frame);
  void close();
  int64_t frames() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// video [3, T, H, W] (or [T, H, W, 3] uint8) in [-1, 1] -> uint8 frames [T, H, W, 3].
at::Tensor video_to_uint8_frames(const at::Tensor& video);

// Every frame of [T, H, W, 3] uint8 into one MP4.
void write_mp4(const std::string& path, const at::Tensor& frames, double fps = 16.0);

// The frames side by side in rows of `columns`, `gap` white pixels between them, as a PNG.
void write_contact_sheet(const std::string& path, const at::Tensor& frames, int columns = 8, int gap = 2);

}  // namespace mm::data
