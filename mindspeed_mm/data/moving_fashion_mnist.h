// Moving Fashion-MNIST text-to-video data (`mm data moving-fashion-mnist --out DIR`): each clip
// is a Fashion-MNIST garment (Debian's dataset-fashion-mnist) sliding left, right, up or down
// over a black canvas at a constant speed, captioned "a sandal moving left". Written as H.264
// MP4 clips plus JSONL records for `mm data extract-features`:
//   OUT/clips/train/00000.mp4 ...   OUT/train.jsonl   OUT/test.jsonl
//   {"path": "clips/train/00000.mp4", "cap": "a sandal moving left", "label": 5, "direction": "left"}
// Classes and directions are drawn from a seeded generator (so each split covers every class x
// direction about equally); the start position puts the whole path inside the canvas. The
// JSONL files are written last, so an interrupted run leaves none pointing at missing clips.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mm::data {

struct MovingFashionMnistOptions {
  std::string source_dir = "/usr/share/datasets/fashion-mnist";
  std::string out_dir;
  int64_t train = 2000, test = 200;  // clips per split (garments from the matching split)
  int size = 64;                     // square canvas side, even
  int frames = 17;                   // 1 + 4k for Wan's VAE
  int speed = 2;                     // pixels per frame
  double fps = 16.0;
  uint64_t seed = 0;
};

// The directions in label order: 0 left, 1 right, 2 up, 3 down.
const std::vector<std::string>& moving_directions();
// The caption of a clip: "a sandal moving left", "an ankle boot moving up" (lower-case class
// name, "t-shirt/top" as "t-shirt").
std::string moving_caption(int label, int direction);

struct MovingFashionMnistSummary {
  int64_t train = 0, test = 0;
  std::string train_jsonl, test_jsonl;
};

// mm::ConfigError for options that cannot make a clip (the path longer than the canvas allows,
// frames not 1 + 4k, an odd size); mm::Error naming the file for unreadable Fashion-MNIST files.
MovingFashionMnistSummary write_moving_fashion_mnist(const MovingFashionMnistOptions& options);

}  // namespace mm::data
