// `mm data moving-fashion-mnist` (mindspeed_mm/data/moving_fashion_mnist.h): clips of Debian's
// Fashion-MNIST garments read back as H.264 with the asked size, frame count and rate; each
// caption names its label's class and a direction, and the garment's centroid really moves
// that way by speed x (frames - 1) pixels; bad options are config errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/media/video.h"
#include "mindspeed_mm/data/moving_fashion_mnist.h"
#include "run_command.h"

using namespace mm::data;

TEST(MovingFashionMnist, CaptionedClipsMoveAsTheyAreCaptioned) {
  const std::string dir = mm::test::fresh_dir("moving_fmnist");
  auto r = mm::test::run_command(mm::test::mm_binary() + " data moving-fashion-mnist --out " + dir +
                                 " --train 12 --test 4 --size 48 --frames 9 --speed 2 --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("12 train clips"), std::string::npos) << r.output;
  std::ifstream in(dir + "/train.jsonl");
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const int label = j["label"], direction = static_cast<int>(
        std::find(moving_directions().begin(), moving_directions().end(), j["direction"].get<std::string>()) -
        moving_directions().begin());
    EXPECT_EQ(j["cap"], moving_caption(label, direction));
    VideoSampling all;
    all.fps = 16;
    all.min_frames = 1;
    all.frame_factor = 1;
    const DecodedVideo v = decode_video(dir + "/" + j["path"].get<std::string>(), all);
    ASSERT_EQ(v.frames.size(), 9u);
    EXPECT_EQ(v.info.width, 48);
    EXPECT_DOUBLE_EQ(v.info.fps, 16.0);
    // The brightness-weighted centroid of the first and last frame.
    auto centroid = [](const Image& im) {
      double sx = 0, sy = 0, s = 0;
      for (int y = 0; y < im.height; ++y)
        for (int x = 0; x < im.width; ++x) {
          const double w = im.row(y)[x * 3];
          sx += w * x, sy += w * y, s += w;
        }
      return std::make_pair(sx / s, sy / s);
    };
    const auto [x0, y0] = centroid(v.frames.front());
    const auto [x1, y1] = centroid(v.frames.back());
    const double dx = x1 - x0, dy = y1 - y0;
    const double want[4][2] = {{-16, 0}, {16, 0}, {0, -16}, {0, 16}};
    EXPECT_NEAR(dx, want[direction][0], 1.5) << line;
    EXPECT_NEAR(dy, want[direction][1], 1.5) << line;
  }
  EXPECT_EQ(n, 12);
  EXPECT_EQ(moving_caption(0, 0), "a t-shirt moving left");
  EXPECT_EQ(moving_caption(9, 3), "an ankle boot moving down");

  MovingFashionMnistOptions o;
  o.out_dir = dir + "/bad";
  o.frames = 8;
  EXPECT_THROW(write_moving_fashion_mnist(o), mm::ConfigError);
  o.frames = 17;
  o.size = 32;
  EXPECT_THROW(write_moving_fashion_mnist(o), mm::ConfigError);  // 28 + 32 pixels of travel > 32
}
