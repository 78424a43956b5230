#include "mindspeed_mm/data/media/video_clip.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"
#include "mindspeed_mm/data/media/image_resize.h"
#include "mindspeed_mm/data/media/video.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/core/file_io.h"

namespace mm::data {

std::vector<int64_t> clip_frame_indices(int64_t total, double video_fps, double fps, int64_t frames) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < frames; ++i) {
    const int64_t k = static_cast<int64_t>(std::llround(static_cast<double>(i) * video_fps / fps));
    if (k >= total) return {};
    idx.push_back(k);
  }
  return idx;
}

at::Tensor frames_to_clip(const std::vector<Image>& frames, int64_t height, int64_t width) {
  at::Tensor clip = at::empty({3, static_cast<int64_t>(frames.size()), height, width}, at::kFloat);
  for (size_t t = 0; t < frames.size(); ++t) {
    const Image& f = frames[t];
    const double scale = std::max(static_cast<double>(width) / f.width, static_cast<double>(height) / f.height);
    const int w = std::max<int>(static_cast<int>(width), static_cast<int>(std::lround(f.width * scale)));
    const int h = std::max<int>(static_cast<int>(height), static_cast<int>(std::lround(f.height * scale)));
    const Image cropped = center_crop(resize_bicubic(f, w, h), static_cast<int>(width), static_cast<int>(height));
    const at::Tensor px = at::from_blob(const_cast<uint8_t*>(cropped.rgb.data()), {height, width, 3}, at::kByte);
    clip.select(1, static_cast<int64_t>(t)).copy_(px.permute({2, 0, 1}).to(at::kFloat) / 127.5 - 1.0);
  }
  return clip;
}

at::Tensor load_video_clip(const std::string& path, int64_t height, int64_t width, int64_t frames, double fps) {
  const DecodedVideo v = decode_video_frames(path, [&](const VideoInfo& info) {
    std::vector<int64_t> idx = clip_frame_indices(info.num_frames, info.fps, fps, frames);
    if (idx.empty())
      throw Error(cat("has ", info.num_frames, " frames at ", info.fps, " fps: fewer than the ", frames, " at ", fps, " fps asked"));
    return idx;
  });
  return frames_to_clip(v.frames, height, width);
}

std::vector<VideoRecord> read_video_records(const std::string& jsonl, const std::string& media_root, int64_t* skipped) {
  namespace fs = std::filesystem;
  if (const std::string why = file_problem(jsonl); !why.empty()) throw Error(cat("data: ", jsonl, ": ", why));
  std::ifstream in(jsonl);
  if (!in) throw Error(cat("data: ", jsonl, ": cannot open"));
  const fs::path root = media_root.empty() ? fs::path(jsonl).parent_path() : fs::path(media_root);
  std::vector<VideoRecord> out;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = cat(jsonl, ":", line_no);
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      log::warn("data: skipped ", where, ": not valid JSON (", json_error_text(e.what()), ")");
      if (skipped) ++*skipped;
      continue;
    }
    if (!r.is_object() || !r.contains("path") || !r["path"].is_string()) {
      log::warn("data: skipped ", where, ": has no \"path\" string");
      if (skipped) ++*skipped;
      continue;
    }
    VideoRecord rec;
    fs::path p = r["path"].get<std::string>();
    if (p.is_relative()) p = root / p;
    rec.path = p.string();
    rec.source = where;
    for (const char* key : {"cap", "caption"})
      if (r.contains(key) && r[key].is_string()) {
        rec.caption = r[key].get<std::string>();
        rec.has_caption = true;
        break;
      }
    out.push_back(std::move(rec));
  }
  return out;
}

}  // namespace mm::data
