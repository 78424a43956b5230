#include "mindspeed_mm/data/moving_fashion_mnist.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "mindspeed_mm/checkpoint/safetensors.h"
#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/fashion_mnist.h"
#include "mindspeed_mm/data/media/video_writer.h"
#include "mindspeed_mm/data/sampler.h"

namespace fs = std::filesystem;

namespace mm::data {

const std::vector<std::string>& moving_directions() {
  static const std::vector<std::string> d = {"left", "right", "up", "down"};
  return d;
}

std::string moving_caption(int label, int direction) {
  std::string name = fashion_mnist_classes().at(static_cast<size_t>(label));
  if (name == "T-shirt/top") name = "t-shirt";
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool vowel = std::string("aeiou").find(name[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + name + " moving " + moving_directions().at(static_cast<size_t>(direction));
}

MovingFashionMnistSummary write_moving_fashion_mnist(const MovingFashionMnistOptions& o) {
  if (o.out_dir.empty()) throw ConfigError("config: moving-fashion-mnist: --out is required");
  if (o.size <= 0 || o.size % 2) throw ConfigError(cat("config: moving-fashion-mnist: --size ", o.size, " must be even"));
  if (o.frames < 1 || (o.frames - 1) % 4)
    throw ConfigError(cat("config: moving-fashion-mnist: --frames ", o.frames, " must be 1 + 4k (Wan's VAE)"));
  const int travel = o.speed * (o.frames - 1);
  if (28 + travel > o.size)
    throw ConfigError(cat("config: moving-fashion-mnist: a 28-pixel garment moving ", travel, " pixels does not fit a ",
                          o.size, "-pixel canvas (lower --speed or --frames, or raise --size)"));
  MovingFashionMnistSummary sum;
  for (const std::string split : {"train", "test"}) {
    const std::string prefix = split == "train" ? "train" : "t10k";
    const IdxImages images = read_idx_images(o.source_dir + "/" + prefix + "-images-idx3-ubyte.gz");
    const std::vector<uint8_t> labels = read_idx_labels(o.source_dir + "/" + prefix + "-labels-idx1-ubyte.gz");
    const int64_t n = split == "train" ? o.train : o.test;
    const std::string clip_dir = o.out_dir + "/clips/" + split;
    fs::create_directories(clip_dir);
    SplitMix64 rng(o.seed * 1000003 + (split == "train" ? 1 : 2));
    std::string jsonl;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = static_cast<int64_t>(rng.below(static_cast<uint64_t>(images.count)));
      const int direction = static_cast<int>(rng.below(4));
      const int label = labels[static_cast<size_t>(k)];
      // The start so that the whole path stays inside; the other axis anywhere.
      const int free = o.size - 28;
      const int across = static_cast<int>(rng.below(static_cast<uint64_t>(free + 1)));
      const int along0 = static_cast<int>(rng.below(static_cast<uint64_t>(free - travel + 1)));
      at::Tensor clip = at::zeros({o.frames, o.size, o.size, 3}, at::kByte);
      const at::Tensor garment =
          at::from_blob(const_cast<uint8_t*>(images.pixels.data()) + k * 28 * 28, {28, 28}, at::kByte).unsqueeze(-1).expand({28, 28, 3});
      for (int t = 0; t < o.frames; ++t) {
        const int along = direction % 2 == 0 ? along0 + travel - t * o.speed : along0 + t * o.speed;  // left/up: decreasing
        const int x = direction < 2 ? along : across, y = direction < 2 ? across : along;
        clip[t].narrow(0, y, 28).narrow(1, x, 28).copy_(garment);
      }
      char name[32];
      std::snprintf(name, sizeof(name), "%05lld.mp4", static_cast<long long>(i));
      write_mp4(clip_dir + "/" + name, clip, o.fps);
      nlohmann::json r = {{"path", "clips/" + split + "/" + name}, {"cap", moving_caption(label, direction)},
                          {"label", label}, {"direction", moving_directions()[static_cast<size_t>(direction)]}};
      jsonl += r.dump() + "\n";
    }
    const std::string path = o.out_dir + "/" + split + ".jsonl";
    st::write_file_atomic(path, jsonl);
    (split == "train" ? sum.train : sum.test) = n;
    (split == "train" ? sum.train_jsonl : sum.test_jsonl) = path;
  }
  return sum;
}

}  // namespace mm::data
