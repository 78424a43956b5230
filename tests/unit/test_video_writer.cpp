// Writing generated videos (mindspeed_mm/data/media/video_writer.h): an H.264 MP4 of a moving
// square reads back through our FFmpeg decoder with the size, frame rate, frame count and codec
// written and pixels within the codec's loss; [-1, 1] videos map to uint8 frames; the contact
// sheet's layout; nothing appears at the path until close(); bad frames are clear errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/data/media/video.h"
#include "mindspeed_mm/data/media/video_writer.h"
#include "run_command.h"

using namespace mm::data;
namespace fs = std::filesystem;

namespace {

// A white 12x12 square moving right over a dark blue background.
at::Tensor moving_square(int frames, int h, int w) {
  at::Tensor f = at::zeros({frames, h, w, 3}, at::kByte);
  f.select(3, 2).fill_(90);
  for (int t = 0; t < frames; ++t) f[t].narrow(0, 10, 12).narrow(1, 2 + 2 * t, 12).fill_(235);
  return f;
}

}  // namespace

TEST(VideoWriter, Mp4ReadsBackAsWritten) {
  const std::string dir = mm::test::fresh_dir("video_writer");
  const at::Tensor frames = moving_square(17, 48, 64);
  {
    Mp4Writer w(dir + "/clip.mp4", 64, 48, 16.0);
    for (int t = 0; t < 5; ++t) w.add(frames[t]);
    EXPECT_FALSE(fs::exists(dir + "/clip.mp4"));  // only after close
  }
  EXPECT_FALSE(fs::exists(dir + "/clip.mp4"));  // abandoned: nothing left behind
  EXPECT_FALSE(fs::exists(dir + "/clip.mp4.tmp"));
  write_mp4(dir + "/clip.mp4", frames, 16.0);
  const VideoInfo info = probe_video(dir + "/clip.mp4");
  EXPECT_EQ(info.codec, "h264");
  EXPECT_EQ(info.width, 64);
  EXPECT_EQ(info.height, 48);
  EXPECT_DOUBLE_EQ(info.fps, 16.0);
  EXPECT_EQ(info.num_frames, 17);
  VideoSampling all;
  all.fps = 16;
  all.min_frames = 1;
  all.frame_factor = 1;
  const DecodedVideo v = decode_video(dir + "/clip.mp4", all);
  ASSERT_EQ(v.frames.size(), 17u);
  double err = 0;
  for (int t = 0; t < 17; ++t) {
    const at::Tensor got = at::from_blob(const_cast<uint8_t*>(v.frames[static_cast<size_t>(t)].rgb.data()), {48, 64, 3}, at::kByte);
    err = std::max(err, (got.to(at::kFloat) - frames[t].to(at::kFloat)).abs().mean().item<double>());
  }
  EXPECT_LT(err, 4.0);  // mean absolute error per frame, of 255
  std::printf("mp4 round trip: worst mean absolute pixel error %.2f of 255\n", err);

  EXPECT_THROW(Mp4Writer(dir + "/odd.mp4", 63, 48), mm::Error);
  Mp4Writer w(dir + "/bad.mp4", 64, 48);
  EXPECT_THROW(w.add(at::zeros({48, 64, 3}, at::kFloat)), mm::Error);
  EXPECT_THROW(w.add(at::zeros({40, 64, 3}, at::kByte)), mm::Error);
}

TEST(VideoWriter, Uint8FramesAndContactSheet) {
  at::Tensor video = at::zeros({3, 2, 4, 6});
  video[0].fill_(1.0);
  video[1].fill_(-1.0);
  video[2][1].fill_(0.5);
  const at::Tensor f = video_to_uint8_frames(video);
  ASSERT_EQ(f.sizes(), (std::vector<int64_t>{2, 4, 6, 3}));
  EXPECT_EQ(f[0][0][0][0].item<int>(), 255);
  EXPECT_EQ(f[0][0][0][1].item<int>(), 0);
  EXPECT_EQ(f[0][0][0][2].item<int>(), 128);  // 0 -> 127.5 rounds to 128
  EXPECT_EQ(f[1][0][0][2].item<int>(), 191);  // 0.5 -> 191.25

  const std::string dir = mm::test::fresh_dir("contact_sheet");
  write_contact_sheet(dir + "/sheet.png", moving_square(5, 48, 64), /*columns=*/3, /*gap=*/2);
  const Image sheet = load_image(dir + "/sheet.png");
  EXPECT_EQ(sheet.width, 3 * 64 + 2 * 2);
  EXPECT_EQ(sheet.height, 2 * 48 + 2);
  EXPECT_EQ(sheet.row(0)[64 * 3], 255);                      // the gap is white
  EXPECT_EQ(sheet.row(15)[(2 + 5) * 3], 235);                // frame 0's square
  EXPECT_EQ(sheet.row(48 + 2 + 15)[(66 * 2 + 2 + 4) * 3 + 0], 255);  // no sixth frame: white
}
