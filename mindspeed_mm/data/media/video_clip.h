// Fixed-size clips for video generation: frames taken at a target rate, resized to cover the
// clip's size (bicubic) and centre-cropped, as a float tensor in [-1, 1] (what Wan's VAE takes).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mindspeed_mm/data/media/image.h"

namespace mm::data {

// Frame round(i * video_fps / fps) for i < frames, from a video of `total` frames at video_fps;
// empty when the video is too short.
std::vector<int64_t> clip_frame_indices(int64_t total, double video_fps, double fps, int64_t frames);

// RGB frames -> [3, frames.size(), height, width] in [-1, 1], each resized to cover and centre-cropped.
at::Tensor frames_to_clip(const std::vector<Image>& frames, int64_t height, int64_t width);

// Both for a video file: mm::Error naming the path when it cannot be decoded or has fewer than
// `frames` frames at `fps`.
at::Tensor load_video_clip(const std::string& path, int64_t height, int64_t width, int64_t frames, double fps);

// One line of a video + caption JSONL: {"path": "clips/a.mp4", "cap": "a sandal moving left"}
// ("caption" is read too; the caption is optional here, its users require it).
struct VideoRecord {
  std::string path;     // resolved against the media root
  std::string caption;
  bool has_caption = false;
  std::string source;   // "videos.jsonl:12"
};

// The records of `jsonl`, relative paths resolved against media_root (default: the file's
// folder). A line that is not a JSON object with a "path" string is skipped with a warning
// naming it, and counted in *skipped; blank lines are not records. mm::Error when the file cannot
// be opened.
std::vector<VideoRecord> read_video_records(const std::string& jsonl, const std::string& media_root = "",
                                            int64_t* skipped = nullptr);

}  // namespace mm::data
