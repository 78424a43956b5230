// Fashion-MNIST -> PNG + mllm JSONL (mindspeed_mm/data/fashion_mnist.h) on Debian's
// dataset-fashion-mnist: counts, labels and pixel sums checked against Python's gzip reading of
// the same IDX files (values hard-coded below), written PNGs decode to exactly the IDX pixels
// (read here independently with zlib), JSONL lines have the mllm shape, output bytes do not
// depend on the thread count or on running twice, and broken inputs fail naming the file.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/fashion_mnist.h"
#include "mindspeed_mm/data/media/image.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace mm::data;
using mm::test::fresh_dir;
using mm::test::read_file;

namespace {

const std::string kSource = "/usr/share/datasets/fashion-mnist";

#define SKIP_WITHOUT_DATA()                                                                   \
  if (!fs::exists(kSource + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << kSource << " missing " \
                                                                   "(apt install dataset-fashion-mnist)"

// A whole gzip file, decompressed: the test's own reader, independent of the library's.
std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_TRUE(f) << path;
  std::string out;
  if (!f) return out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  gzclose(f);
  return out;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Every regular file under dir, relative path -> bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = read_file(e.path().string());
  return files;
}

FashionMnistSummary write_subset(const std::string& out, int threads, const std::string& source = kSource) {
  FashionMnistOptions o;
  o.source_dir = source;
  o.out_dir = out;
  o.max_train = 200;
  o.max_test = 100;
  o.threads = threads;
  return write_fashion_mnist(o);
}

// A source folder of symlinks to the real files, with `broken_name` replaced by `broken_bytes`.
std::string source_with(const std::string& name, const std::string& broken_name, const std::string& broken_bytes) {
  std::string dir = fresh_dir(name);
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"})
    if (broken_name != f) fs::create_symlink(kSource + "/" + f, dir + "/" + f);
  mm::test::write_file(dir + "/" + broken_name, broken_bytes);
  return dir;
}

// Runs a write over `source` and returns the mm::Error's message ("" if none was thrown).
std::string error_of(const std::string& source, const std::string& out) {
  try {
    write_subset(out, 1, source);
  } catch (const mm::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(FashionMnist, ClassNames) {
  const auto& c = fashion_mnist_classes();
  ASSERT_EQ(c.size(), 10u);
  EXPECT_EQ(c[0], "T-shirt/top");
  EXPECT_EQ(c[5], "Sandal");
  EXPECT_EQ(c[9], "Ankle boot");
}

TEST(FashionMnist, SubsetCountsLabelsAndJsonl) {
  SKIP_WITHOUT_DATA();
  std::string out = fresh_dir("fashion_mnist_subset");
  FashionMnistSummary s = write_subset(out, 1);
  EXPECT_EQ(s.train, 200);
  EXPECT_EQ(s.test, 100);
  EXPECT_EQ(s.train_jsonl, out + "/train.jsonl");
  EXPECT_EQ(s.test_jsonl, out + "/test.jsonl");

  auto train = lines_of(s.train_jsonl), test = lines_of(s.test_jsonl);
  ASSERT_EQ(train.size(), 200u);
  ASSERT_EQ(test.size(), 100u);
  EXPECT_EQ(train[0],
            R"({"id":"train-00000","messages":[{"role":"user","content":"<image>What is shown in this picture?"},)"
            R"({"role":"assistant","content":"Ankle boot"}],"images":["images/train/00000.png"],"label":9})");

  // First labels per python3 gzip: train 9 0 0 3 0, test (t10k) 9 2 1 1 6.
  const std::vector<int> train_first = {9, 0, 0, 3, 0}, test_first = {9, 2, 1, 1, 6};
  std::map<int, int> histogram;
  for (size_t i = 0; i < train.size(); ++i) {
    auto j = nlohmann::json::parse(train[i]);
    char idx[24];
    std::snprintf(idx, sizeof(idx), "%05zu", i);
    EXPECT_EQ(j["id"], std::string("train-") + idx);
    ASSERT_EQ(j["messages"].size(), 2u);
    EXPECT_EQ(j["messages"][0]["role"], "user");
    EXPECT_EQ(j["messages"][0]["content"], "<image>What is shown in this picture?");
    EXPECT_EQ(j["messages"][1]["role"], "assistant");
    int label = j["label"];
    EXPECT_EQ(j["messages"][1]["content"], fashion_mnist_classes().at(label));
    EXPECT_EQ(j["images"], nlohmann::json::array({std::string("images/train/") + idx + ".png"}));
    EXPECT_TRUE(fs::exists(out + "/" + j["images"][0].get<std::string>()));
    if (i < 5) {
      EXPECT_EQ(label, train_first[i]) << i;
    }
    ++histogram[label];
  }
  // Label histogram of the first 200 training items, per python3.
  EXPECT_EQ(histogram, (std::map<int, int>{{0, 24}, {1, 26}, {2, 18}, {3, 17}, {4, 18},
                                           {5, 20}, {6, 21}, {7, 21}, {8, 16}, {9, 19}}));
  for (size_t i = 0; i < 5; ++i) {
    auto j = nlohmann::json::parse(test[i]);
    EXPECT_EQ(j["label"], test_first[i]) << i;
    EXPECT_EQ(j["id"].get<std::string>().rfind("test-", 0), 0u);
    EXPECT_EQ(j["images"][0].get<std::string>().rfind("images/test/", 0), 0u);
  }
  // Exactly the requested images, and no temporary files left behind.
  size_t pngs = 0, tmps = 0;
  for (const auto& e : fs::recursive_directory_iterator(out)) {
    pngs += e.path().extension() == ".png";
    tmps += e.path().extension() == ".tmp";
  }
  EXPECT_EQ(pngs, 300u);
  EXPECT_EQ(tmps, 0u);
}

TEST(FashionMnist, PngPixelsEqualIdxPixels) {
  SKIP_WITHOUT_DATA();
  std::string out = fresh_dir("fashion_mnist_pixels");
  write_subset(out, 2);
  for (auto [split, file, count, first_sum] : {std::tuple<std::string, std::string, int, int64_t>{"train", "train", 200, 76247},
                                              {"test", "t10k", 100, 33456}}) {
    std::string idx = gunzip(kSource + "/" + file + "-images-idx3-ubyte.gz");
    ASSERT_GE(idx.size(), 16u + 784u * count);
    int64_t sum = 0;
    for (int p = 0; p < 784; ++p) sum += static_cast<uint8_t>(idx[16 + p]);
    EXPECT_EQ(sum, first_sum) << split << ": pixel sum of item 0 per python3";
    for (int i : {0, 1, 37, count - 1}) {
      char name[16];
      std::snprintf(name, sizeof(name), "%05d.png", i);
      Image img = load_image(out + "/images/" + split + "/" + name);
      ASSERT_EQ(img.width, 28);
      ASSERT_EQ(img.height, 28);
      int mismatches = 0;
      for (int p = 0; p < 784; ++p) {
        uint8_t gray = static_cast<uint8_t>(idx[16 + 784 * i + p]);
        for (int c = 0; c < 3; ++c) mismatches += img.rgb[3 * p + c] != gray;
      }
      EXPECT_EQ(mismatches, 0) << split << " " << name;
    }
  }
}

TEST(FashionMnist, ThreadsAndRerunGiveIdenticalBytes) {
  SKIP_WITHOUT_DATA();
  std::string one = fresh_dir("fashion_mnist_threads1"), two = fresh_dir("fashion_mnist_threads2");
  write_subset(one, 1);
  write_subset(two, 2);
  auto a = snapshot(one), b = snapshot(two);
  EXPECT_EQ(a.size(), 302u);  // 300 PNGs + 2 JSONL
  EXPECT_TRUE(a == b) << "threads=1 and threads=2 outputs differ";
  write_subset(one, 2);  // again, over the first run's files
  EXPECT_TRUE(snapshot(one) == a) << "a second run changed the output";
}

TEST(FashionMnist, BadInputsNameTheFile) {
  SKIP_WITHOUT_DATA();
  const std::string train_images = "train-images-idx3-ubyte.gz", train_labels = "train-labels-idx1-ubyte.gz";
  std::string gz_images = read_file(kSource + "/" + train_images);

  struct Case {
    std::string name, file, bytes, expect;
  };
  std::string crc_broken = read_file(kSource + "/" + train_labels);
  crc_broken[crc_broken.size() - 6] ^= 0x5a;  // a byte of the gzip trailer's CRC-32
  std::vector<Case> cases = {
      {"truncated", train_images, gz_images.substr(0, 1000000), "truncated"},
      {"wrong_magic", train_images, read_file(kSource + "/" + train_labels), "magic 2049, expected 2051"},
      {"count_mismatch", train_labels, read_file(kSource + "/t10k-labels-idx1-ubyte.gz"), "10000 labels"},
      {"bad_crc", train_labels, crc_broken, "corrupt"},
      {"empty", train_labels, "", "truncated"},
  };
  for (const auto& c : cases) {
    std::string source = source_with("fashion_mnist_bad_" + c.name, c.file, c.bytes);
    std::string out = fresh_dir("fashion_mnist_bad_out_" + c.name);
    std::string msg = error_of(source, out);
    EXPECT_NE(msg.find(source + "/" + c.file), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.name << ": " << msg;
    EXPECT_FALSE(fs::exists(out + "/train.jsonl")) << c.name;
    EXPECT_FALSE(fs::exists(out + "/images")) << c.name << ": wrote images before validating the inputs";
  }

  std::string missing = error_of("/nonexistent/fashion-mnist", fresh_dir("fashion_mnist_bad_out_missing"));
  EXPECT_NE(missing.find("/nonexistent/fashion-mnist/train-labels-idx1-ubyte.gz"), std::string::npos) << missing;

  FashionMnistOptions no_out;
  EXPECT_THROW(write_fashion_mnist(no_out), mm::ConfigError);
  FashionMnistOptions negative;
  negative.out_dir = fresh_dir("fashion_mnist_bad_out_negative");
  negative.max_train = -1;
  EXPECT_THROW(write_fashion_mnist(negative), mm::ConfigError);
  FashionMnistOptions bad_question;
  bad_question.out_dir = negative.out_dir;
  bad_question.question = "what is \xff?";
  EXPECT_THROW(write_fashion_mnist(bad_question), mm::ConfigError);
}

// A second task on the same images (the LoRA example's German names): its own question and
// answers, JSONL under a prefix beside the first task's, images unchanged.
TEST(FashionMnist, SecondTaskAnswersAndPrefix) {
  SKIP_WITHOUT_DATA();
  std::string out = fresh_dir("fashion_mnist_second_task");
  write_subset(out, 1);
  const auto before = snapshot(out);
  FashionMnistOptions o;
  o.source_dir = kSource;
  o.out_dir = out;
  o.max_train = 200;
  o.max_test = 100;
  o.question = "Was ist auf diesem Bild?";
  o.answers = {"T-Shirt", "Hose", "Pullover", "Kleid", "Mantel", "Sandale", "Hemd", "Turnschuh", "Tasche", "Stiefelette"};
  o.jsonl_prefix = "de_";
  FashionMnistSummary s = write_fashion_mnist(o);
  EXPECT_EQ(s.train_jsonl, out + "/de_train.jsonl");
  EXPECT_EQ(s.test_jsonl, out + "/de_test.jsonl");
  auto train = lines_of(s.train_jsonl);
  ASSERT_EQ(train.size(), 200u);
  EXPECT_EQ(train[0],
            R"({"id":"train-00000","messages":[{"role":"user","content":"<image>Was ist auf diesem Bild?"},)"
            R"({"role":"assistant","content":"Stiefelette"}],"images":["images/train/00000.png"],"label":9})");
  for (const auto& line : train) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["messages"][1]["content"], o.answers.at(j["label"].get<int>()));
  }
  // The first task's files (JSONL and images) are as they were.
  auto after = snapshot(out);
  for (const auto& [name, bytes] : before) EXPECT_EQ(after.at(name), bytes) << name;
  EXPECT_EQ(after.size(), before.size() + 2);

  FashionMnistOptions nine = o;
  nine.answers.pop_back();
  try {
    write_fashion_mnist(nine);
    ADD_FAILURE() << "9 answers accepted";
  } catch (const mm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--answers needs 10 names"), std::string::npos) << e.what();
  }
  FashionMnistOptions empty_answer = o;
  empty_answer.answers[3] = "";
  try {
    write_fashion_mnist(empty_answer);
    ADD_FAILURE() << "an empty answer accepted";
  } catch (const mm::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("answer 3 (Dress)"), std::string::npos) << e.what();
  }
  FashionMnistOptions path_prefix = o;
  path_prefix.jsonl_prefix = "../de_";
  EXPECT_THROW(write_fashion_mnist(path_prefix), mm::ConfigError);
}
