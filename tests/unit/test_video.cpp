// Video (mindspeed_mm/data/media/video.h): probing, Qwen2-VL frame sampling and decoding on real
// clips from pinned Debian packages (tests/media/fetch_media.sh: opencv-doc's vtest.avi, MS-MPEG4
// v3; gnome-user-docs' display-dual-monitors.webm, VP8) and on clips the ffmpeg CLI encodes from
// vtest.avi at test time (H.264 4:2:0 in MP4, odd-sized H.264 4:4:4 in MP4, odd-sized FFV1
// 4:2:0 in Matroska). Decoded pixels are compared with what the ffmpeg CLI decodes through
// the same libswscale with the same flags: bit-identical. Frame counts and rates are
// hard-coded, verified once with `ffprobe -count_frames`; ffprobe's packet count is also
// checked at test time.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <cstring>
#include <random>
#include <sstream>
#include <unistd.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/qwen2vl_image_processor.h"
#include "mindspeed_mm/data/media/video.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace mm::data;
using mm::test::run_command;

namespace {

std::string media_dir() { return std::string(MM_BUILD_DIR) + "/test_media"; }
std::string videos() { return media_dir() + "/videos"; }
std::string vtest() { return videos() + "/vtest.avi"; }
std::string webm() { return videos() + "/display-dual-monitors.webm"; }
std::string clips() { return media_dir() + "/video_clips"; }

void fetch_media() {
  std::string cmd = "bash " + mm::test::source_dir() + "/tests/media/fetch_media.sh " + media_dir();
  auto r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << "`" << cmd << "` failed:\n" << r.output;
}

// The clips the ffmpeg CLI makes from vtest.avi, each written under a temporary name and
// renamed, so concurrent test processes never see half a file.
//   clip10.mp4  H.264 yuv420p 768x576, the first 60 frames at 10 fps, moov first (+faststart)
//   odd25.mp4   H.264 yuv444p 333x251 (x264 needs even sizes for 4:2:0), 50 frames at 25 fps
//   odd25.mkv   FFV1 yuv420p 333x251 (odd chroma planes), 50 frames at 25 fps; no frame count
//   one.mp4     a single H.264 frame
//   tone.wav    0.5 s of sine, no video stream
void make_clips() {
  fs::create_directories(clips());
  const std::string in = "ffmpeg -nostdin -v error -y -i " + vtest();
  const std::string odd = " -vf scale=333:251,fps=25 -frames:v 50";
  const std::pair<const char*, std::string> jobs[] = {
      {"clip10.mp4", in + " -frames:v 60 -r 10 -c:v libx264 -preset veryfast -pix_fmt yuv420p -movflags +faststart"},
      {"odd25.mp4", in + odd + " -c:v libx264 -preset veryfast -pix_fmt yuv444p"},
      {"odd25.mkv", in + odd + " -c:v ffv1 -pix_fmt yuv420p"},
      {"one.mp4", in + " -frames:v 1 -c:v libx264 -pix_fmt yuv420p"},
      {"tone.wav", "ffmpeg -nostdin -v error -y -f lavfi -i sine=frequency=440:duration=0.5"},
  };
  for (const auto& [name, cmd] : jobs) {
    std::string out = clips() + "/" + name;
    if (fs::exists(out)) continue;
    std::string tmp = clips() + "/tmp" + std::to_string(getpid()) + "." + name;
    auto r = run_command(cmd + " " + tmp);
    ASSERT_EQ(r.exit_code, 0) << "ffmpeg could not make " << name << " (needs the ffmpeg package):\n" << r.output;
    fs::rename(tmp, out);
  }
}

// Swscale flags the decoder uses; `-sws_flags` as an output option reaches the scaler that
// ffmpeg inserts before rgb24 (given before -i it is silently ignored in FFmpeg 5.1, and
// its default fast path differs by up to 39 levels on 768x576 frames).
const char* kSwsFlags = "bicubic+accurate_rnd+full_chroma_int+bitexact";

// Frame k (decode order) of a file as ffmpeg's CLI gives it in rgb24.
std::string ffmpeg_rgb(const std::string& path, int64_t k) {
  // A folder per file and frame: ctest runs the tests as parallel processes.
  std::string out =
      mm::test::fresh_dir("video_ref_" + fs::path(path).filename().string() + "_" + std::to_string(k)) + "/frame.rgb";
  auto r = run_command("ffmpeg -nostdin -v error -y -i " + path + " -sws_flags " + kSwsFlags + " -vf 'select=eq(n\\," +
                       std::to_string(k) + ")' -vframes 1 -pix_fmt rgb24 -f rawvideo " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return mm::test::read_file(out);
}

// Largest absolute difference between a decoded frame and ffmpeg's (256 on a size mismatch).
int max_diff(const Image& img, const std::string& ref) {
  if (img.rgb.size() != ref.size()) return 256;
  int mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) mx = std::max(mx, std::abs(int(img.rgb[i]) - int(uint8_t(ref[i]))));
  return mx;
}

int64_t ffprobe_packets(const std::string& path) {
  auto r = run_command("ffprobe -v error -select_streams v:0 -count_packets -show_entries stream=nb_read_packets "
                       "-of csv=p=0 " + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return std::atoll(r.output.c_str());
}

// The decoded frames are the sampled indices, at their timestamps i / fps (within `tol`:
// one time_base, 1 ms, for Matroska/WebM, whose muxers round times to whole milliseconds:
// the WebM has frame 267 at 17.799 s), at the stream's size.
void expect_frames(const DecodedVideo& d, const std::vector<int64_t>& want_indices, double fps, double tol) {
  ASSERT_EQ(d.indices, want_indices);
  ASSERT_EQ(d.frames.size(), want_indices.size());
  ASSERT_EQ(d.timestamps_s.size(), want_indices.size());
  for (size_t i = 0; i < want_indices.size(); ++i) {
    EXPECT_LE(std::abs(d.timestamps_s[i] - want_indices[i] / fps), tol + 1e-9)
        << "frame " << want_indices[i] << " at " << d.timestamps_s[i] << " s";
    EXPECT_EQ(d.frames[i].width, d.info.width);
    EXPECT_EQ(d.frames[i].height, d.info.height);
  }
}

const Image& frame_at(const DecodedVideo& d, int64_t index) {
  auto it = std::find(d.indices.begin(), d.indices.end(), index);
  if (it == d.indices.end()) throw std::logic_error("frame not sampled");
  return d.frames[it - d.indices.begin()];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(Video, ProbeRealClips) {
  fetch_media();
  if (HasFatalFailure()) return;
  // AVI: the count comes from the index (nb_frames); ffprobe -count_frames decodes 795.
  VideoInfo a = probe_video(vtest());
  EXPECT_EQ(a.codec, "msmpeg4v3");
  EXPECT_EQ(a.width, 768);
  EXPECT_EQ(a.height, 576);
  EXPECT_DOUBLE_EQ(a.fps, 10.0);
  EXPECT_EQ(a.num_frames, 795);
  EXPECT_NEAR(a.duration_s, 79.5, 1e-9);
  // WebM states no frame count: counted by demuxing; ffprobe -count_frames decodes 557.
  VideoInfo w = probe_video(webm());
  EXPECT_EQ(w.codec, "vp8");
  EXPECT_EQ(w.width, 1024);
  EXPECT_EQ(w.height, 768);
  EXPECT_DOUBLE_EQ(w.fps, 15.0);
  EXPECT_EQ(w.num_frames, 557);
  EXPECT_NEAR(w.duration_s, 557 / 15.0, 1e-3);  // 37.133 s from the container
  EXPECT_EQ(ffprobe_packets(vtest()), 795);
  EXPECT_EQ(ffprobe_packets(webm()), 557);
}

TEST(Video, SampleFrameIndicesTable) {
  struct Row {
    int64_t total;
    double video_fps;
    VideoSampling s;
    int64_t want_n;
    std::vector<int64_t> head, tail;  // first and last indices
  };
  auto S = [](double fps, int64_t min_frames = 4, int64_t max_frames = 768, int64_t factor = 2) {
    VideoSampling s;
    s.fps = fps, s.min_frames = min_frames, s.max_frames = max_frames, s.frame_factor = factor;
    return s;
  };
  // By hand from smart_nframes (video.cpp): n = total / video_fps * fps, clamped to
  // [ceil2(min_frames), floor2(min(max_frames, total))] and to total, then floored to a
  // multiple of the factor; indices = round_half_even(k * (total - 1) / (n - 1)).
  const Row rows[] = {
      // 795 / 10 * 2 = 159 -> floor2 = 158; step 794/157 = 5.057: 45.5 + 0.02 -> 46 at k = 9.
      {795, 10, S(2), 158, {0, 5, 10, 15, 20, 25, 30, 35, 40, 46, 51, 56}, {784, 789, 794}},
      // 557 / 15 * 2 = 74.27 -> 74; step 556/73 = 7.616.
      {557, 15, S(2), 74, {0, 8, 15, 23, 30, 38, 46, 53}, {541, 548, 556}},
      // 60 / 10 * 2 = 12; step 59/11 = 5.364.
      {60, 10, S(2), 12, {0, 5, 11, 16, 21, 27, 32, 38, 43, 48, 54, 59}, {}},
      // 50 / 25 * 2 = 4 = min_frames; step 49/3 = 16.33.
      {50, 25, S(2), 4, {0, 16, 33, 49}, {}},
      // max_frames clamp: 795 wanted, floor2(101) = 100; step 794/99 = 8.02.
      {795, 10, S(10, 4, 101), 100, {0, 8, 16, 24, 32}, {778, 786, 794}},
      // the default 768 cap: 2000 wanted.
      {2000, 30, S(30), 768, {0, 3, 5, 8, 10, 13}, {1994, 1996, 1999}},
      // tiny clips: 0.4 -> min_frames 4 fits in 5 frames; 3 frames cap at floor2(3) = 2.
      {5, 25, S(2), 4, {0, 1, 3, 4}, {}},
      {3, 30, S(2), 2, {0, 2}, {}},
      {2, 30, S(2), 2, {0, 1}, {}},
      // odd min_frames rounds up: ceil2(5) = 6 beats 30 / 30 * 2 = 2; step 29/5 = 5.8.
      {30, 30, S(2, 5), 6, {0, 6, 12, 17, 23, 29}, {}},
      // NTSC rate: 300 / 29.97 * 2 = 20.02 -> 20; step 299/19 = 15.74.
      {300, 30000.0 / 1001, S(2), 20, {0, 16, 31, 47, 63}, {268, 283, 299}},
      // sampling faster than the video: 60 wanted, capped at every frame.
      {20, 10, S(30), 20, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {17, 18, 19}},
      // frame_factor 1 and exact halves: linspace gives 2.5 and 7.5, round half to even.
      {6, 6, S(3, 1, 768, 1), 3, {0, 2, 5}, {}},
      {16, 16, S(3, 1, 768, 1), 3, {0, 8, 15}, {}},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(::testing::Message() << r.total << " frames at " << r.video_fps << " fps, sampled at " << r.s.fps);
    EXPECT_EQ(smart_nframes(r.total, r.video_fps, r.s), r.want_n);
    auto idx = sample_frame_indices(r.total, r.video_fps, r.s);
    ASSERT_EQ(int64_t(idx.size()), r.want_n);
    EXPECT_EQ(std::vector<int64_t>(idx.begin(), idx.begin() + r.head.size()), r.head);
    EXPECT_EQ(std::vector<int64_t>(idx.end() - r.tail.size(), idx.end()), r.tail);
    EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
    EXPECT_EQ(idx.front(), 0);
    EXPECT_EQ(idx.back(), r.total - 1);
  }
  // Outside [frame_factor, total_frames]: one frame floors to 0; no frames; bad settings.
  EXPECT_THROW(sample_frame_indices(1, 30, S(2)), mm::Error);
  EXPECT_THROW(sample_frame_indices(0, 30, S(2)), mm::Error);
  EXPECT_THROW(sample_frame_indices(100, 30, S(0)), mm::Error);
  EXPECT_THROW(sample_frame_indices(100, 0, S(2)), mm::Error);
}

TEST(Video, DecodeRealClipsMatchFfmpeg) {
  fetch_media();
  if (HasFatalFailure()) return;
  auto t0 = std::chrono::steady_clock::now();
  DecodedVideo a = decode_video(vtest(), VideoSampling{});
  double t_avi = seconds_since(t0);
  expect_frames(a, sample_frame_indices(795, 10, {}), 10.0, 1e-6);
  EXPECT_EQ(a.frames.size(), 158u);
  EXPECT_EQ(max_diff(frame_at(a, 101), ffmpeg_rgb(vtest(), 101)), 0);
  a = DecodedVideo{};  // 210 MB of frames

  t0 = std::chrono::steady_clock::now();
  DecodedVideo w = decode_video(webm(), VideoSampling{});
  double t_webm = seconds_since(t0);
  expect_frames(w, sample_frame_indices(557, 15, {}), 15.0, 1e-3);  // time_base 1/1000
  EXPECT_EQ(w.frames.size(), 74u);
  EXPECT_EQ(max_diff(frame_at(w, 76), ffmpeg_rgb(webm(), 76)), 0);
  std::cout << "[video] vtest.avi: 795 frames decoded, 158 converted in " << t_avi
            << " s; display-dual-monitors.webm: 557 decoded, 74 converted in " << t_webm << " s\n";
}

TEST(Video, EncodedClipsProbeDecodeAndMatchFfmpeg) {
  fetch_media();
  if (HasFatalFailure()) return;
  make_clips();
  if (HasFatalFailure()) return;
  struct Clip {
    const char* name;
    const char* codec;
    int width, height;
    double fps;
    int64_t frames;
    VideoSampling sampling;
    double ts_tol;
    std::vector<int64_t> compare;  // frames checked against ffmpeg's pixels
  };
  VideoSampling every;  // 50 frames at 25 fps sampled at 25 fps: all of them
  every.fps = 25;
  const Clip clips_[] = {
      {"clip10.mp4", "h264", 768, 576, 10, 60, {}, 1e-6, {16}},   // indices 0 5 11 16 ... 59
      {"odd25.mp4", "h264", 333, 251, 25, 50, every, 1e-6, {16}},
      {"odd25.mkv", "ffv1", 333, 251, 25, 50, {}, 1e-3, {16, 33}},  // indices 0 16 33 49
  };
  for (const auto& c : clips_) {
    SCOPED_TRACE(c.name);
    std::string path = clips() + "/" + c.name;
    VideoInfo info = probe_video(path);
    EXPECT_EQ(info.codec, c.codec);
    EXPECT_EQ(info.width, c.width);
    EXPECT_EQ(info.height, c.height);
    EXPECT_DOUBLE_EQ(info.fps, c.fps);
    EXPECT_EQ(info.num_frames, c.frames);
    EXPECT_EQ(ffprobe_packets(path), c.frames);
    EXPECT_NEAR(info.duration_s, c.frames / c.fps, 0.05);
    DecodedVideo d = decode_video(path, c.sampling);
    expect_frames(d, sample_frame_indices(c.frames, c.fps, c.sampling), c.fps, c.ts_tol);
    for (int64_t k : c.compare) EXPECT_EQ(max_diff(frame_at(d, k), ffmpeg_rgb(path, k)), 0) << "frame " << k;
  }
}

TEST(Video, ProcessVideoGivesQwen2VLGrid) {
  fetch_media();
  if (HasFatalFailure()) return;
  make_clips();
  if (HasFatalFailure()) return;
  // 12 frames of 768x576: smart_resize -> 588x756 (round(20.57)=21, round(27.43)=27 times 28),
  // grid (12/2, 588/14, 756/14).
  VisionPatches p = process_video(decode_video(clips() + "/clip10.mp4", {}).frames);
  EXPECT_EQ(p.grid_t, 6);
  EXPECT_EQ(p.grid_h, 42);
  EXPECT_EQ(p.grid_w, 54);
  EXPECT_EQ(p.row_size, 3 * 2 * 14 * 14);
  EXPECT_EQ(int64_t(p.values.size()), p.rows() * p.row_size);
  // 3 frames (frame_factor 1, 50 / 25 * 1.5 = 3; linspace 0, 24.5 -> 24, 49) of 333x251:
  // 252x336 (round(8.96)=9, round(11.89)=12 times 28); padded to 4 frames -> grid_t 2.
  VideoSampling s;
  s.fps = 1.5, s.min_frames = 1, s.frame_factor = 1;
  DecodedVideo d = decode_video(clips() + "/odd25.mkv", s);
  EXPECT_EQ(d.indices, (std::vector<int64_t>{0, 24, 49}));
  VisionPatches q = process_video(d.frames);
  EXPECT_EQ(q.grid_t, 2);
  EXPECT_EQ(q.grid_h, 18);
  EXPECT_EQ(q.grid_w, 24);
}

TEST(Video, BrokenFilesAreCleanErrors) {
  fetch_media();
  if (HasFatalFailure()) return;
  make_clips();
  if (HasFatalFailure()) return;
  std::string dir = mm::test::fresh_dir("video_broken");
  // mm::Error whose one-line message names the file and says `what`.
  auto expect_error = [](auto&& fn, const std::string& path, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << path << ": no error";
    } catch (const mm::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  auto probe = [](const std::string& p) { return [p] { probe_video(p); }; };
  auto decode = [](const std::string& p) { return [p] { decode_video(p, {}); }; };
  std::string mp4 = mm::test::read_file(clips() + "/clip10.mp4");
  std::string odd = mm::test::read_file(clips() + "/odd25.mp4");

  expect_error(probe(dir + "/missing.mp4"), dir + "/missing.mp4", "no such file");
  expect_error(decode(dir), dir, "not a regular file");
  std::mt19937 rng(7);
  std::string garbage(64 * 1024, '\0');
  for (auto& c : garbage) c = char(rng());
  mm::test::write_file(dir + "/garbage.mp4", garbage);
  expect_error(decode(dir + "/garbage.mp4"), dir + "/garbage.mp4", "not a readable video container");
  mm::test::write_file(dir + "/empty.avi", "");
  expect_error(probe(dir + "/empty.avi"), dir + "/empty.avi", "video: ");
  mm::test::write_file(dir + "/notes.webm", "just some text, not a video\n");
  expect_error(decode(dir + "/notes.webm"), dir + "/notes.webm", "video: ");
  expect_error(decode(clips() + "/tone.wav"), clips() + "/tone.wav", "no video stream");
  // One frame: smart_nframes floors to 0 frames.
  expect_error(decode(clips() + "/one.mp4"), clips() + "/one.mp4", "nframes should be in [2, 1] but got 0");
  // The first 40% of a moov-first MP4: the index still says 60 frames, the data holds fewer.
  mm::test::write_file(dir + "/cut.mp4", mp4.substr(0, mp4.size() * 4 / 10));
  EXPECT_EQ(probe_video(dir + "/cut.mp4").num_frames, 60);
  expect_error(decode(dir + "/cut.mp4"), dir + "/cut.mp4", "decoded only");
  // The first 40% of a moov-last MP4: no index at all.
  mm::test::write_file(dir + "/cut_odd.mp4", odd.substr(0, odd.size() * 4 / 10));
  expect_error(probe(dir + "/cut_odd.mp4"), dir + "/cut_odd.mp4", "not a readable video container");
  // Garbage over the middle of the data: the decoder conceals or the frames run short;
  // either way no crash, and a failure is an mm::Error.
  std::string smashed = mp4;
  for (size_t i = smashed.size() * 3 / 10; i < smashed.size() * 6 / 10; ++i) smashed[i] = char(rng());
  mm::test::write_file(dir + "/smashed.mp4", smashed);
  try {
    EXPECT_LE(decode_video(dir + "/smashed.mp4", {}).frames.size(), 12u);
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/smashed.mp4"), std::string::npos) << e.what();
  }
  // The pixel-count guard.
  expect_error([&] { decode_video(vtest(), {}, 1000); }, vtest(), "exceed the limit of 1000 pixels");
}

namespace {

// mm's frames through transformers' Qwen2VLVideoProcessor (tests/conformance/hf_video_processor.py).
struct HfVideo {
  VisionPatches patches;  // the reference's values and grid
};
HfVideo hf_process_video(const std::vector<Image>& frames, int64_t min_pixels, int64_t max_pixels, const std::string& name) {
  const std::string prefix = mm::test::fresh_dir("hf_video_" + name) + "/v";
  std::string raw;
  for (const Image& f : frames) raw.append(reinterpret_cast<const char*>(f.rgb.data()), f.rgb.size());
  mm::test::write_file(prefix + ".u8", raw);
  const auto& f0 = frames.front();
  auto r = run_command(std::string(MM_PYTHON) + " " + mm::test::source_dir() + "/tests/conformance/hf_video_processor.py " +
                       prefix + " " + std::to_string(frames.size()) + " " + std::to_string(f0.height) + " " +
                       std::to_string(f0.width) + " " + std::to_string(min_pixels) + " " + std::to_string(max_pixels));
  HfVideo out;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return out;
  std::istringstream(mm::test::read_file(prefix + ".txt")) >> out.patches.grid_t >> out.patches.grid_h >> out.patches.grid_w;
  const std::string bytes = mm::test::read_file(prefix + ".f32");
  out.patches.values.resize(bytes.size() / 4);
  std::memcpy(out.patches.values.data(), bytes.data(), bytes.size());
  return out;
}

Image crop(const Image& img, int h, int w) {
  Image out(w, h);
  for (int y = 0; y < h; ++y)
    std::memcpy(&out.rgb[size_t(y) * w * 3], &img.rgb[size_t(y) * img.width * 3], size_t(w) * 3);
  return out;
}

}  // namespace

// Our video processing (process_video) against transformers' Qwen2VLVideoProcessor on real
// decoded frames: the same grids always; without a resize (frames already at a multiple of 28)
// the same values to float rounding; with a resize the values differ only by the resampler
// (transformers' video processor resizes tensors with torchvision's antialiased bicubic; mm
// resizes with Pillow's bicubic, which its image processor and qwen-vl-utils use): at most 0.06
// in normalized units (4 of 255 levels), 5e-4 on average.
TEST(Video, ProcessVideoMatchesTransformersVideoProcessor) {
  fetch_media();
  if (HasFatalFailure()) return;
  make_clips();
  if (HasFatalFailure()) return;
  VideoSampling odd;
  odd.fps = 1.5, odd.min_frames = 1, odd.frame_factor = 1;
  const std::vector<Image> clip = decode_video(clips() + "/clip10.mp4", {}).frames;
  std::vector<Image> cropped;
  for (const Image& f : clip) cropped.push_back(crop(f, 448, 560));
  struct Case {
    std::string name;
    std::vector<Image> frames;
    int64_t min_pixels, max_pixels;
    bool resized;
  };
  const Case cases[] = {
      {"cropped_560x448", cropped, 56 * 56, 28 * 28 * 1280, false},
      {"clip10_768x576", clip, 56 * 56, 28 * 28 * 1280, true},
      {"clip10_small", clip, 56 * 56, 28 * 28 * 64, true},
      {"odd25_3_frames", decode_video(clips() + "/odd25.mkv", odd).frames, 56 * 56, 28 * 28 * 1280, true},
  };
  for (const Case& c : cases) {
    Qwen2VLImageConfig cfg;
    cfg.min_pixels = c.min_pixels;
    cfg.max_pixels = c.max_pixels;
    VisionPatches ours = process_video(c.frames, cfg);
    HfVideo ref = hf_process_video(c.frames, c.min_pixels, c.max_pixels, c.name);
    EXPECT_EQ(ours.grid_t, ref.patches.grid_t) << c.name;
    EXPECT_EQ(ours.grid_h, ref.patches.grid_h) << c.name;
    EXPECT_EQ(ours.grid_w, ref.patches.grid_w) << c.name;
    ASSERT_EQ(ours.values.size(), ref.patches.values.size()) << c.name;
    double max_err = 0, sum_err = 0;
    for (size_t i = 0; i < ours.values.size(); ++i) {
      const double e = std::abs(double(ours.values[i]) - ref.patches.values[i]);
      max_err = std::max(max_err, e);
      sum_err += e;
    }
    const double mean_err = sum_err / std::max<size_t>(1, ours.values.size());
    std::cout << "[qwen2vl video] " << c.name << ": grid " << ours.grid_t << "x" << ours.grid_h << "x" << ours.grid_w
              << ", max abs diff " << max_err << ", mean " << mean_err << " (normalized units)\n";
    if (!c.resized) {
      EXPECT_LT(max_err, 1e-5) << c.name;
    } else {
      // Measured: max 0.029 (about 2 of 255 levels), mean 3e-5 to 7e-5.
      EXPECT_LT(max_err, 0.06) << c.name;
      EXPECT_LT(mean_err, 5e-4) << c.name;
    }
  }
}
