// Video probing and decoding on FFmpeg's libav* (see video.h). Every FFmpeg object lives in a
// unique_ptr with its own free function, so an error thrown anywhere frees everything.
#include "mindspeed_mm/data/media/video.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>

#ifndef MM_NO_VIDEO
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libavutil/imgutils.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
}
#endif

#include "mindspeed_mm/core/errors.h"

namespace mm::data {
#ifndef MM_NO_VIDEO
namespace {

// FFmpeg prints to stderr by default; a library must not. Errors reach the user as mm::Error.
void quiet_ffmpeg_log() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_level(AV_LOG_QUIET); });
}

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

struct FormatCloser { void operator()(AVFormatContext* p) const { avformat_close_input(&p); } };
struct CodecFreer { void operator()(AVCodecContext* p) const { avcodec_free_context(&p); } };
struct PacketFreer { void operator()(AVPacket* p) const { av_packet_free(&p); } };
struct FrameFreer { void operator()(AVFrame* p) const { av_frame_free(&p); } };
struct SwsFreer { void operator()(SwsContext* p) const { sws_freeContext(p); } };
using FormatPtr = std::unique_ptr<AVFormatContext, FormatCloser>;
using CodecPtr = std::unique_ptr<AVCodecContext, CodecFreer>;
using PacketPtr = std::unique_ptr<AVPacket, PacketFreer>;
using FramePtr = std::unique_ptr<AVFrame, FrameFreer>;
using SwsPtr = std::unique_ptr<SwsContext, SwsFreer>;

PacketPtr new_packet() {
  PacketPtr p(av_packet_alloc());
  MM_CHECK(p, "video: out of memory allocating a packet");
  return p;
}
FramePtr new_frame() {
  FramePtr f(av_frame_alloc());
  MM_CHECK(f, "video: out of memory allocating a frame");
  return f;
}

// An opened container and the index of its first video stream.
struct OpenedVideo {
  FormatPtr fmt;
  int stream = -1;
  AVStream* st() const { return fmt->streams[stream]; }
};

OpenedVideo open_video(const std::string& path) {
  quiet_ffmpeg_log();
  std::error_code ec;
  MM_CHECK(std::filesystem::exists(path, ec), "video: ", path, ": no such file");
  MM_CHECK(std::filesystem::is_regular_file(path, ec), "video: ", path, ": not a regular file");
  OpenedVideo v;
  AVFormatContext* raw = nullptr;
  int rc = avformat_open_input(&raw, path.c_str(), nullptr, nullptr);
  MM_CHECK(rc >= 0, "video: ", path, ": not a readable video container (", av_error(rc), ")");
  v.fmt.reset(raw);
  rc = avformat_find_stream_info(raw, nullptr);
  MM_CHECK(rc >= 0, "video: ", path, ": cannot read stream parameters (", av_error(rc), ")");
  rc = av_find_best_stream(raw, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  MM_CHECK(rc >= 0, "video: ", path, ": no video stream (", raw->iformat->name, " container with ",
           raw->nb_streams, " other stream(s))");
  v.stream = rc;
  MM_CHECK(!(raw->streams[rc]->disposition & AV_DISPOSITION_ATTACHED_PIC), "video: ", path,
           ": no video stream (only an attached cover picture)");
  for (unsigned i = 0; i < raw->nb_streams; ++i)
    if (int(i) != v.stream) raw->streams[i]->discard = AVDISCARD_ALL;
  const AVCodecParameters* par = v.st()->codecpar;
  MM_CHECK(par->width > 0 && par->height > 0, "video: ", path, ": video stream has no frame size (",
           avcodec_get_name(par->codec_id), ")");
  return v;
}

VideoInfo read_info(OpenedVideo& v, const std::string& path) {
  AVStream* st = v.st();
  VideoInfo info;
  info.width = st->codecpar->width;
  info.height = st->codecpar->height;
  info.codec = avcodec_get_name(st->codecpar->codec_id);
  AVRational rate = st->avg_frame_rate;
  if (rate.num <= 0 || rate.den <= 0) rate = st->r_frame_rate;
  MM_CHECK(rate.num > 0 && rate.den > 0, "video: ", path, ": the video stream states no frame rate");
  info.fps = av_q2d(rate);
  if (st->nb_frames > 0) {
    info.num_frames = st->nb_frames;  // from the container's index (MP4 stts, AVI idx1)
  } else {
    // No index (Matroska/WebM, MPEG-TS, ...): count the stream's packets. Empty packets are
    // dropped-frame markers that decode to nothing (ffmpeg's CLI skips them too).
    auto pkt = new_packet();
    int rc;
    while ((rc = av_read_frame(v.fmt.get(), pkt.get())) >= 0) {
      if (pkt->stream_index == v.stream && pkt->size > 0) ++info.num_frames;
      av_packet_unref(pkt.get());
    }
    MM_CHECK(rc == AVERROR_EOF || info.num_frames > 0, "video: ", path, ": cannot demux (", av_error(rc), ")");
  }
  MM_CHECK(info.num_frames > 0, "video: ", path, ": the video stream holds no frames");
  if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
    info.duration_s = st->duration * av_q2d(st->time_base);
  } else if (v.fmt->duration != AV_NOPTS_VALUE && v.fmt->duration > 0) {
    info.duration_s = double(v.fmt->duration) / AV_TIME_BASE;
  } else {
    info.duration_s = info.num_frames / info.fps;
  }
  return info;
}

// One decoded frame to RGB24. The flags make swscale exact and CPU-independent (no MMX
// fast path, accurate rounding, full chroma interpolation); the YUV matrix and range are the
// frame's own, read as ffmpeg's scale filter reads them (in_color_matrix=auto, in_range=auto).
// swscale writes into an aligned buffer (its SIMD may write past the end of a row), copied
// row by row into the Image so odd widths and heights come out exact.
constexpr int kSwsFlags = SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT | SWS_BITEXACT;

Image to_rgb(const AVFrame* f, SwsPtr& sws, FramePtr& rgb, const std::string& path) {
  SwsContext* ctx = sws_getCachedContext(sws.release(), f->width, f->height, AVPixelFormat(f->format),
                                         f->width, f->height, AV_PIX_FMT_RGB24, kSwsFlags, nullptr, nullptr,
                                         nullptr);
  sws.reset(ctx);
  MM_CHECK(ctx, "video: ", path, ": cannot convert pixel format ", f->format, " to RGB");
  int* inv_table = nullptr;
  int* table = nullptr;
  int src_full = 0, dst_full = 0, brightness = 0, contrast = 0, saturation = 0;
  if (sws_getColorspaceDetails(ctx, &inv_table, &src_full, &table, &dst_full, &brightness, &contrast,
                               &saturation) >= 0) {
    const int* coefs = sws_getCoefficients(f->colorspace);  // unspecified -> BT.601
    if (f->color_range != AVCOL_RANGE_UNSPECIFIED) src_full = f->color_range == AVCOL_RANGE_JPEG;
    sws_setColorspaceDetails(ctx, coefs, src_full, coefs, dst_full, brightness, contrast, saturation);
  }
  if (!rgb || rgb->width != f->width || rgb->height != f->height) {
    rgb = new_frame();
    rgb->format = AV_PIX_FMT_RGB24;
    rgb->width = f->width;
    rgb->height = f->height;
    int rc = av_frame_get_buffer(rgb.get(), 64);
    MM_CHECK(rc >= 0, "video: ", path, ": out of memory for a ", f->width, "x", f->height, " frame");
  }
  int rc = sws_scale(ctx, f->data, f->linesize, 0, f->height, rgb->data, rgb->linesize);
  MM_CHECK(rc == f->height, "video: ", path, ": RGB conversion failed");
  Image img(f->width, f->height);
  for (int y = 0; y < f->height; ++y)
    std::copy_n(rgb->data[0] + size_t(y) * rgb->linesize[0], size_t(f->width) * 3, img.row(y));
  return img;
}

CodecPtr open_decoder(const AVStream* st, const std::string& path) {
  const AVCodec* codec = avcodec_find_decoder(st->codecpar->codec_id);
  MM_CHECK(codec, "video: ", path, ": no decoder for codec ", avcodec_get_name(st->codecpar->codec_id));
  CodecPtr dec(avcodec_alloc_context3(codec));
  MM_CHECK(dec, "video: out of memory allocating a decoder");
  int rc = avcodec_parameters_to_context(dec.get(), st->codecpar);
  MM_CHECK(rc >= 0, "video: ", path, ": bad codec parameters (", av_error(rc), ")");
  dec->pkt_timebase = st->time_base;
  dec->thread_count = 0;  // one per core; frame threading keeps output order and pixels
  rc = avcodec_open2(dec.get(), codec, nullptr);
  MM_CHECK(rc >= 0, "video: ", path, ": cannot open the ", codec->name, " decoder (", av_error(rc), ")");
  return dec;
}

}  // namespace

VideoInfo probe_video(const std::string& path) {
  OpenedVideo v = open_video(path);
  return read_info(v, path);
}
#else
// A build without FFmpeg (cmake -DMM_WITH_VIDEO=OFF, e.g. bench/gpu/run.sh on a machine without
// its libraries): every video is a clear error, and a dataset skips it as a bad sample.
namespace {
[[noreturn]] void no_video(const std::string& path) {
  throw Error(cat("video: ", path, ": this build of mm has no video decoding (configured with -DMM_WITH_VIDEO=OFF)"));
}
}  // namespace
VideoInfo probe_video(const std::string& path) { no_video(path); }
DecodedVideo decode_video(const std::string& path, const VideoSampling&, int64_t) { no_video(path); }
DecodedVideo decode_video_frames(const std::string& path, const std::function<std::vector<int64_t>(const VideoInfo&)>&,
                                 int64_t) {
  no_video(path);
}
#endif

// qwen_vl_utils.vision_process.smart_nframes, fps branch, as in QwenLM/Qwen3-VL
// qwen-vl-utils/src/qwen_vl_utils/vision_process.py (the rule shared by Qwen2-VL, Qwen2.5-VL and
// Qwen3-VL since qwen-vl-utils 0.0.8):
//   min_frames = ceil_by_factor(min_frames, FRAME_FACTOR)
//   max_frames = floor_by_factor(min(FPS_MAX_FRAMES, total_frames), FRAME_FACTOR)
//   nframes = total_frames / video_fps * fps
//   nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
//   nframes = floor_by_factor(nframes, FRAME_FACTOR)
//   ValueError unless FRAME_FACTOR <= nframes <= total_frames
// where x_by_factor(n, f) = math.x(n / f) * f in float division. (The first Qwen2-VL release,
// QwenLM/Qwen2-VL@4a2035c, ended with round_by_factor instead: 795 frames at 10 fps -> 160
// there, 158 here.) Upstream caps only its default max_frames at total_frames; capping a
// user-set one too changes nothing, as the min(..., total_frames) that follows caps it anyway.
int64_t smart_nframes(int64_t total_frames, double video_fps, const VideoSampling& s) {
  MM_CHECK(s.frame_factor >= 1, "video sampling: frame_factor must be >= 1 (got ", s.frame_factor, ")");
  MM_CHECK(s.fps > 0, "video sampling: fps must be > 0 (got ", s.fps, ")");
  MM_CHECK(video_fps > 0, "video sampling: the video's fps must be > 0 (got ", video_fps, ")");
  const double f = double(s.frame_factor);
  const double min_frames = std::ceil(double(s.min_frames) / f) * f;
  const double max_frames = std::floor(double(std::min(s.max_frames, total_frames)) / f) * f;
  double n = double(total_frames) / video_fps * s.fps;
  n = std::min(std::min(std::max(n, min_frames), max_frames), double(total_frames));
  const int64_t nframes = int64_t(std::floor(n / f) * f);
  MM_CHECK(s.frame_factor <= nframes && nframes <= total_frames, "video sampling: nframes should be in [",
           s.frame_factor, ", ", total_frames, "] but got ", nframes, " (", total_frames, " frames at ",
           video_fps, " fps, sampled at ", s.fps, " fps, min_frames ", s.min_frames, ", max_frames ",
           s.max_frames, ")");
  return nframes;
}

std::vector<int64_t> sample_frame_indices(int64_t total_frames, double video_fps, const VideoSampling& s) {
  const int64_t n = smart_nframes(total_frames, video_fps, s);
  // float32 linspace then round-half-even, exactly what qwen_vl_utils runs.
  at::Tensor idx = at::linspace(0, double(total_frames - 1), n).round().to(at::kLong).contiguous();
  const int64_t* p = idx.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + n);
}

#ifndef MM_NO_VIDEO
DecodedVideo decode_video(const std::string& path, const VideoSampling& s, int64_t max_pixels_per_frame) {
  return decode_video_frames(path, [&](const VideoInfo& info) { return sample_frame_indices(info.num_frames, info.fps, s); },
                             max_pixels_per_frame);
}

DecodedVideo decode_video_frames(const std::string& path, const std::function<std::vector<int64_t>(const VideoInfo&)>& pick,
                                 int64_t max_pixels_per_frame) {
  DecodedVideo out;
  {
    OpenedVideo probe = open_video(path);
    out.info = read_info(probe, path);
  }
  const VideoInfo& info = out.info;
  MM_CHECK(int64_t(info.width) * info.height <= max_pixels_per_frame, "video: ", path, ": frames of ",
           info.width, "x", info.height, " exceed the limit of ", max_pixels_per_frame, " pixels");
  try {
    out.indices = pick(info);
  } catch (const mm::Error& e) {
    throw mm::Error(mm::cat("video: ", path, ": ", e.what()));
  }

  // A fresh open rather than a seek: packet counting read to the end, and not every
  // container seeks back to frame 0 exactly.
  OpenedVideo v = open_video(path);
  const AVStream* st = v.st();
  CodecPtr dec = open_decoder(st, path);
  auto pkt = new_packet();
  auto frame = new_frame();
  SwsPtr sws;
  FramePtr rgb;
  int64_t decoded = 0;  // frames out of the decoder so far = the next frame's index
  size_t next = 0;      // the next wanted position in out.indices
  std::string stop_reason;

  // Takes every frame the decoder has ready; false once the last wanted frame is converted.
  auto drain = [&]() -> bool {
    while (next < out.indices.size()) {
      int rc = avcodec_receive_frame(dec.get(), frame.get());
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return true;
      if (rc < 0) {  // a broken frame: skip it, as ffmpeg does
        stop_reason = av_error(rc);
        return true;
      }
      if (decoded == out.indices[next]) {
        MM_CHECK(int64_t(frame->width) * frame->height <= max_pixels_per_frame, "video: ", path, ": frame ",
                 decoded, " of ", frame->width, "x", frame->height, " exceeds the limit of ",
                 max_pixels_per_frame, " pixels");
        out.frames.push_back(to_rgb(frame.get(), sws, rgb, path));
        int64_t ts = frame->best_effort_timestamp;
        out.timestamps_s.push_back(ts == AV_NOPTS_VALUE ? decoded / info.fps : ts * av_q2d(st->time_base));
        ++next;
      }
      ++decoded;
      av_frame_unref(frame.get());
    }
    return false;
  };

  bool more = true;
  while (more) {
    int rc = av_read_frame(v.fmt.get(), pkt.get());
    if (rc < 0) {
      if (rc != AVERROR_EOF) stop_reason = av_error(rc);
      break;
    }
    if (pkt->stream_index == v.stream && pkt->size > 0) {
      rc = avcodec_send_packet(dec.get(), pkt.get());
      if (rc < 0 && rc != AVERROR(EAGAIN)) stop_reason = av_error(rc);  // corrupt packet: go on
      more = drain();
    }
    av_packet_unref(pkt.get());
  }
  if (more && avcodec_send_packet(dec.get(), nullptr) >= 0) drain();  // flush delayed frames

  MM_CHECK(next == out.indices.size(), "video: ", path, ": decoded only ", decoded, " of the ",
           info.num_frames, " frames the container states (frame ", out.indices[next], " was requested",
           stop_reason.empty() ? std::string() : "; last error: " + stop_reason, ")");
  return out;
}

#endif  // MM_NO_VIDEO

}  // namespace mm::data
