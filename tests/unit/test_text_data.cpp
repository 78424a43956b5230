// Text data layer: byte tokenizer round trips, document readers (text, fortune, JSONL), the
// document-level train/val split, packing into LM rows, the unigram baseline, and the resumable
// sharded sampler (including a pinned order so a platform change in the PRNG is caught).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/byte_tokenizer.h"
#include "mindspeed_mm/data/sampler.h"
#include "mindspeed_mm/data/text_dataset.h"

namespace fs = std::filesystem;
using namespace mm::data;

namespace {

// A per-test scratch directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            mm::cat("mm_text_data_", info->test_suite_name(), "_", info->name(), "_", ::getpid());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name, std::ios::binary) << content;
    return (path_ / name).string();
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

const char* kFortunesDir = "/usr/share/games/fortunes";

// ---------------------------------------------------------------------------------------------
TEST(ByteTokenizer, EveryByteRoundTrips) {
  ByteTokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_EQ(tok.vocab_size(), 260);
}

TEST(ByteTokenizer, InvalidUtf8AndMultibyteRoundTrip) {
  ByteTokenizer tok;
  const std::string bad = std::string("ok \xff\xfe \xc3\x28 \xe2\x82 tail \xed\xa0\x80", 21);
  EXPECT_EQ(tok.decode(tok.encode(bad)), bad);
  const std::string utf8 = "na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82";  // naïve 日本 🙂
  const auto ids = tok.encode(utf8);
  EXPECT_EQ(ids.size(), utf8.size());  // bytes, not code points
  EXPECT_EQ(tok.decode(ids), utf8);
}

TEST(ByteTokenizer, SpecialsOnlyOnRequest) {
  ByteTokenizer tok;
  const std::string text = "<|im_start|>user\nhi<|im_end|><|endoftext|><|nope|>";
  EXPECT_EQ(tok.encode(text).size(), text.size());  // plain encode never makes specials
  const auto ids = tok.encode_with_specials(text);
  ASSERT_EQ(ids.size(), 1 + 7 + 1 + 1 + 8u);
  EXPECT_EQ(ids[0], ByteTokenizer::kImStart);
  EXPECT_EQ(ids[8], ByteTokenizer::kImEnd);
  EXPECT_EQ(ids[9], ByteTokenizer::kEos);
  EXPECT_EQ(ids[10], '<');
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "user\nhi<|nope|>");
  EXPECT_EQ(tok.decode({ByteTokenizer::kPad}), "<|pad|>");
  EXPECT_EQ(ByteTokenizer::special_id("<|endoftext|>"), std::optional<int64_t>(256));
  EXPECT_FALSE(ByteTokenizer::special_id("<|x|>").has_value());
  EXPECT_THROW(tok.decode({260}), mm::Error);
  EXPECT_THROW(tok.decode({-1}), mm::Error);
}

// ---------------------------------------------------------------------------------------------
TEST(TextData, FortuneFileEntries) {
  TempDir dir;
  // 4 entries; an empty entry between two separators and a trailing '%' add none.
  const std::string f = dir.write("quotes",
                                  "First entry.\n%\nSecond entry,\n  two lines.\n%\n%\n"
                                  "Third.\n\nWith a blank line inside.\n%\nFourth\r\n%\r\n");
  TextDataOptions o;
  o.paths = {f};
  const auto docs = read_text_documents(o).docs;
  ASSERT_EQ(docs.size(), 4u);
  EXPECT_EQ(docs[0], "First entry.");
  EXPECT_EQ(docs[1], "Second entry,\n  two lines.");
  EXPECT_EQ(docs[2], "Third.\n\nWith a blank line inside.");
  EXPECT_EQ(docs[3], "Fourth");
  o.max_documents = 2;
  EXPECT_EQ(read_text_documents(o).docs.size(), 2u);
}

TEST(TextData, PlainTextParagraphsAndDirectories) {
  TempDir dir;
  dir.write("b.txt", "para one\nline two\n\n\n  \npara two\n");
  dir.write("a.txt", "first file\n");
  dir.write("a.dat", "index, skipped\n");
  dir.write("a.u8", "symlink twin, skipped\n");
  TextDataOptions o;
  o.paths = {dir.str()};
  const auto docs = read_text_documents(o).docs;
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "first file");  // a.txt sorts first
  EXPECT_EQ(docs[1], "para one\nline two");
  EXPECT_EQ(docs[2], "para two");
}

TEST(TextData, JsonlSkipsAndCountsMalformedLines) {
  TempDir dir;
  const std::string f = dir.write("d.jsonl",
                                  "{\"text\": \"alpha\"}\n"
                                  "{\"text\": \"beta\", \"id\": 2}\n"
                                  "{not json\n"
                                  "\n"
                                  "{\"body\": \"no text key\"}\n"
                                  "{\"text\": 7}\n"
                                  "{\"text\": \"gamma\\nwith newline\"}\n");
  TextDataOptions o;
  o.paths = {f};
  const auto read = read_text_documents(o);
  ASSERT_EQ(read.docs.size(), 3u);
  EXPECT_EQ(read.docs[2], "gamma\nwith newline");
  EXPECT_EQ(read.skipped_lines, 3);
  o.text_key = "body";
  const auto body = read_text_documents(o);
  EXPECT_EQ(body.docs.size(), 1u);
  EXPECT_EQ(body.skipped_lines, 5);
}

TEST(TextData, ErrorsNameTheProblem) {
  TextDataOptions o;
  o.paths = {"/nonexistent/corpus.txt"};
  try {
    read_text_documents(o);
    FAIL() << "expected mm::Error";
  } catch (const mm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/corpus.txt"), std::string::npos) << e.what();
  }
  TempDir dir;
  o.paths = {dir.write("empty.txt", "\n\n  \n")};
  EXPECT_THROW(read_text_documents(o), mm::Error);
  o.format = "csv";
  EXPECT_THROW(read_text_documents(o), mm::ConfigError);
}

TEST(TextData, RealFortunes) {
  if (!fs::is_directory(kFortunesDir)) GTEST_SKIP() << kFortunesDir << " not installed (fortunes package)";
  TextDataOptions o;
  o.paths = {kFortunesDir};
  const auto read = read_text_documents(o);
  EXPECT_GT(read.docs.size(), 1000u);
  EXPECT_EQ(read.skipped_lines, 0);
  for (const auto& d : read.docs) ASSERT_EQ(d.find("\n%\n"), std::string::npos);

  ByteTokenizer tok;
  o.seq_len = 256;
  const auto s = load_text_splits(o, tok);
  const double n_docs = static_cast<double>(read.docs.size());
  EXPECT_EQ(s.train.num_documents() + s.val.num_documents(), static_cast<int64_t>(n_docs));
  EXPECT_NEAR(s.val.num_documents() / n_docs, o.val_fraction, 5 * std::sqrt(0.05 * 0.95 / n_docs));
  ASSERT_GT(s.val.size(), 0);
  // English bytes: the unigram baseline lies far below the uniform log(260) = 5.56 nats.
  const double h = unigram_entropy_nats(s.train.token_counts(260), s.val.token_counts(260));
  std::printf("fortunes: byte unigram baseline %.4f nats/token on val\n", h);
  EXPECT_GT(h, 2.0);
  EXPECT_LT(h, 4.0);
}

// ---------------------------------------------------------------------------------------------
std::string numbered_docs_jsonl(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += mm::cat("{\"text\": \"document number ", i, " says hello\"}\n");
  return s;
}

TEST(TextData, SplitIsDisjointStableAndNearFraction) {
  TempDir dir;
  const int n = 4000;
  TextDataOptions o;
  o.paths = {dir.write("docs.jsonl", numbered_docs_jsonl(n))};
  o.val_fraction = 0.1;
  o.seq_len = 16;
  const auto docs = read_text_documents(o).docs;
  std::set<std::string> val, train;
  for (const auto& d : docs) (is_validation_document(d, o.val_fraction, o.seed) ? val : train).insert(d);
  for (const auto& d : val) EXPECT_EQ(train.count(d), 0u);
  // Binomial(4000, 0.1): sd = 19; allow 5 sd.
  EXPECT_NEAR(static_cast<double>(val.size()), 0.1 * n, 95.0);

  ByteTokenizer tok;
  const auto a = load_text_splits(o, tok);
  const auto b = load_text_splits(o, tok);
  EXPECT_EQ(a.val.num_documents(), static_cast<int64_t>(val.size()));
  EXPECT_EQ(a.train.num_documents() + a.val.num_documents(), n);
  ASSERT_EQ(a.val.size(), b.val.size());
  ASSERT_GT(a.val.size(), 0);
  for (int64_t i = 0; i < a.val.size(); ++i) ASSERT_TRUE(a.val.row(i).equal(b.val.row(i)));

  o.seed = 99;  // another seed picks another val set
  std::set<std::string> val2;
  for (const auto& d : docs) if (is_validation_document(d, o.val_fraction, o.seed)) val2.insert(d);
  EXPECT_NE(val, val2);
}

TEST(TextData, PackingRowsAndShiftedLabels) {
  TempDir dir;
  TextDataOptions o;
  o.paths = {dir.write("c.txt", "hello world\n\nsecond paragraph here\n\nthird\n")};
  o.val_fraction = 0.0;
  o.seq_len = 4;
  ByteTokenizer tok;
  const auto s = load_text_splits(o, tok);
  const int64_t tokens = 11 + 1 + 21 + 1 + 5 + 1;
  EXPECT_EQ(s.train.num_documents(), 3);
  EXPECT_EQ(s.train.num_tokens(), tokens);
  EXPECT_EQ(s.train.size(), (tokens - 1) / o.seq_len);
  EXPECT_EQ(s.val.size(), 0);

  // Rows tile the stream: row i starts at token i*S, and the first eos ends document one.
  std::vector<int64_t> stream;
  for (int64_t i = 0; i < s.train.size(); ++i) {
    auto r = s.train.row(i);
    ASSERT_EQ(r.numel(), o.seq_len + 1);
    ASSERT_EQ(r.scalar_type(), at::kLong);
    for (int64_t k = (i == 0 ? 0 : 1); k <= o.seq_len; ++k) stream.push_back(r[k].item<int64_t>());
  }
  EXPECT_EQ(tok.decode(std::vector<int64_t>(stream.begin(), stream.begin() + 12)),
            "hello world<|endoftext|>");

  const auto batch = make_lm_batch(s.train, {3, 0, 5});
  ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{3, 4}));
  ASSERT_EQ(batch.labels.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(batch.labels.narrow(1, 0, 3).equal(batch.input_ids.narrow(1, 1, 3)));
  EXPECT_TRUE(batch.input_ids[1].equal(s.train.row(0).narrow(0, 0, 4)));
  EXPECT_TRUE(batch.labels[0].equal(s.train.row(3).narrow(0, 1, 4)));
  EXPECT_THROW(s.train.row(s.train.size()), mm::Error);

  // Label counts cover exactly tokens 1 .. size*S.
  const auto counts = s.train.token_counts(tok.vocab_size());
  int64_t total = 0;
  for (auto c : counts) total += c;
  EXPECT_EQ(total, s.train.size() * o.seq_len);
  // Stream: "hello world" eos "second paragraph here" eos "third" eos = 40 tokens, 9 rows, labels
  // t[1..36]. 'h' of "hello" is t[0] (never a label); "paragraph", "here", "t[h]ird" (t[35]) are.
  EXPECT_EQ(counts['h'], 3);
  EXPECT_EQ(counts[ByteTokenizer::kEos], 2);  // third doc's eos falls in the dropped tail

  o.seq_len = 1000;
  EXPECT_THROW(load_text_splits(o, tok), mm::Error);  // train too short for one row
}

TEST(TextData, UnigramEntropy) {
  const int64_t V = 260;
  std::vector<int64_t> uniform(V, 50);
  EXPECT_NEAR(unigram_entropy_nats(uniform, uniform), std::log(static_cast<double>(V)), 1e-12);
  // Train all on token 0: p(0) = (N+1)/(N+V); eval all token 0 costs -log p(0).
  std::vector<int64_t> peaked(V, 0), eval0(V, 0);
  peaked[0] = 1000;
  eval0[0] = 7;
  EXPECT_NEAR(unigram_entropy_nats(peaked, eval0), -std::log(1001.0 / (1000.0 + V)), 1e-12);
  std::vector<int64_t> eval1(V, 0);
  eval1[1] = 3;
  EXPECT_NEAR(unigram_entropy_nats(peaked, eval1), std::log(1000.0 + V), 1e-12);
  EXPECT_THROW(unigram_entropy_nats(uniform, std::vector<int64_t>(V, 0)), mm::Error);
  EXPECT_THROW(unigram_entropy_nats(uniform, std::vector<int64_t>(10, 1)), mm::Error);
}

// ---------------------------------------------------------------------------------------------
void expect_permutation(std::vector<int64_t> v, int64_t n) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), n);
  std::sort(v.begin(), v.end());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], i);
}

TEST(Sampler, EachEpochIsAPermutationAndDeterministic) {
  ResumableSampler a(37, 7), b(37, 7);
  const auto e0 = a.next_n(37);
  EXPECT_EQ(a.epoch(), 0);
  EXPECT_EQ(a.position(), 37);
  const auto e1 = a.next_n(37);
  EXPECT_EQ(a.epoch(), 1);
  expect_permutation(e0, 37);
  expect_permutation(e1, 37);
  EXPECT_NE(e0, e1);  // reshuffled per epoch
  auto both = b.next_n(74);
  EXPECT_EQ(std::vector<int64_t>(both.begin(), both.begin() + 37), e0);
  EXPECT_EQ(std::vector<int64_t>(both.begin() + 37, both.end()), e1);
  EXPECT_NE(ResumableSampler(37, 8).next_n(37), e0);

  ResumableSampler seq(5, 7, /*shuffle=*/false);
  EXPECT_EQ(seq.next_n(7), (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1}));
}

TEST(Sampler, PinnedOrder) {
  // Computed once from splitmix64 + Fisher-Yates; a change means the order changed across
  // platforms or versions, which silently breaks resuming old checkpoints.
  // Cross-checked against an independent Python transcription of the same algorithm.
  ResumableSampler s(100, 1);
  EXPECT_EQ(s.next_n(10), (std::vector<int64_t>{32, 42, 35, 28, 3, 86, 81, 21, 67, 16}));
}

TEST(Sampler, ResumeGivesIdenticalContinuation) {
  for (int64_t k : {0, 5, 29, 30, 31, 95}) {
    ResumableSampler a(30, 42);
    a.next_n(k);
    const nlohmann::json st = nlohmann::json::parse(a.state().dump());  // through text, as on disk
    ResumableSampler b(30, 42);
    b.load_state(st);
    EXPECT_EQ(b.epoch(), a.epoch());
    EXPECT_EQ(b.position(), a.position());
    EXPECT_EQ(b.next_n(50), a.next_n(50)) << "k = " << k;
  }
  ResumableSampler a(30, 42);
  EXPECT_THROW(ResumableSampler(31, 42).load_state(a.state()), mm::Error);
  EXPECT_THROW(ResumableSampler(30, 43).load_state(a.state()), mm::Error);
  EXPECT_THROW(ResumableSampler(30, 42, false).load_state(a.state()), mm::Error);
  EXPECT_THROW(ResumableSampler(30, 42).load_state(nlohmann::json{{"n", 30}}), mm::Error);
  EXPECT_THROW(ResumableSampler(30, 42).load_state(nlohmann::json{{"n", "x"}}), mm::Error);
}

TEST(Sampler, RanksPartitionAnEpoch) {
  const int64_t n = 103, world = 4;  // truncated to 100: 25 per rank
  std::vector<int64_t> all;
  for (int64_t r = 0; r < world; ++r) {
    ResumableSampler s(n, 5, true, r, world);
    EXPECT_EQ(s.per_epoch(), 25);
    auto got = s.next_n(25);
    all.insert(all.end(), got.begin(), got.end());
    EXPECT_EQ(s.epoch(), 0);
  }
  std::set<int64_t> uniq(all.begin(), all.end());
  EXPECT_EQ(uniq.size(), 100u);
  EXPECT_LT(*uniq.rbegin(), n);
  // Rank r takes entries r, r+world, ... of the single-rank order.
  const auto order = epoch_permutation(n, 5, 0);
  ResumableSampler r2(n, 5, true, 2, world);
  const auto got = r2.next_n(3);
  EXPECT_EQ(got, (std::vector<int64_t>{order[2], order[6], order[10]}));
  EXPECT_THROW(ResumableSampler(10, 5, true, 4, 4), mm::Error);
  EXPECT_THROW(ResumableSampler(3, 5, true, 0, 4), mm::Error);
}

TEST(Sampler, ResumeIntoAnotherWorldSize) {
  // Two ranks drew 5 each (10 globally); one rank resumes at global entry 10 of the same order.
  ResumableSampler r0(40, 3, true, 0, 2);
  r0.next_n(5);
  ResumableSampler single(40, 3);
  single.load_state(r0.state());
  EXPECT_EQ(single.position(), 10);
  const auto order = epoch_permutation(40, 3, 0);
  EXPECT_EQ(single.next(), order[10]);
}

}  // namespace
