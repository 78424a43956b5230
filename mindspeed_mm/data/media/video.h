// Video: probing and decoding with FFmpeg's libavformat/libavcodec/libswscale, and the frame
// sampling rule of Qwen2-VL's qwen_vl_utils (smart_nframes + linspace indices). Frames come
// back as 8-bit RGB Images (image.h), ready for process_video (qwen2vl_image_processor.h).
// Every failure (missing file, not a video, no video stream, a corrupt or truncated file) is a
// one-line mm::Error naming the path; FFmpeg's own log is silenced (AV_LOG_QUIET), so nothing
// is printed from the library.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mindspeed_mm/data/media/image.h"

namespace mm::data {

struct VideoInfo {
  int width = 0, height = 0;
  double fps = 0;          // the stream's avg_frame_rate (r_frame_rate when that is unset)
  int64_t num_frames = 0;  // see probe_video
  double duration_s = 0;   // the stream's duration, else the container's
  std::string codec;       // FFmpeg's codec name: "h264", "vp8", "msmpeg4v3", ...
};

// Opens the file and reads the first video stream's parameters. num_frames is the frame count
// the container's index states (nb_frames: MP4's sample table, AVI's index), or, where it
// states none (Matroska/WebM, MPEG-TS, ...), the number of non-empty packets of the video
// stream counted by demuxing the whole file (no decoding). For the codecs this project reads
// one packet is one frame; a truncated file whose index still claims the full count is
// caught by decode_video.
VideoInfo probe_video(const std::string& path);

// Qwen2-VL's fps-based sampling (qwen_vl_utils.smart_nframes; defaults are its FPS,
// FPS_MIN_FRAMES, FPS_MAX_FRAMES and FRAME_FACTOR).
struct VideoSampling {
  double fps = 2.0;
  int64_t min_frames = 4;
  int64_t max_frames = 768;
  int64_t frame_factor = 2;
};

// The number of frames smart_nframes picks for a clip of total_frames at video_fps
// (mm::Error, as its ValueError, when it falls outside [frame_factor, total_frames]).
int64_t smart_nframes(int64_t total_frames, double video_fps, const VideoSampling& s);
// torch.linspace(0, total_frames - 1, smart_nframes(...)).round().long(), computed by ATen itself.
std::vector<int64_t> sample_frame_indices(int64_t total_frames, double video_fps, const VideoSampling& s);

struct DecodedVideo {
  std::vector<Image> frames;          // one per index, RGB at the stream's size
  std::vector<double> timestamps_s;   // best_effort_timestamp * time_base of each frame
  std::vector<int64_t> indices;       // which decoded frames (0-based, presentation order)
  VideoInfo info;
};

// Probes, picks indices with sample_frame_indices, then decodes the file once, front to back,
// converting only the chosen frames to RGB (swscale with bit-exact flags, BT.601/709 and
// limited/full range as the frame states, as ffmpeg's scale filter reads them). Frames larger
// than max_pixels_per_frame are refused. If the file ends (or breaks) before a chosen index is
// decoded, mm::Error names the path and how many frames were decoded.
DecodedVideo decode_video(const std::string& path, const VideoSampling& s = {},
                          int64_t max_pixels_per_frame = int64_t(1) << 28);
// The same with the indices chosen by `pick` from the probed stream (ascending, each below
// num_frames; mm::Error from pick names the file).
DecodedVideo decode_video_frames(const std::string& path, const std::function<std::vector<int64_t>(const VideoInfo&)>& pick,
                                 int64_t max_pixels_per_frame = int64_t(1) << 28);

}  // namespace mm::data
