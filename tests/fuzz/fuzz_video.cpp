// Video opening and frame seeking through FFmpeg: any bytes as a file; probe, then decode a
// few frames chosen by Qwen2-VL's sampling and, separately, the last frame the index claims.
#include "fuzz_util.h"
#include "mindspeed_mm/data/media/video.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mm::fuzz::write("in.video", {reinterpret_cast<const char*>(data), size});
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const mm::data::VideoInfo info = mm::data::probe_video(path);
    if (info.num_frames < 0 || info.width < 0 || info.height < 0) __builtin_trap();
  });
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    mm::data::VideoSampling s;
    s.max_frames = 4;
    const mm::data::DecodedVideo v = mm::data::decode_video(path, s, int64_t(1) << 20);
    if (v.frames.size() != v.indices.size()) __builtin_trap();
    for (const auto& f : v.frames)
      if (f.rgb.size() != static_cast<size_t>(f.width) * f.height * 3) __builtin_trap();
  });
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    (void)mm::data::decode_video_frames(
        path, [](const mm::data::VideoInfo& i) { return std::vector<int64_t>{std::max<int64_t>(0, i.num_frames - 1)}; },
        int64_t(1) << 20);
  });
  return 0;
}
