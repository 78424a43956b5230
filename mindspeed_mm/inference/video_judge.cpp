#include "mindspeed_mm/inference/video_judge.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/fashion_mnist.h"
#include "mindspeed_mm/data/media/video.h"
#include "mindspeed_mm/data/moving_fashion_mnist.h"
#include "mindspeed_mm/core/strings.h"
#include "mindspeed_mm/core/file_io.h"

namespace fs = std::filesystem;

namespace mm::inference {
namespace {

constexpr int kShift = 3;  // training crops move up to this many pixels each way

// [N, 28, 28] float in [0, 1] from IDX bytes.
at::Tensor idx_to_float(const data::IdxImages& images) {
  return at::from_blob(const_cast<uint8_t*>(images.pixels.data()), {images.count, 28, 28}, at::kByte).to(at::kFloat).div_(255.0);
}

at::Tensor uniform(at::IntArrayRef shape, double bound, at::Generator& gen) {
  return at::empty(shape, at::kFloat).uniform_(-bound, bound, gen);
}

}  // namespace

std::pair<int, int> parse_moving_caption(const std::string& caption) {
  for (int label = 0; label < 10; ++label)
    for (int d = 0; d < 4; ++d)
      if (data::moving_caption(label, d) == caption) return {label, d};
  return {-1, -1};
}

FashionJudge::FashionJudge(const JudgeOptions& o, const std::function<void(const std::string&)>& log) : o_(o) {
  const std::string dir = o.source_dir;
  const data::IdxImages train_images = data::read_idx_images(dir + "/train-images-idx3-ubyte.gz");
  const std::vector<uint8_t> train_labels = data::read_idx_labels(dir + "/train-labels-idx1-ubyte.gz");
  const data::IdxImages test_images = data::read_idx_images(dir + "/t10k-images-idx3-ubyte.gz");
  const std::vector<uint8_t> test_labels = data::read_idx_labels(dir + "/t10k-labels-idx1-ubyte.gz");
  if (train_images.rows != 28 || train_images.cols != 28 || static_cast<int64_t>(train_labels.size()) != train_images.count)
    throw Error(cat("judge: ", dir, ": the training images are not 28x28 with one label each"));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  // PyTorch's default initialisation of Conv2d and Linear: U(+-1/sqrt(fan_in)).
  auto layer = [&](std::vector<int64_t> shape) {
    int64_t fan_in = 1;
    for (size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    params_.push_back(uniform(shape, bound, gen).requires_grad_(true));
    params_.push_back(uniform({shape[0]}, bound, gen).requires_grad_(true));
  };
  layer({16, 1, 3, 3});
  layer({32, 16, 3, 3});
  layer({128, 32 * 7 * 7});
  layer({10, 128});

  const at::Tensor x_all = at::constant_pad_nd(idx_to_float(train_images), {kShift, kShift, kShift, kShift});
  const at::Tensor y_all = at::from_blob(const_cast<uint8_t*>(train_labels.data()), {train_images.count}, at::kByte).to(at::kLong);
  std::vector<at::Tensor> m, v;
  for (const at::Tensor& p : params_) m.push_back(at::zeros_like(p)), v.push_back(at::zeros_like(p));
  std::mt19937 shifts(static_cast<uint32_t>(o.seed));
  std::uniform_int_distribution<int> pick(0, 2 * kShift);
  const int64_t n = train_images.count, steps_per_epoch = n / o.batch_size, total = steps_per_epoch * o.epochs;
  int64_t step = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const at::Tensor order = at::randperm(n, gen, at::kLong);
    double loss_sum = 0;
    for (int64_t b = 0; b < steps_per_epoch; ++b, ++step) {
      const at::Tensor idx = order.narrow(0, b * o.batch_size, o.batch_size);
      const at::Tensor padded = x_all.index_select(0, idx);
      at::Tensor x = at::empty({o.batch_size, 1, 28, 28}, at::kFloat);
      for (int64_t i = 0; i < o.batch_size; ++i) x[i][0].copy_(padded[i].narrow(0, pick(shifts), 28).narrow(1, pick(shifts), 28));
      const at::Tensor loss = at::cross_entropy_loss(logits(x), y_all.index_select(0, idx));
      for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
      loss.backward();
      loss_sum += loss.item<double>();
      // Adam (0.9, 0.999), the rate decayed linearly to zero over the run.
      at::NoGradGuard no_grad;
      const double lr = o.lr * (1.0 - static_cast<double>(step) / static_cast<double>(total));
      const double bc1 = 1 - std::pow(0.9, step + 1), bc2 = 1 - std::pow(0.999, step + 1);
      for (size_t k = 0; k < params_.size(); ++k) {
        const at::Tensor g = params_[k].grad();
        m[k].mul_(0.9).add_(g, 0.1);
        v[k].mul_(0.999).addcmul_(g, g, 0.001);
        params_[k].sub_(m[k] / bc1 / ((v[k] / bc2).sqrt() + 1e-8) * lr);
      }
    }
    if (log) log(cat("judge: epoch ", epoch + 1, "/", o.epochs, ": training loss ", loss_sum / static_cast<double>(steps_per_epoch)));
  }
  for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor(), p.requires_grad_(false);
  const at::Tensor probs = probabilities(idx_to_float(test_images));
  const at::Tensor want = at::from_blob(const_cast<uint8_t*>(test_labels.data()), {test_images.count}, at::kByte).to(at::kLong);
  test_accuracy_ = probs.argmax(1).eq(want).to(at::kDouble).mean().item<double>();
}

at::Tensor FashionJudge::logits(const at::Tensor& x) const {
  at::Tensor h = at::max_pool2d(at::relu(at::conv2d(x, params_[0], params_[1], 1, 1)), 2);
  h = at::max_pool2d(at::relu(at::conv2d(h, params_[2], params_[3], 1, 1)), 2);
  h = at::relu(at::linear(h.flatten(1), params_[4], params_[5]));
  return at::linear(h, params_[6], params_[7]);
}

at::Tensor FashionJudge::probabilities(const at::Tensor& images) const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (int64_t s = 0; s < images.size(0); s += 1000)
    out.push_back(at::softmax(logits(images.narrow(0, s, std::min<int64_t>(1000, images.size(0) - s)).unsqueeze(1)), 1));
  return at::cat(out);
}

ClipVerdict FashionJudge::judge_frames(const at::Tensor& frames_in) const {
  const at::Tensor frames = frames_in.to(at::kFloat);
  const int64_t t = frames.size(0), h = frames.size(1), w = frames.size(2);
  const at::Tensor weight = at::relu(frames - o_.threshold);
  const at::Tensor ys = at::arange(h, at::kFloat).view({1, h, 1}), xs = at::arange(w, at::kFloat).view({1, 1, w});
  const at::Tensor mass = weight.sum({1, 2});
  std::vector<double> cx(static_cast<size_t>(t)), cy(static_cast<size_t>(t));
  const at::Tensor padded = at::constant_pad_nd(frames, {28, 28, 28, 28});
  at::Tensor crops = at::empty({t, 28, 28}, at::kFloat);
  for (int64_t i = 0; i < t; ++i) {
    const double m = mass[i].item<double>();
    cx[static_cast<size_t>(i)] = m > 1e-6 ? (weight[i] * xs[0]).sum().item<double>() / m : (w - 1) / 2.0;
    cy[static_cast<size_t>(i)] = m > 1e-6 ? (weight[i] * ys[0]).sum().item<double>() / m : (h - 1) / 2.0;
    const int64_t x0 = std::llround(cx[static_cast<size_t>(i)] - 13.5) + 28, y0 = std::llround(cy[static_cast<size_t>(i)] - 13.5) + 28;
    crops[i].copy_(padded[i].narrow(0, std::clamp<int64_t>(y0, 0, h + 28), 28).narrow(1, std::clamp<int64_t>(x0, 0, w + 28), 28));
  }
  ClipVerdict v;
  const at::Tensor p = probabilities(crops).mean(0);
  v.label = static_cast<int>(p.argmax().item<int64_t>());
  v.confidence = p[v.label].item<double>();
  v.dx = cx.back() - cx.front();
  v.dy = cy.back() - cy.front();
  if (std::max(std::abs(v.dx), std::abs(v.dy)) >= o_.min_travel)
    v.direction = std::abs(v.dx) >= std::abs(v.dy) ? (v.dx < 0 ? 0 : 1) : (v.dy < 0 ? 2 : 3);
  return v;
}

JudgeReport FashionJudge::judge_jsonl(const std::string& path) const {
  if (const std::string why = file_problem(path); !why.empty()) throw Error(cat("judge: ", path, ": ", why));
  std::ifstream in(path);
  if (!in) throw Error(cat("judge: ", path, ": cannot open"));
  JudgeReport r;
  r.classifier_test_accuracy = test_accuracy_;
  const fs::path root = fs::path(path).parent_path();
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = cat(path, ":", line_no);
    nlohmann::json rec;
    try {
      rec = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat("judge: ", where, ": not JSON (", json_error_text(e.what()), ")"));
    }
    if (!rec.is_object() || !rec.contains("path") || !rec["path"].is_string())
      throw Error(cat("judge: ", where, ": a record needs a \"path\" string"));
    auto [label, direction] = parse_moving_caption(rec.value("cap", ""));
    if (rec.contains("label") && rec["label"].is_number_integer()) label = rec["label"].get<int>();
    if (rec.contains("direction") && rec["direction"].is_string()) {
      const auto& names = data::moving_directions();
      const auto it = std::find(names.begin(), names.end(), rec["direction"].get<std::string>());
      direction = it == names.end() ? -1 : static_cast<int>(it - names.begin());
    }
    if (label < 0 || label >= 10 || direction < 0)
      throw Error(cat("judge: ", where, ": \"", rec.value("cap", ""), "\" is not a moving Fashion-MNIST caption (\"a sandal moving left\")"));
    const fs::path video = fs::path(rec["path"].get<std::string>()).is_absolute() ? fs::path(rec["path"].get<std::string>())
                                                                                   : root / rec["path"].get<std::string>();
    data::DecodedVideo d;
    try {
      d = data::decode_video_frames(video.string(), [](const data::VideoInfo& info) {
        std::vector<int64_t> all(static_cast<size_t>(info.num_frames));
        for (int64_t i = 0; i < info.num_frames; ++i) all[static_cast<size_t>(i)] = i;
        return all;
      });
    } catch (const Error& e) {
      throw Error(cat("judge: ", where, ": ", e.what()));
    }
    if (d.frames.empty() || d.frames[0].width < 28 || d.frames[0].height < 28)
      throw Error(cat("judge: ", where, ": ", video.string(), ": needs frames of at least 28x28"));
    const int64_t hgt = d.frames[0].height, wid = d.frames[0].width;
    at::Tensor grey = at::empty({static_cast<int64_t>(d.frames.size()), hgt, wid}, at::kFloat);
    for (size_t i = 0; i < d.frames.size(); ++i) {
      const at::Tensor rgb = at::from_blob(d.frames[i].rgb.data(), {hgt, wid, 3}, at::kByte);
      grey[static_cast<int64_t>(i)].copy_(rgb.to(at::kFloat).mean(2).div_(255.0));
    }
    ClipVerdict v = judge_frames(grey);
    v.path = rec["path"].get<std::string>();
    v.want_label = label;
    v.want_direction = direction;
    ++r.clips;
    ++r.class_total[static_cast<size_t>(label)];
    const bool c = v.label == label, dir = v.direction == direction;
    r.class_right += c;
    r.class_hits[static_cast<size_t>(label)] += c;
    r.direction_right += dir;
    r.both_right += c && dir;
    r.verdicts.push_back(v);
  }
  if (r.clips == 0) throw Error(cat("judge: ", path, ": no records"));
  return r;
}

}  // namespace mm::inference
