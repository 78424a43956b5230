#include "mindspeed_mm/data/media/video_writer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libavutil/log.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/image.h"

namespace fs = std::filesystem;

namespace mm::data {

namespace {

std::string av_error(int code) {
  char buf[256];
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

}  // namespace

struct Mp4Writer::Impl {
  std::string path, tmp;
  int width = 0, height = 0;
  AVFormatContext* fmt = nullptr;
  AVCodecContext* codec = nullptr;
  AVStream* stream = nullptr;
  AVFrame* frame = nullptr;
  AVPacket* packet = nullptr;
  SwsContext* sws = nullptr;
  int64_t next_pts = 0;
  bool closed = false;

  void fail(const std::string& what, int rc) const {
    throw Error(cat("video: ", path, ": ", what, rc < 0 ? cat(" (", av_error(rc), ")") : std::string()));
  }

  // Sends frame f (null: flush) and writes what the encoder gives back.
  void encode(AVFrame* f) {
    int rc = avcodec_send_frame(codec, f);
    if (rc < 0) fail("the H.264 encoder refused a frame", rc);
    while (true) {
      rc = avcodec_receive_packet(codec, packet);
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return;
      if (rc < 0) fail("encoding failed", rc);
      av_packet_rescale_ts(packet, codec->time_base, stream->time_base);
      packet->stream_index = stream->index;
      rc = av_interleaved_write_frame(fmt, packet);
      if (rc < 0) fail("cannot write a packet", rc);
    }
  }

  void release() {
    if (sws) sws_freeContext(sws);
    if (frame) av_frame_free(&frame);
    if (packet) av_packet_free(&packet);
    if (codec) avcodec_free_context(&codec);
    if (fmt) {
      if (fmt->pb) avio_closep(&fmt->pb);
      avformat_free_context(fmt);
    }
    sws = nullptr;
    fmt = nullptr;
  }
};

Mp4Writer::Mp4Writer(std::string path, int width, int height, double fps, int crf) : impl_(std::make_unique<Impl>()) {
  static std::once_flag quiet;
  std::call_once(quiet, [] { av_log_set_level(AV_LOG_ERROR); });  // libx264's statistics are not for our users
  Impl& m = *impl_;
  m.path = std::move(path);
  m.tmp = m.path + ".tmp";
  m.width = width;
  m.height = height;
  if (width <= 0 || height <= 0 || width % 2 || height % 2)
    throw Error(cat("video: ", m.path, ": frames of ", width, "x", height, " pixels: H.264 (yuv420p) needs even sides"));
  if (!(fps > 0)) throw Error(cat("video: ", m.path, ": fps must be > 0 (got ", fps, ")"));
  std::error_code ec;
  if (fs::path(m.path).has_parent_path()) fs::create_directories(fs::path(m.path).parent_path(), ec);
  int rc = avformat_alloc_output_context2(&m.fmt, nullptr, "mp4", m.tmp.c_str());
  if (rc < 0 || !m.fmt) m.fail("cannot set up an MP4 container", rc);
  const AVCodec* enc = avcodec_find_encoder_by_name("libx264");
  if (!enc) enc = avcodec_find_encoder(AV_CODEC_ID_H264);
  if (!enc) m.fail("this FFmpeg has no H.264 encoder", 0);
  m.stream = avformat_new_stream(m.fmt, nullptr);
  m.codec = avcodec_alloc_context3(enc);
  if (!m.stream || !m.codec) m.fail("out of memory", 0);
  // A rational frame rate: 16 -> 16/1, 23.976 -> 23976/1000.
  const AVRational rate = av_d2q(fps, 100000);
  m.codec->width = width;
  m.codec->height = height;
  m.codec->pix_fmt = AV_PIX_FMT_YUV420P;
  m.codec->time_base = av_inv_q(rate);
  m.codec->framerate = rate;
  m.codec->gop_size = 12;
  if (m.fmt->oformat->flags & AVFMT_GLOBALHEADER) m.codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  if (std::string(enc->name) == "libx264") {
    av_opt_set(m.codec->priv_data, "preset", "medium", 0);
    av_opt_set(m.codec->priv_data, "crf", std::to_string(crf).c_str(), 0);
  }
  rc = avcodec_open2(m.codec, enc, nullptr);
  if (rc < 0) m.fail("cannot open the H.264 encoder", rc);
  rc = avcodec_parameters_from_context(m.stream->codecpar, m.codec);
  if (rc < 0) m.fail("cannot set the stream parameters", rc);
  m.stream->time_base = m.codec->time_base;
  m.stream->avg_frame_rate = rate;
  rc = avio_open(&m.fmt->pb, m.tmp.c_str(), AVIO_FLAG_WRITE);
  if (rc < 0) m.fail("cannot create the file", rc);
  rc = avformat_write_header(m.fmt, nullptr);
  if (rc < 0) m.fail("cannot write the MP4 header", rc);
  m.frame = av_frame_alloc();
  m.packet = av_packet_alloc();
  m.frame->format = AV_PIX_FMT_YUV420P;
  m.frame->width = width;
  m.frame->height = height;
  rc = av_frame_get_buffer(m.frame, 0);
  if (rc < 0) m.fail("cannot allocate a frame", rc);
  m.sws = sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height, AV_PIX_FMT_YUV420P, SWS_BICUBIC, nullptr, nullptr,
                         nullptr);
  if (!m.sws) m.fail("cannot set up RGB to YUV conversion", 0);
}

Mp4Writer::~Mp4Writer() {
  if (!impl_) return;
  impl_->release();
  if (!impl_->closed) {
    std::error_code ec;
    fs::remove(impl_->tmp, ec);
  }
}

int64_t Mp4Writer::frames() const { return impl_->next_pts; }

void Mp4Writer::add(const at::Tensor& frame) {
  Impl& m = *impl_;
  if (m.closed) m.fail("add after close", 0);
  if (frame.scalar_type() != at::kByte || frame.dim() != 3 || frame.size(0) != m.height || frame.size(1) != m.width ||
      frame.size(2) != 3)
    throw Error(cat("video: ", m.path, ": a frame must be uint8 [", m.height, ", ", m.width, ", 3], got ",
                    frame.scalar_type(), " ", frame.sizes()));
  const at::Tensor rgb = frame.contiguous().cpu();
  int rc = av_frame_make_writable(m.frame);
  if (rc < 0) m.fail("cannot reuse a frame", rc);
  const uint8_t* src[1] = {rgb.data_ptr<uint8_t>()};
  const int stride[1] = {3 * m.width};
  sws_scale(m.sws, src, stride, 0, m.height, m.frame->data, m.frame->linesize);
  m.frame->pts = m.next_pts++;
  m.encode(m.frame);
}

void Mp4Writer::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  m.encode(nullptr);
  const int rc = av_write_trailer(m.fmt);
  if (rc < 0) m.fail("cannot finish the MP4", rc);
  m.release();
  std::error_code ec;
  fs::rename(m.tmp, m.path, ec);
  if (ec) throw Error(cat("video: ", m.path, ": cannot move the finished file into place: ", ec.message()));
  m.closed = true;
}

at::Tensor video_to_uint8_frames(const at::Tensor& video) {
  if (video.scalar_type() == at::kByte) return video;
  MM_CHECK(video.dim() == 4 && video.size(0) == 3, "video: expected [3, frames, height, width], got ", video.sizes());
  // [-1, 1] -> [0, 255] rounded, as diffusers' video processor (postprocess then * 255 round).
  return ((video.to(at::kFloat).clamp(-1, 1) + 1) * 127.5).round().to(at::kByte).permute({1, 2, 3, 0}).contiguous();
}

void write_mp4(const std::string& path, const at::Tensor& frames, double fps) {
  MM_CHECK(frames.dim() == 4 && frames.size(3) == 3, "video: ", path, ": frames must be [T, H, W, 3], got ", frames.sizes());
  Mp4Writer w(path, static_cast<int>(frames.size(2)), static_cast<int>(frames.size(1)), fps);
  for (int64_t t = 0; t < frames.size(0); ++t) w.add(frames[t]);
  w.close();
}

void write_contact_sheet(const std::string& path, const at::Tensor& frames, int columns, int gap) {
  MM_CHECK(frames.dim() == 4 && frames.size(3) == 3 && frames.scalar_type() == at::kByte && frames.size(0) > 0,
           "contact sheet: ", path, ": frames must be uint8 [T, H, W, 3], got ", frames.sizes());
  const int n = static_cast<int>(frames.size(0)), h = static_cast<int>(frames.size(1)), w = static_cast<int>(frames.size(2));
  const int cols = std::max(1, std::min(columns, n)), rows = (n + cols - 1) / cols;
  Image sheet(cols * w + (cols - 1) * gap, rows * h + (rows - 1) * gap);
  std::fill(sheet.rgb.begin(), sheet.rgb.end(), uint8_t{255});
  const at::Tensor f = frames.contiguous().cpu();
  for (int i = 0; i < n; ++i) {
    const uint8_t* src = f[i].data_ptr<uint8_t>();
    const int x0 = (i % cols) * (w + gap), y0 = (i / cols) * (h + gap);
    for (int y = 0; y < h; ++y) std::copy(src + static_cast<size_t>(y) * w * 3, src + static_cast<size_t>(y + 1) * w * 3,
                                          sheet.row(y0 + y) + static_cast<size_t>(x0) * 3);
  }
  save_png(sheet, path);
}

}  // namespace mm::data
