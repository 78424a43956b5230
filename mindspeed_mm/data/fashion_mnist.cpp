// Fashion-MNIST IDX files -> PNG images + mllm JSONL (see fashion_mnist.h).
#include "mindspeed_mm/data/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/parallel_for.h"
#include "mindspeed_mm/data/media/image.h"

namespace fs = std::filesystem;

namespace mm::data {

namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dimension

// One open gzip (or plain) file, read with exact-length reads that name the file on failure.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    MM_CHECK(f_, path, ": cannot open (Fashion-MNIST comes from Debian's dataset-fashion-mnist)");
    gzbuffer(f_, 1 << 18);
  }
  ~GzReader() { gzclose(f_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads exactly n bytes; `what` names them in the error ("the header", "60000 images"). The
  // buffer grows as data arrives, so a header claiming absurd counts fails as truncated, not
  // as an allocation of gigabytes.
  std::vector<uint8_t> read(size_t n, const std::string& what) {
    std::vector<uint8_t> out;
    out.reserve(std::min<size_t>(n, kChunk));
    while (out.size() < n) {
      size_t before = out.size();
      size_t want = std::min(n - before, kChunk);
      out.resize(before + want);
      int r = gzread(f_, out.data() + before, static_cast<unsigned>(want));
      if (r < 0) fail_corrupt();
      out.resize(before + static_cast<size_t>(r));
      if (r == 0) break;
    }
    if (out.size() < n) {
      int err = Z_OK;
      gzerror(f_, &err);
      if (err != Z_OK && err != Z_BUF_ERROR) fail_corrupt();  // Z_BUF_ERROR: the gzip stream ends early
      throw Error(cat(path_, ": truncated: expected ", n, " bytes (", what, "), got ", out.size(),
                      err == Z_BUF_ERROR ? cat(" (", zlib_message(), ")") : std::string()));
    }
    return out;
  }


  // After the declared items the file must end; reading on also makes zlib check gzip's CRC.
  void expect_end(const std::string& what) {
    uint8_t extra;
    int r = gzread(f_, &extra, 1);
    if (r < 0) fail_corrupt();
    MM_CHECK(r == 0, path_, ": longer than its header says (", what, ")");
    check_stream();
  }

 private:
  static constexpr size_t kChunk = size_t(16) << 20;

  void check_stream() {
    int err = Z_OK;
    gzerror(f_, &err);
    if (err == Z_BUF_ERROR) throw Error(cat(path_, ": truncated gzip stream (", zlib_message(), ")"));
    if (err != Z_OK && err != Z_STREAM_END) fail_corrupt();
  }
  [[noreturn]] void fail_corrupt() { throw Error(cat(path_, ": corrupt gzip data (", zlib_message(), ")")); }
  // gzerror's text without the "path: " it puts in front.
  std::string zlib_message() {
    int err = Z_OK;
    const char* raw = gzerror(f_, &err);
    std::string msg = raw ? raw : "unknown zlib error";
    if (msg.rfind(path_ + ": ", 0) == 0) msg.erase(0, path_.size() + 2);
    return msg;
  }

  std::string path_;
  gzFile f_;
};

// IDX headers are big-endian 32-bit words.
uint32_t be32(const std::vector<uint8_t>& b, size_t word) {
  const uint8_t* p = b.data() + 4 * word;
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

void check_magic(uint32_t got, uint32_t want, const std::string& path, const char* kind) {
  MM_CHECK(got == want, path, ": not an IDX ", kind, " file (magic ", got, ", expected ", want,
           got == (want == kImagesMagic ? kLabelsMagic : kImagesMagic) ? "; images and labels swapped?" : "",
           ")");
}

struct Split {
  std::string name;  // "train" or "test": the folder, the id prefix and the JSONL name
  IdxImages images;
  std::vector<uint8_t> labels;
  int64_t count = 0;  // samples to write
};

Split read_split(const std::string& source_dir, const std::string& name, const std::string& file_prefix,
                 int64_t max_count) {
  Split s;
  s.name = name;
  std::string labels_path = (fs::path(source_dir) / (file_prefix + "-labels-idx1-ubyte.gz")).string();
  std::string images_path = (fs::path(source_dir) / (file_prefix + "-images-idx3-ubyte.gz")).string();
  s.labels = read_idx_labels(labels_path);
  s.images = read_idx_images(images_path);
  MM_CHECK(s.images.rows == 28 && s.images.cols == 28, images_path, ": Fashion-MNIST images are 28x28, this file has ",
           s.images.rows, "x", s.images.cols);
  MM_CHECK(s.images.count == static_cast<int64_t>(s.labels.size()), images_path, " holds ", s.images.count,
           " images but ", labels_path, " holds ", s.labels.size(), " labels");
  for (size_t i = 0; i < s.labels.size(); ++i)
    MM_CHECK(s.labels[i] < fashion_mnist_classes().size(), labels_path, ": label ", int(s.labels[i]), " of item ",
             i, " is outside 0-9");
  s.count = max_count > 0 ? std::min(max_count, s.images.count) : s.images.count;
  return s;
}

std::string index_name(int64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%05lld", static_cast<long long>(i));
  return buf;
}

void write_pngs(const Split& s, const fs::path& out_dir, int threads) {
  fs::path dir = out_dir / "images" / s.name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  MM_CHECK(!ec, dir.string(), ": cannot create directory (", ec.message(), ")");
  const size_t pixels = static_cast<size_t>(s.images.rows) * s.images.cols;
  parallel_for(static_cast<size_t>(s.count), threads, [&](size_t i) {
    Image img(s.images.cols, s.images.rows);
    const uint8_t* gray = s.images.pixels.data() + i * pixels;
    for (size_t p = 0; p < pixels; ++p) img.rgb[3 * p] = img.rgb[3 * p + 1] = img.rgb[3 * p + 2] = gray[p];
    save_png(img, (dir / (index_name(static_cast<int64_t>(i)) + ".png")).string());
  });
}

// Returns the JSONL's path. Key order is part of the format, hence ordered_json.
std::string write_jsonl(const Split& s, const fs::path& out_dir, const FashionMnistOptions& options) {
  const std::vector<std::string>& answers = options.answers.empty() ? fashion_mnist_classes() : options.answers;
  std::string path = (out_dir / (options.jsonl_prefix + s.name + ".jsonl")).string();
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MM_CHECK(out, tmp, ": cannot write");
    for (int64_t i = 0; i < s.count; ++i) {
      std::string idx = index_name(i);
      nlohmann::ordered_json line;
      line["id"] = s.name + "-" + idx;
      nlohmann::ordered_json user, assistant;
      user["role"] = "user";
      user["content"] = "<image>" + options.question;
      assistant["role"] = "assistant";
      assistant["content"] = answers[s.labels[i]];
      line["messages"] = nlohmann::ordered_json::array({user, assistant});
      line["images"] = nlohmann::ordered_json::array({"images/" + s.name + "/" + idx + ".png"});
      line["label"] = static_cast<int>(s.labels[i]);
      out << line.dump() << '\n';
    }
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(cat(path, ": writing failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(cat(path, ": cannot rename ", tmp, " into place"));
  }
  return path;
}

}  // namespace

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

IdxImages read_idx_images(const std::string& path) {
  GzReader in(path);
  std::vector<uint8_t> header = in.read(16, "the header");
  check_magic(be32(header, 0), kImagesMagic, path, "images");
  IdxImages r;
  r.count = be32(header, 1);
  uint32_t rows = be32(header, 2), cols = be32(header, 3);
  MM_CHECK(rows > 0 && cols > 0 && rows <= 4096 && cols <= 4096, path, ": implausible image size ", rows, "x", cols);
  r.rows = static_cast<int>(rows);
  r.cols = static_cast<int>(cols);
  std::string what = cat(r.count, " images of ", rows, "x", cols, " after the header");
  r.pixels = in.read(static_cast<size_t>(r.count) * rows * cols, what);
  in.expect_end(what);
  return r;
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  GzReader in(path);
  std::vector<uint8_t> header = in.read(8, "the header");
  check_magic(be32(header, 0), kLabelsMagic, path, "labels");
  uint32_t count = be32(header, 1);
  std::string what = cat(count, " labels after the header");
  std::vector<uint8_t> labels = in.read(count, what);
  in.expect_end(what);
  return labels;
}

FashionMnistSummary write_fashion_mnist(const FashionMnistOptions& options) {
  if (options.out_dir.empty()) throw ConfigError("fashion-mnist: an output directory is required (--out DIR)");
  if (options.max_train < 0 || options.max_test < 0)
    throw ConfigError(cat("fashion-mnist: sample limits must be >= 0 (got max_train=", options.max_train,
                          ", max_test=", options.max_test, ")"));
  if (options.threads < 0) throw ConfigError(cat("fashion-mnist: threads must be >= 0 (got ", options.threads, ")"));
  // The JSONL writer refuses text that is not UTF-8: ask it first.
  auto utf8 = [](const std::string& s) {
    try {
      (void)nlohmann::json(s).dump();
      return true;
    } catch (const nlohmann::json::exception&) {
      return false;
    }
  };
  if (!utf8(options.question)) throw ConfigError("fashion-mnist: the question is not valid UTF-8");
  if (!options.answers.empty()) {
    if (options.answers.size() != fashion_mnist_classes().size())
      throw ConfigError(cat("fashion-mnist: --answers needs 10 names, one per label (got ", options.answers.size(), ")"));
    for (size_t i = 0; i < options.answers.size(); ++i)
      if (options.answers[i].empty() || !utf8(options.answers[i]))
        throw ConfigError(cat("fashion-mnist: answer ", i, " (", fashion_mnist_classes()[i], ") is empty or not UTF-8"));
  }
  if (options.jsonl_prefix.find_first_of("/\\") != std::string::npos)
    throw ConfigError(cat("fashion-mnist: the JSONL prefix '", options.jsonl_prefix, "' must be a file name prefix, not a path"));

  // Validate every input before writing anything.
  Split train = read_split(options.source_dir, "train", "train", options.max_train);
  Split test = read_split(options.source_dir, "test", "t10k", options.max_test);

  fs::path out(options.out_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  MM_CHECK(!ec, options.out_dir, ": cannot create output directory (", ec.message(), ")");
  write_pngs(train, out, options.threads);
  write_pngs(test, out, options.threads);

  FashionMnistSummary summary;
  summary.train = train.count;
  summary.test = test.count;
  summary.train_jsonl = write_jsonl(train, out, options);
  summary.test_jsonl = write_jsonl(test, out, options);
  return summary;
}

}  // namespace mm::data
