// The mllm data pipeline (mindspeed_mm/data/mllm/, loader, sampler grouping): record parsing and
// attribute remapping, mixtures, the LLaVA converter, sample encoding with images and
// image-safe truncation, collation (padding, packing), packed-vs-single losses on the Qwen2
// model, and the threaded loader's determinism, resume and bad-sample accounting.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/loader.h"
#include "mindspeed_mm/data/media/image.h"
#include "mindspeed_mm/data/mllm/mllm_collator.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/sample_encoder.h"
#include "mindspeed_mm/data/tokenizer/byte_chat_tokenizer.h"
#include "mindspeed_mm/models/common/attention.h"
#include "mindspeed_mm/models/common/cross_entropy.h"
#include "mindspeed_mm/models/qwen2/qwen2.h"
#include "mm_test_paths.h"

namespace fs = std::filesystem;
using namespace mm::data;

namespace {

fs::path scratch(const std::string& name) {
  fs::path p = fs::path(MM_BUILD_DIR) / "test_scratch" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

// A w x h test image with a gradient, so resizes are not trivial.
void write_png(const fs::path& p, int w, int h) {
  Image im(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* px = im.row(y) + 3 * x;
      px[0] = static_cast<uint8_t>(x * 255 / std::max(1, w - 1));
      px[1] = static_cast<uint8_t>(y * 255 / std::max(1, h - 1));
      px[2] = static_cast<uint8_t>((x + y) % 256);
    }
  save_png(im, p.string());
}

std::string vqa_line(const std::string& image, const std::string& answer) {
  return R"({"messages":[{"role":"user","content":"<image>What is shown?"},{"role":"assistant","content":")" + answer +
         R"("}],"images":[")" + image + R"("]})";
}

SampleEncoderOptions small_qwen_options() {
  SampleEncoderOptions o;
  o.media.min_pixels = 28 * 28;
  o.media.max_pixels = 56 * 56;
  return o;
}

}  // namespace

TEST(MllmData, ReadsRecordsAndReportsBadOnes) {
  fs::path dir = scratch("mllm_read");
  write(dir / "train.jsonl",
        vqa_line("a.png", "cat") + "\n"
        "{not json\n"
        "\n" +
        R"({"messages":[{"role":"user","content":"<image><image>two?"},{"role":"assistant","content":"x"}],"images":["a.png"]})"
        "\n" +
        R"({"messages":[{"role":"user","content":"text only"},{"role":"assistant","content":"ok"}],"system":"Be brief."})"
        "\n" +
        R"({"messages":[{"role":"robot","content":"hi"}]})" "\n" +
        R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"<image>"}],"images":["a.png"]})" "\n" +
        R"({"messages":[{"role":"user","content":"<video>clip"},{"role":"assistant","content":"v"}],"videos":["/abs/v.mp4"]})"
        "\n");
  MllmFile f = read_mllm_file((dir / "train.jsonl").string());
  ASSERT_EQ(f.records.size(), 3u);
  ASSERT_EQ(f.bad.size(), 4u);
  EXPECT_EQ(f.bad[0].source, "train.jsonl:2");
  EXPECT_EQ(f.bad[0].reason, "not valid JSON");
  EXPECT_EQ(f.bad[1].source, "train.jsonl:4");
  EXPECT_EQ(f.bad[1].reason, "2 <image> placeholder(s) but 1 image(s)");
  EXPECT_EQ(f.bad[2].source, "train.jsonl:6");
  EXPECT_EQ(f.bad[3].reason, "an <image>/<video> placeholder in an assistant turn");
  EXPECT_EQ(f.records[0].source, "train.jsonl:1");
  EXPECT_EQ(f.records[0].images[0], (dir / "a.png").string());  // relative to the file's folder
  ASSERT_EQ(f.records[1].messages.size(), 3u);
  EXPECT_EQ(f.records[1].messages[0].role, "system");
  EXPECT_EQ(f.records[1].messages[0].content, "Be brief.");
  EXPECT_EQ(f.records[2].videos[0], "/abs/v.mp4");
  EXPECT_EQ(f.records[2].source, "train.jsonl:8");  // absolute paths stay

  // A media root overrides the file's folder.
  MllmFile g = read_mllm_file((dir / "train.jsonl").string(), {}, "/data/media");
  EXPECT_EQ(g.records[0].images[0], "/data/media/a.png");
}

TEST(MllmData, RemapsShareGptAttributesAndReadsJsonArrays) {
  fs::path dir = scratch("mllm_attr");
  write(dir / "sharegpt.json", R"([{"conversations":[{"from":"human","value":"<image>hi"},{"from":"gpt","value":"yo"}],
                                   "pics":["p.jpg"]}, 5])");
  MllmAttr a;
  a.messages = "conversations";
  a.images = "pics";
  a.role_tag = "from";
  a.content_tag = "value";
  a.user_tag = "human";
  a.assistant_tag = "gpt";
  MllmFile f = read_mllm_file((dir / "sharegpt.json").string(), a);
  ASSERT_EQ(f.records.size(), 1u);
  EXPECT_EQ(f.records[0].messages[0].role, "user");
  EXPECT_EQ(f.records[0].messages[1].content, "yo");
  EXPECT_EQ(f.records[0].source, "sharegpt.json[0]");
  ASSERT_EQ(f.bad.size(), 1u);
  EXPECT_EQ(f.bad[0].source, "sharegpt.json[1]");
  write(dir / "broken.json", "[{\"messages\": ");
  EXPECT_THROW(read_mllm_file((dir / "broken.json").string()), mm::Error);
  EXPECT_THROW(read_mllm_file((dir / "missing.jsonl").string()), mm::Error);
}

TEST(MllmData, MixtureWeights) {
  // Equal weights: every record once, grouped by dataset.
  auto m = build_mixture({3, 2}, {}, 1);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[3].dataset, 1);
  EXPECT_EQ(m[4].index, 1);
  // Weights 2 and 0.5 over sizes 4 and 8: n0 = 8 (every record twice), n1 = 4 of the 8 (a subset).
  auto w = build_mixture({4, 8}, {2, 0.5}, 7);
  std::map<int, int64_t> per;
  std::map<std::pair<int, int64_t>, int> seen;
  for (auto& e : w) {
    per[e.dataset]++;
    seen[{e.dataset, e.index}]++;
  }
  EXPECT_EQ(per[0], 8);
  EXPECT_EQ(per[1], 4);
  for (int64_t k = 0; k < 4; ++k) EXPECT_EQ((seen[{0, k}]), 2);
  for (auto& [key, count] : seen)
    if (key.first == 1) EXPECT_EQ(count, 1);
  EXPECT_EQ(build_mixture({4, 8}, {2, 0.5}, 7).size(), w.size());
  EXPECT_EQ(build_mixture({4, 8}, {0, 1}, 7).size(), 8u);
  EXPECT_THROW(build_mixture({4, 8}, {1}, 7), mm::Error);
  EXPECT_THROW(build_mixture({4}, {-1}, 7), mm::Error);
  EXPECT_THROW(build_mixture({0}, {}, 7), mm::Error);
  EXPECT_THROW(build_mixture({4}, {0}, 7), mm::Error);
}

TEST(MllmData, ConvertsLlava) {
  fs::path dir = scratch("mllm_llava");
  write(dir / "llava.json", R"([
    {"id": "0", "image": "coco/1.jpg", "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A dog."}]},
    {"id": "1", "image": "coco/2.jpg", "conversations": [{"from": "human", "value": "Where?"}, {"from": "gpt", "value": "Park."}]},
    {"id": "2", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
    {"id": "3", "conversations": [{"from": "alien", "value": "?"}]}
  ])");
  ConvertSummary s = convert_llava((dir / "llava.json").string(), (dir / "out.jsonl").string());
  EXPECT_EQ(s.written, 3);
  ASSERT_EQ(s.bad.size(), 1u);
  EXPECT_EQ(s.bad[0].source, "llava.json[3]");
  MllmFile f = read_mllm_file((dir / "out.jsonl").string());
  ASSERT_EQ(f.records.size(), 3u);
  EXPECT_TRUE(f.bad.empty());
  EXPECT_EQ(f.records[1].messages[0].content, "<image>\nWhere?");  // placeholder added
  EXPECT_EQ(f.records[0].images[0], (dir / "coco/1.jpg").string());
  EXPECT_TRUE(f.records[2].images.empty());
}

TEST(MllmData, ByteChatTokenizer) {
  auto t = byte_chat_tokenizer();
  EXPECT_EQ(t.tokenizer.vocab_size(), 263);
  auto ids = t.tokenizer.encode("h\xc3\xa9<|im_start|> \n", false);
  EXPECT_EQ(ids, (std::vector<int64_t>{'h', 0xC3, 0xA9, 257, ' ', '\n'}));
  EXPECT_EQ(t.tokenizer.decode(ids, false), "h\xc3\xa9<|im_start|> \n");
  EXPECT_EQ(*t.tokenizer.token_to_id("<|image_pad|>"), 261);
}

TEST(MllmData, EncodesImagesAndTruncatesOnlyBetweenThem) {
  fs::path dir = scratch("mllm_encode");
  write_png(dir / "a.png", 56, 56);  // smart_resize keeps 56x56: grid (1, 4, 4) -> 4 merged tokens
  write(dir / "d.jsonl", vqa_line("a.png", "cat") + "\n" + vqa_line("missing.png", "dog") + "\n");
  MllmFile f = read_mllm_file((dir / "d.jsonl").string());
  SampleEncoder enc(byte_chat_tokenizer(), small_qwen_options());
  EncodedSample s = enc.encode(f.records[0]);
  ASSERT_TRUE(s.pixel_values.defined());
  EXPECT_EQ(s.pixel_values.sizes(), (at::IntArrayRef{16, 3 * 2 * 14 * 14}));
  EXPECT_EQ(s.image_grid_thw.sizes(), (at::IntArrayRef{1, 3}));
  EXPECT_EQ(s.image_grid_thw[0][1].item<int64_t>(), 4);
  const int64_t pads = std::count(s.input_ids.begin(), s.input_ids.end(), enc.image_pad_id());
  EXPECT_EQ(pads, 4);
  // Labels: "cat<|im_end|>" only.
  EXPECT_EQ(s.num_labels(), 4);
  EXPECT_EQ(enc.tokenizer().decode({s.labels.end() - 5, s.labels.end() - 1}, false), "cat<|im_end|>");

  // The missing image is a bad sample naming the record and the file.
  try {
    enc.encode(f.records[1]);
    FAIL() << "no error for a missing image";
  } catch (const mm::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("d.jsonl:2: ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing.png"), std::string::npos) << e.what();
  }

  // Image first, then a long answer: cutting inside the image block moves the cut before
  // <|vision_start|> and drops the image, leaving no labels -> bad. Cutting after the image
  // keeps it whole.
  const auto vs = std::find(s.input_ids.begin(), s.input_ids.end(), 259) - s.input_ids.begin();
  auto o = small_qwen_options();
  o.cutoff_len = vs + 3;  // inside the pads
  SampleEncoder cut(byte_chat_tokenizer(), o);
  EXPECT_THROW(cut.encode(f.records[0]), mm::Error);
  o.cutoff_len = static_cast<int64_t>(s.input_ids.size()) - 2;  // inside the answer
  SampleEncoder tail(byte_chat_tokenizer(), o);
  EncodedSample t = tail.encode(f.records[0]);
  EXPECT_EQ(static_cast<int64_t>(t.input_ids.size()), o.cutoff_len);
  EXPECT_EQ(t.pixel_values.size(0), 16);
  EXPECT_EQ(t.num_labels(), 3);  // "cat"; <|im_end|> and the newline after it are cut
  // Two images, cut inside the second: the first survives with its pixels only.
  write(dir / "two.jsonl", R"({"messages":[{"role":"user","content":"<image>a"},{"role":"assistant","content":"b"},)"
                           R"({"role":"user","content":"<image>c"},{"role":"assistant","content":"d"}],"images":["a.png","a.png"]})" "\n");
  MllmRecord two = read_mllm_file((dir / "two.jsonl").string()).records[0];
  EncodedSample full = enc.encode(two);
  EXPECT_EQ(full.pixel_values.size(0), 32);
  const auto second_pad = std::find(full.input_ids.rbegin(), full.input_ids.rend(), enc.image_pad_id()) - full.input_ids.rbegin();
  o.cutoff_len = static_cast<int64_t>(full.input_ids.size()) - second_pad - 2;
  EncodedSample one = SampleEncoder(byte_chat_tokenizer(), o).encode(two);
  EXPECT_EQ(one.pixel_values.size(0), 16);
  EXPECT_EQ(one.image_grid_thw.size(0), 1);
  EXPECT_EQ(std::count(one.input_ids.begin(), one.input_ids.end(), enc.image_pad_id()), 4);
  EXPECT_NE(one.input_ids.back(), 259);  // no dangling <|vision_start|>
  EXPECT_EQ(one.num_labels(), 2);        // "b<|im_end|>"
  // skip mode: too long is a bad sample.
  o.truncation = "skip";
  EXPECT_THROW(SampleEncoder(byte_chat_tokenizer(), o).encode(two), mm::Error);
}

TEST(MllmData, FixedProcessorResizesShortestEdgeAndCrops) {
  Image im(90, 60);
  for (size_t i = 0; i < im.rgb.size(); ++i) im.rgb[i] = static_cast<uint8_t>(i * 7);
  Image out = resize_shortest_and_crop(im, 32);
  EXPECT_EQ(out.width, 32);
  EXPECT_EQ(out.height, 32);
  fs::path dir = scratch("mllm_fixed");
  write_png(dir / "a.png", 40, 30);
  write(dir / "d.jsonl", vqa_line("a.png", "x") + "\n");
  SampleEncoderOptions o;
  o.chat_template = "qwen2vl";
  o.media.type = "fixed";
  o.media.image_size = 28;
  o.media.image_tokens = 5;
  SampleEncoder enc(byte_chat_tokenizer(), o);
  EncodedSample s = enc.encode(read_mllm_file((dir / "d.jsonl").string()).records[0]);
  EXPECT_EQ(s.pixel_values.sizes(), (at::IntArrayRef{1, 3, 28, 28}));
  EXPECT_FALSE(s.image_grid_thw.defined());
  EXPECT_EQ(std::count(s.input_ids.begin(), s.input_ids.end(), enc.image_pad_id()), 5);
}

namespace {

EncodedSample synthetic(int64_t index, int64_t len) {
  EncodedSample s;
  for (int64_t t = 0; t < len; ++t) {
    s.input_ids.push_back((index * 31 + t * 7) % 250 + 1);
    s.labels.push_back(t < len / 3 ? kIgnoreLabel : s.input_ids.back());
  }
  s.source = "synthetic:" + std::to_string(index);
  return s;
}

}  // namespace

TEST(MllmData, CollatesPaddedAndPacked) {
  std::vector<EncodedSample> v = {synthetic(0, 5), synthetic(1, 3)};
  Batch p = collate_samples(v, {false, 4, 0});
  EXPECT_EQ(p[mm::data::kInputIds].sizes(), (at::IntArrayRef{2, 8}));
  EXPECT_EQ(p[mm::data::kAttentionMask].sum().item<int64_t>(), 8);
  // Shifted: labels[s] = sample label[s + 1]; the last real position predicts nothing.
  EXPECT_EQ(p[mm::data::kLabels][0][3].item<int64_t>(), v[0].labels[4]);
  EXPECT_EQ(p[mm::data::kLabels][0][4].item<int64_t>(), kIgnoreLabel);
  EXPECT_EQ(p[mm::data::kLabels][1][1].item<int64_t>(), v[1].labels[2]);

  Batch k = collate_samples(v, {true, 1, 0});
  EXPECT_EQ(k[mm::data::kInputIds].sizes(), (at::IntArrayRef{1, 8}));
  ASSERT_EQ(k[mm::data::kCuSeqlens].numel(), 3);
  EXPECT_EQ(k[mm::data::kCuSeqlens][1].item<int>(), 5);
  EXPECT_EQ(k[mm::data::kCuSeqlens][2].item<int>(), 8);
  EXPECT_EQ(k[mm::data::kPositionIds][0][5].item<int64_t>(), 0);  // restarts for the second sample
  EXPECT_EQ(k[mm::data::kSegmentIds][0][4].item<int64_t>(), 0);
  EXPECT_EQ(k[mm::data::kSegmentIds][0][5].item<int64_t>(), 1);
  EXPECT_EQ(k[mm::data::kLabels][0][4].item<int64_t>(), kIgnoreLabel);  // never the next sample's first token
  Batch k4 = collate_samples(v, {true, 16, 0});
  EXPECT_EQ(k4[mm::data::kInputIds].size(1), 16);
  EXPECT_EQ(k4[mm::data::kSegmentIds][0][10].item<int64_t>(), -1);
  EXPECT_THROW(collate_samples({}, {}), mm::Error);
}

// Per-sample mean loss of sample `seg` in a batch (segment seg of row 0 when packed, else row seg).
double sample_loss(const at::Tensor& logits, const Batch& b, int64_t seg) {
  at::Tensor lg = logits, lab = b[mm::data::kLabels];
  if (b[mm::data::kSegmentIds].defined()) {
    lab = b[mm::data::kLabels].masked_fill(b[mm::data::kSegmentIds].ne(seg), mm::models::kIgnoreIndex);
  } else {
    lg = logits.narrow(0, seg, 1);
    lab = b[mm::data::kLabels].narrow(0, seg, 1);
  }
  return mm::models::lm_cross_entropy(lg, lab).item<double>();
}

TEST(MllmData, PackedLossEqualsOneByOneOnQwen2) {
  mm::models::Qwen2Config c;
  c.vocab_size = 263;
  c.hidden_size = 48;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  mm::models::Qwen2ForCausalLM model(c);
  model.init_weights(3);
  at::NoGradGuard no_grad;
  std::vector<EncodedSample> v = {synthetic(0, 37), synthetic(1, 12), synthetic(2, 25), synthetic(3, 50)};
  Batch packed = collate_samples(v, {true, 8, 0});
  at::Tensor packed_logits = model.forward(packed[mm::data::kInputIds], packed[mm::data::kPositionIds],
                                           mm::models::segment_attention_mask(packed[mm::data::kSegmentIds]));
  Batch padded = collate_samples(v, {false, 1, 0});
  at::Tensor padded_logits = model.forward(padded[mm::data::kInputIds], padded[mm::data::kPositionIds]);
  double max_diff = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    Batch alone = collate_samples({v[i]}, {false, 1, 0});
    const double ref = sample_loss(model.forward(alone[mm::data::kInputIds]), alone, 0);
    const double p = sample_loss(packed_logits, packed, i), q = sample_loss(padded_logits, padded, i);
    EXPECT_NEAR(p, ref, 1e-5) << "sample " << i;
    EXPECT_NEAR(q, ref, 1e-5) << "sample " << i;
    max_diff = std::max({max_diff, std::abs(p - ref), std::abs(q - ref)});
    EXPECT_GT(ref, 1.0);  // a real loss, not an empty selection
  }
  // Without the segment mask the packed samples would see each other: the losses move.
  at::Tensor leaky = model.forward(packed[mm::data::kInputIds], packed[mm::data::kPositionIds]);
  EXPECT_GT(std::abs(sample_loss(leaky, packed, 1) - sample_loss(packed_logits, packed, 1)), 1e-4);
  std::printf("packed vs one-by-one: max |loss difference| %.3g over %zu samples\n", max_diff, v.size());
}

namespace {

// A loader over synthetic samples; indices in `bad` throw like a corrupt file would.
std::unique_ptr<DataLoader> synthetic_loader(int64_t n, std::set<int64_t> bad, int workers, int64_t batch,
                                             bool packing = false, double max_bad = 0.5) {
  auto encode = [bad](int64_t i) -> EncodedSample {
    if (bad.count(i)) throw mm::Error(mm::cat("synthetic:", i, ": image 'x.png': corrupt"));
    return synthetic(i, 3 + (i * 13) % 17);
  };
  CollatorOptions co{packing, 1, 0};
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.num_workers = workers;
  lo.prefetch = 3;
  lo.max_bad_fraction = max_bad;
  lo.min_samples_for_bad_check = 20;
  return std::make_unique<DataLoader>(n, encode, [co](const std::vector<EncodedSample>& s) { return collate_samples(s, co); },
                                      ResumableSampler(n, 99, true), lo);
}

std::vector<std::vector<int64_t>> take(DataLoader& l, int k) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < k; ++i) {
    Batch b = l.next();
    const at::Tensor& t = b[mm::data::kInputIds];
    std::vector<int64_t> ids(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    ids.push_back(t.size(1));
    out.push_back(ids);
  }
  return out;
}

}  // namespace

TEST(MllmData, LoaderOrderIsTheSameForAnyWorkerCount) {
  const std::set<int64_t> bad = {3, 4, 17, 40};
  auto ref = take(*synthetic_loader(50, bad, 0, 4), 30);  // 2.4 epochs
  for (int w : {1, 2, 4}) {
    auto got = take(*synthetic_loader(50, bad, w, 4), 30);
    EXPECT_EQ(got, ref) << w << " workers";
  }
  auto packed0 = take(*synthetic_loader(50, bad, 0, 3, true), 10);
  EXPECT_EQ(take(*synthetic_loader(50, bad, 2, 3, true), 10), packed0);
}

TEST(MllmData, LoaderResumesExactly) {
  const std::set<int64_t> bad = {5, 6};
  auto full = take(*synthetic_loader(40, bad, 2, 3), 20);
  auto first = synthetic_loader(40, bad, 2, 3);
  take(*first, 8);  // prefetching runs ahead; the state must still be "after batch 8"
  nlohmann::json st = first->state();
  auto resumed = synthetic_loader(40, bad, 1, 3);
  resumed->load_state(st);
  auto rest = take(*resumed, 12);
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(full.begin() + 8, full.end()));
  EXPECT_EQ(resumed->stats().batches, 20);
}

TEST(MllmData, LoaderSkipsAndCountsBadSamples) {
  const std::set<int64_t> bad = {0, 1, 9, 30, 31, 32};
  auto l = synthetic_loader(60, bad, 2, 5);
  take(*l, 12);  // exactly one epoch: every index is drawn once
  EXPECT_EQ(l->stats().samples, 60);
  EXPECT_EQ(static_cast<int64_t>(l->stats().bad.size()), 6);
  for (int64_t i : bad) ASSERT_TRUE(l->stats().bad.count(i)) << i;
  EXPECT_NE(l->stats().bad.at(9).find("synthetic:9: image 'x.png': corrupt"), std::string::npos);
  // Too many bad samples: a clear error, no hang, for both the threaded and the inline loader.
  std::set<int64_t> many;
  for (int64_t i = 0; i < 60; i += 2) many.insert(i);
  for (int w : {0, 2}) {
    auto m = synthetic_loader(60, many, w, 5, false, 0.2);
    try {
      take(*m, 12);
      FAIL() << "no error with half the samples bad";
    } catch (const mm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("more than data.max_bad_fraction 0.2"), std::string::npos) << e.what();
    }
  }
}

TEST(MllmData, LengthGroupingSortsWithinGroups) {
  std::vector<int64_t> lengths(40);
  for (int64_t i = 0; i < 40; ++i) lengths[i] = (i * 17) % 23;
  ResumableSampler s(40, 5, true);
  s.group_by_length(lengths, 10);
  auto order = s.next_n(40);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 40; ++i) ASSERT_EQ(sorted[i], i);  // still a permutation
  for (int g = 0; g < 4; ++g)
    for (int j = 1; j < 10; ++j) EXPECT_GE(lengths[order[g * 10 + j - 1]], lengths[order[g * 10 + j]]);
  ResumableSampler plain(40, 5, true);
  EXPECT_NE(plain.next_n(40), order);
}

TEST(MllmData, LoaderShardsByDataParallelRank) {
  // Two ranks of one run: disjoint halves of each epoch whose union is every sample.
  auto encode = [](int64_t i) { return synthetic(i, 4); };
  CollatorOptions co{false, 1, 0};
  LoaderOptions lo;
  lo.batch_size = 3;
  std::set<int64_t> seen;
  for (int64_t rank : {0, 1}) {
    DataLoader l(30, encode, [co](const std::vector<EncodedSample>& s) { return collate_samples(s, co); },
                 ResumableSampler(30, 8, true, rank, 2), lo);
    for (int b = 0; b < 5; ++b) {
      Batch batch = l.next();
      for (int64_t r = 0; r < batch.num_samples; ++r) {
        const int64_t index = std::stoll(batch.sources[r].substr(batch.sources[r].find(':') + 1));
        EXPECT_TRUE(seen.insert(index).second) << "sample " << index << " on both ranks";
      }
    }
  }
  EXPECT_EQ(seen.size(), 30u);
}

TEST(MllmData, LoaderEdgeCases) {
  // A state that does not fit is an error and leaves the loader working.
  auto l = synthetic_loader(40, {}, 2, 4);
  take(*l, 2);
  nlohmann::json other = synthetic_loader(30, {}, 1, 4)->state();
  EXPECT_THROW(l->load_state(other), mm::Error);
  EXPECT_EQ(take(*l, 1).size(), 1u);  // no hang

  // A record repeated by a mixture (keys 0..9 twice) is bad once, however often it is drawn.
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.num_workers = 2;
  lo.max_bad_fraction = 0.5;
  lo.sample_key = [](int64_t i) { return i % 10; };
  CollatorOptions co{false, 1, 0};
  DataLoader mix(20, [](int64_t i) -> EncodedSample {
    if (i % 10 == 3) throw mm::Error("mix:3: corrupt");
    return synthetic(i, 5);
  }, [co](const std::vector<EncodedSample>& s) { return collate_samples(s, co); }, ResumableSampler(20, 4, true), lo);
  take(mix, 5);  // one epoch
  EXPECT_EQ(mix.stats().bad.size(), 1u);
  EXPECT_EQ(mix.stats().bad_attempts, 2);

  // Anything but a data error (here std::bad_alloc) stops the run instead of replacing samples.
  lo.sample_key = nullptr;
  DataLoader oom(20, [](int64_t i) -> EncodedSample {
    if (i == 7) throw std::bad_alloc();
    return synthetic(i, 5);
  }, [co](const std::vector<EncodedSample>& s) { return collate_samples(s, co); }, ResumableSampler(20, 4, false), lo);
  EXPECT_THROW(take(oom, 5), std::bad_alloc);
}

TEST(MllmData, LengthGroupingIsPartOfTheSamplerState) {
  std::vector<int64_t> lengths(20, 1);
  ResumableSampler a(20, 5, true);
  a.group_by_length(lengths, 10);
  a.next_n(7);
  ResumableSampler plain(20, 5, true);
  EXPECT_THROW(plain.load_state(a.state()), mm::Error);
  lengths[3] = 9;
  ResumableSampler changed(20, 5, true);
  changed.group_by_length(lengths, 10);
  EXPECT_THROW(changed.load_state(a.state()), mm::Error);
  lengths[3] = 1;
  ResumableSampler same(20, 5, true);
  same.group_by_length(lengths, 10);
  same.load_state(a.state());
  EXPECT_EQ(same.next_n(5), a.next_n(5));
}

TEST(MllmData, LiteralPadTokensInTheTextAreABadSample) {
  fs::path dir = scratch("mllm_literal_pad");
  write_png(dir / "a.png", 56, 56);
  write(dir / "d.jsonl", R"({"messages":[{"role":"user","content":"<image>x<|image_pad|>"},{"role":"assistant","content":"y"}],"images":["a.png"]})" "\n");
  SampleEncoder enc(byte_chat_tokenizer(), small_qwen_options());
  EXPECT_THROW(enc.encode(read_mllm_file((dir / "d.jsonl").string()).records[0]), mm::Error);
}

TEST(MllmData, HeaderOnlyLengthEstimateCountsImageTokensExactly) {
  // Same text, different image sizes: encode() and estimate_length() differ by the same template
  // overhead, so the image part of the estimate (from the PNG header alone) is exact.
  fs::path dir = scratch("mllm_estimate");
  write_png(dir / "small.png", 40, 30);
  write_png(dir / "big.png", 300, 200);
  write(dir / "d.jsonl", vqa_line("small.png", "x") + "\n" + vqa_line("big.png", "x") + "\n");
  MllmFile f = read_mllm_file((dir / "d.jsonl").string());
  SampleEncoderOptions o;  // Qwen2-VL's default pixel budget
  SampleEncoder enc(byte_chat_tokenizer(), o);
  std::vector<int64_t> overhead;
  for (auto& r : f.records)
    overhead.push_back(static_cast<int64_t>(enc.encode(r).input_ids.size()) - enc.estimate_length(r));
  EXPECT_EQ(overhead[0], overhead[1]);
  EXPECT_GT(enc.estimate_length(f.records[1]), enc.estimate_length(f.records[0]) + 50);
  MllmRecord missing = f.records[0];
  missing.images[0] = (dir / "nope.png").string();
  EXPECT_EQ(enc.estimate_length(missing), -1);
}
