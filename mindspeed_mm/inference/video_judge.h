// An independent judge of moving Fashion-MNIST videos (the video quickstart's score): a small
// CNN trained here only on the 60,000 real Fashion-MNIST training images (never on clips or on
// anything a generator made), plus the garment's centroid track for the direction.
//
// Per clip: each frame in grey, pixels below `threshold` ignored; the centroid of what is left
// tracked over the frames: the direction is the larger axis of last - first centroid (left,
// right, up, down), "still" when it moves less than `min_travel` pixels. The class is the
// argmax of the classifier's probabilities averaged over the 28x28 crops centred on each
// frame's centroid. The classifier learns with random shifts of up to 3 pixels so that crops
// a few pixels off centre are still read right.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mm::inference {

struct JudgeOptions {
  std::string source_dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 2;
  int64_t batch_size = 128;
  double lr = 2e-3;
  uint64_t seed = 0;
  double threshold = 0.15;   // grey level (0..1) below which a pixel is background
  double min_travel = 4.0;   // pixels of centroid travel below which a clip is "still"
};

struct ClipVerdict {
  std::string path;
  int want_label = -1, want_direction = -1;  // from the record
  int label = -1, direction = -1;            // the judge's reading (-1 direction: still)
  double confidence = 0;                     // mean probability of `label`
  double dx = 0, dy = 0;                     // centroid travel in pixels
};

struct JudgeReport {
  double classifier_test_accuracy = 0;  // on the 10,000 real test images
  int64_t clips = 0, class_right = 0, direction_right = 0, both_right = 0;
  std::vector<int64_t> class_total = std::vector<int64_t>(10, 0), class_hits = std::vector<int64_t>(10, 0);
  std::vector<ClipVerdict> verdicts;
};

class FashionJudge {
 public:
  // Trains the classifier (deterministic in options.seed) and measures it on the real test set.
  // `log` gets a line per epoch.
  explicit FashionJudge(const JudgeOptions& options, const std::function<void(const std::string&)>& log = {});

  // [N, 28, 28] grey in [0, 1] -> class probabilities [N, 10].
  at::Tensor probabilities(const at::Tensor& images) const;
  // frames [T, H, W] grey in [0, 1] (H, W >= 28).
  ClipVerdict judge_frames(const at::Tensor& frames) const;
  // Every record of a JSONL of {"path", "cap"} (paths relative to the file; "label" and
  // "direction" fields, as `mm data moving-fashion-mnist` writes them, take precedence over the
  // caption). mm::Error naming the line for a caption that is not "a <class> moving <direction>"
  // or a video that does not decode.
  JudgeReport judge_jsonl(const std::string& path) const;

  double test_accuracy() const { return test_accuracy_; }

 private:
  at::Tensor logits(const at::Tensor& x) const;  // x [N, 1, 28, 28]
  JudgeOptions o_;
  std::vector<at::Tensor> params_;  // conv1 w, b, conv2 w, b, fc1 w, b, fc2 w, b
  double test_accuracy_ = 0;
};

// (label, direction) of a moving Fashion-MNIST caption, or (-1, -1) when it is not one.
std::pair<int, int> parse_moving_caption(const std::string& caption);

}  // namespace mm::inference
