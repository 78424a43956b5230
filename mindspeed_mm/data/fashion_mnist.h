// Fashion-MNIST as an "mllm" image dataset (`mm data fashion-mnist --out DIR`): reads the IDX
// files of Debian's dataset-fashion-mnist (gzip, big-endian headers: magic 2051 for images,
// 2049 for labels, then counts and 28x28 bytes per image) and writes each image as an RGB PNG
// (R = G = B = the gray value) plus one JSONL per split:
//
//   OUT/images/train/00000.png ...   OUT/images/test/00000.png ...
//   OUT/train.jsonl   OUT/test.jsonl   (paths relative to OUT, the media root)
//
// A JSONL line:
//   {"id":"train-00000","messages":[{"role":"user","content":"<image>What is shown in this
//    picture?"},{"role":"assistant","content":"Ankle boot"}],"images":["images/train/00000.png"],
//    "label":9}
//
// All four input files are read and validated before anything is written. Every file goes to a
// temporary name and is renamed, and the JSONL files come last, so an interrupted run leaves no
// JSONL pointing at missing or half-written images. Output bytes do not depend on `threads`;
// running twice gives identical files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mm::data {

struct FashionMnistOptions {
  std::string source_dir = "/usr/share/datasets/fashion-mnist";
  std::string out_dir;
  int64_t max_train = 0, max_test = 0;  // 0 = all (60000 / 10000); more than there are = all
  std::string question = "What is shown in this picture?";
  // The answers by label (10 names; empty = fashion_mnist_classes()), e.g. another language's
  // names for a second task on the same images.
  std::vector<std::string> answers;
  // Prepended to the JSONL names (PREFIXtrain.jsonl, PREFIXtest.jsonl): a second task beside the
  // first in the same folder, sharing its images (rewritten with the same bytes).
  std::string jsonl_prefix;
  int threads = 1;  // PNG encoding threads (0: one per hardware thread); output is identical
};

struct FashionMnistSummary {
  int64_t train = 0, test = 0;         // samples written
  std::string train_jsonl, test_jsonl;  // their paths
};

// mm::Error naming the file for a missing, truncated or corrupt input, a wrong magic number or
// image size, a label outside 0-9, or image and label files whose counts differ;
// mm::ConfigError for bad options (empty out_dir, negative counts, answers that are not 10
// non-empty UTF-8 names, a prefix with a path separator).
FashionMnistSummary write_fashion_mnist(const FashionMnistOptions& options);

// The ten class names of Fashion-MNIST's README, indexed by label: "T-shirt/top", "Trouser", ...
const std::vector<std::string>& fashion_mnist_classes();

// IDX readers (any gzip or plain IDX file; gzip's CRC is checked). Pixels are row-major,
// image after image: image i is pixels[i*rows*cols ...].
struct IdxImages {
  int64_t count = 0;
  int rows = 0, cols = 0;
  std::vector<uint8_t> pixels;
};
IdxImages read_idx_images(const std::string& path);
std::vector<uint8_t> read_idx_labels(const std::string& path);

}  // namespace mm::data
