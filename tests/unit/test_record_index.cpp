// The mllm record index (data/mllm/record_index.h): the same records, sources, bad records and
// train/val split as reading the whole file (read_mllm_file), from a cache that is reused only
// while the file and the reading settings are unchanged; and `mm train`'s mllm dataset, which
// reads through it, draws its samples in the order of the in-memory reader it replaced.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <atomic>
#include <thread>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/record_index.h"
#include "mindspeed_mm/data/sampler.h"
#include "mindspeed_mm/data/text_dataset.h"
#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using namespace mm::data;

std::string line(int i, bool with_image = false) {
  return mm::cat(R"({"messages":[{"role":"user","content":")", with_image ? "<image>" : "", "question ", i,
                 R"("},{"role":"assistant","content":"answer )", i % 7, R"("}])",
                 with_image ? mm::cat(R"(,"images":["img/)", i, R"(.png"])") : "", "}");
}

// Good records, blank lines, malformed JSON and records that cannot be samples, interleaved.
std::string jsonl(int n, bool images = true) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += line(i, images && i % 3 == 0) + "\n";
    if (i % 10 == 4) s += "\n";
    if (i % 13 == 6) s += "{broken\n";
    if (i % 17 == 8) s += R"({"messages":[{"role":"robot","content":"hi"}]})" "\n";
  }
  return s;
}

void expect_same(const MllmFile& f, const MllmRecordIndex& idx) {
  ASSERT_EQ(idx.size(), static_cast<int64_t>(f.records.size()));
  for (int64_t i = 0; i < idx.size(); ++i) {
    const MllmRecord r = idx.record(i), &w = f.records[static_cast<size_t>(i)];
    EXPECT_EQ(r.source, w.source);
    ASSERT_EQ(r.messages.size(), w.messages.size()) << w.source;
    for (size_t k = 0; k < w.messages.size(); ++k) EXPECT_EQ(r.messages[k].content, w.messages[k].content);
    EXPECT_EQ(r.images, w.images);
  }
  ASSERT_EQ(idx.bad().size(), f.bad.size());
  for (size_t k = 0; k < f.bad.size(); ++k) {
    EXPECT_EQ(idx.bad()[k].source, f.bad[k].source);
    EXPECT_EQ(idx.bad()[k].reason, f.bad[k].reason);
  }
  const auto split = idx.validation_split(0.2, 11);
  int64_t val = 0;
  for (size_t i = 0; i < f.records.size(); ++i) {
    EXPECT_EQ(split[i], is_validation_document(record_key(f.records[i], f.media_root), 0.2, 11)) << i;
    val += split[i];
  }
  EXPECT_GT(val, 0);
}

}  // namespace

TEST(RecordIndex, JsonlRecordsSourcesBadRecordsAndSplitEqualTheWholeFileReader) {
  const std::string dir = mm::test::fresh_dir("record_index_jsonl");
  const std::string path = dir + "/train.jsonl";
  mm::test::write_file(path, jsonl(200));
  const MllmFile f = read_mllm_file(path);
  EXPECT_EQ(f.records.size(), 200u);
  EXPECT_EQ(f.bad.size(), 15u + 12u);  // broken lines and robots
  {
    MllmRecordIndex first(path);
    EXPECT_FALSE(first.from_cache());
    expect_same(f, first);
    EXPECT_LE(first.resident_bytes(), 200 * 8 + 16 * 64);  // offsets and the skips
  }
  ASSERT_TRUE(fs::exists(path + ".mmidx"));
  MllmRecordIndex again(path);
  EXPECT_TRUE(again.from_cache());
  expect_same(f, again);
  // From threads at once: parsing on demand reads the mapping only.
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int64_t i = t; i < again.size(); i += 4)
        if (again.record(i).source != f.records[static_cast<size_t>(i)].source) ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);

  // Other reading settings or a changed file: the cache is not used.
  MllmRecordIndex rooted(path, {}, "/data/media");
  EXPECT_FALSE(rooted.from_cache());
  EXPECT_EQ(rooted.record(0).images[0], "/data/media/img/0.png");
  mm::test::write_file(path, jsonl(50));
  const MllmFile g = read_mllm_file(path);
  MllmRecordIndex changed(path);
  EXPECT_FALSE(changed.from_cache());
  expect_same(g, changed);
  // A cache that does not belong to the file (truncated, garbage) is rebuilt.
  mm::test::write_file(path + ".mmidx", "MMRIDX01 not really");
  MllmRecordIndex rebuilt(path);
  EXPECT_FALSE(rebuilt.from_cache());
  EXPECT_EQ(rebuilt.size(), static_cast<int64_t>(g.records.size()));
}

TEST(RecordIndex, JsonArraysEmptyFilesAndBrokenArrays) {
  const std::string dir = mm::test::fresh_dir("record_index_json");
  std::string arr = "[\n";
  for (int i = 0; i < 40; ++i) arr += (i ? ",\n  " : "  ") + line(i, i % 2 == 0);
  arr += R"(, 5, {"messages": [{"role": "user", "content": "a, [b] {c} \"d\""}, {"role": "assistant", "content": "]"}]})";
  arr += "\n]\n";
  mm::test::write_file(dir + "/a.json", arr);
  const MllmFile f = read_mllm_file(dir + "/a.json");
  ASSERT_EQ(f.records.size(), 41u);
  EXPECT_EQ(f.bad[0].source, "a.json[40]");
  MllmRecordIndex idx(dir + "/a.json");
  expect_same(f, idx);
  EXPECT_EQ(idx.record(40).source, "a.json[41]");
  EXPECT_EQ(idx.record(40).messages[0].content, "a, [b] {c} \"d\"");
  MllmRecordIndex cached(dir + "/a.json");
  EXPECT_TRUE(cached.from_cache());
  expect_same(f, cached);

  for (const char* empty : {"", "\n\n", "[]", " [ ] \n"}) {
    mm::test::write_file(dir + "/e.json", empty);
    EXPECT_EQ(MllmRecordIndex(dir + "/e.json").size(), 0) << empty;
  }
  for (const char* broken : {"[{\"messages\": []}", "[1,]", "[1] x", "[{\"a\": tru}]"}) {
    mm::test::write_file(dir + "/b.json", broken);
    try {
      MllmRecordIndex b(dir + "/b.json");
      ADD_FAILURE() << "accepted " << broken;
    } catch (const mm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("starts with '[' but is not a valid JSON array"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(MllmRecordIndex(dir + "/missing.jsonl"), mm::Error);
}

// The mllm dataset of `mm train` over two weighted files with a validation fraction: its batches
// hold the samples, in order, that the whole-file reader, the content-hash split, the mixture and
// the sampler give (what the dataset did before it read through the index).
TEST(RecordIndex, TrainingOrderEqualsTheInMemoryReader) {
  const std::string dir = mm::test::fresh_dir("record_index_order");
  mm::test::write_file(dir + "/a.jsonl", jsonl(60, /*images=*/false));
  std::string b;
  for (int i = 100; i < 130; ++i) b += line(i) + "\n";
  mm::test::write_file(dir + "/b.jsonl", b);
  auto cfg = mm::config::parse_config(
      "data: {dataset: mllm, paths: [" + dir + "/a.jsonl, " + dir + "/b.jsonl], weights: [1.0, 1.5], val_fraction: 0.25,"
      " seed: 5, num_workers: 2, max_bad_fraction: 0.5}\n",
      "order.yaml", {}, /*for_training=*/false);
  DataContext ctx;
  ctx.micro_batch_size = 4;

  // The expected order, from the in-memory reader.
  std::vector<std::vector<std::string>> sets;
  std::vector<std::string> val;
  for (const auto& p : cfg.data.paths) {
    MllmFile f = read_mllm_file(p);
    std::vector<std::string> train;
    for (auto& r : f.records)
      (is_validation_document(record_key(r, f.media_root), 0.25, 5) ? val : train).push_back(r.source);
    sets.push_back(train);
  }
  std::vector<int64_t> sizes = {static_cast<int64_t>(sets[0].size()), static_cast<int64_t>(sets[1].size())};
  std::vector<std::string> mixed;
  for (const MixEntry& e : build_mixture(sizes, {1.0, 1.5}, 5)) mixed.push_back(sets[e.dataset][e.index]);
  ResumableSampler sampler(static_cast<int64_t>(mixed.size()), 5, true, 0, 1);

  for (int pass = 0; pass < 2; ++pass) {  // the scan, then the cached index
    TrainData d = dataset_registry().get("mllm")(cfg.data, ctx);
    ResumableSampler s = sampler;
    for (int step = 0; step < 30; ++step) {
      Batch batch = d.train->next();
      ASSERT_EQ(batch.sources.size(), 4u);
      for (const auto& src : batch.sources) EXPECT_EQ(src, mixed[static_cast<size_t>(s.next())]) << "step " << step;
    }
    std::vector<std::string> got_val;
    d.val(8, 0, 0, 1, [&](const Batch& vb) { got_val.insert(got_val.end(), vb.sources.begin(), vb.sources.end()); });
    EXPECT_EQ(got_val, val);
  }
  EXPECT_TRUE(MllmRecordIndex(dir + "/a.jsonl").from_cache());
}
