// What opening a large mllm training set costs one rank: time and resident memory per record.
//
//   dataset_open --records N --dir DIR --phase write|build|open|baseline
//     write     DIR/train_N.jsonl: N synthetic records (a question and an answer, about 130
//               bytes a line), once
//     build     the first open: MllmRecordIndex scans the file and writes its cache
//     open      `mm train`'s mllm dataset as a rank builds it (index from the cache, 5% validation
//               split, mixture, sampler), in a fresh process
//     baseline  the same records read whole into memory (read_mllm_file, what the dataset did
//               before the index) plus the split, in a fresh process
// Each phase prints `RESULT phase=... records=N seconds=... rss_bytes_per_record=...`; resident
// memory is this process's RSS after minus before (libtorch's own pages excluded).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "mindspeed_mm/config/config.h"
#include "mindspeed_mm/core/allocator.h"
#include "mindspeed_mm/data/dataset_registry.h"
#include "mindspeed_mm/data/mllm/mllm_dataset.h"
#include "mindspeed_mm/data/mllm/record_index.h"
#include "mindspeed_mm/data/text_dataset.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  mm::configure_host_allocator();
  int64_t records = 1000000;
  std::string dir = "build/bench_dataset_open", phase;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--records") records = std::atoll(v.c_str());
    else if (k == "--dir") dir = v;
    else if (k == "--phase") phase = v;
    else {
      std::fprintf(stderr, "dataset_open: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  const std::string path = dir + "/train_" + std::to_string(records) + ".jsonl";
  try {
    if (phase == "write") {
      std::filesystem::create_directories(dir);
      if (std::filesystem::exists(path)) return 0;
      const std::string tmp = path + ".tmp";
      std::ofstream out(tmp, std::ios::binary);
      const char* colours[] = {"red", "green", "blue", "yellow", "black", "white", "grey"};
      for (int64_t i = 0; i < records; ++i)
        out << R"({"messages":[{"role":"user","content":"What colour is object )" << i
            << R"( in the scene?"},{"role":"assistant","content":"It is )" << colours[i % 7] << R"(."}]})" << "\n";
      out.close();
      std::filesystem::rename(tmp, path);
      return 0;
    }
    const int64_t rss0 = mm::resident_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    int64_t held = 0, samples = 0;
    if (phase == "build") {
      std::filesystem::remove(path + ".mmidx");
      mm::data::MllmRecordIndex index(path);
      held = index.resident_bytes();
      samples = index.size();
    } else if (phase == "open") {
      mm::config::Config cfg;
      cfg.data.dataset = "mllm";
      cfg.data.paths = {path};
      cfg.data.val_fraction = 0.05;
      cfg.data.num_workers = 0;  // no loader threads reading ahead during the measurement
      mm::data::DataContext ctx;
      ctx.micro_batch_size = 8;
      mm::data::TrainData d = mm::data::dataset_registry().get("mllm")(cfg.data, ctx);
      const double secs = seconds_since(t0);
      const int64_t rss = mm::resident_bytes() - rss0;
      held = mm::data::MllmRecordIndex(path).resident_bytes();
      std::printf("RESULT phase=open records=%lld seconds=%.3f rss_bytes_per_record=%.1f index_bytes_per_record=%.1f "
                  "first_batch_samples=%lld\n",
                  static_cast<long long>(records), secs, static_cast<double>(rss) / records,
                  static_cast<double>(held) / records, static_cast<long long>(d.train->next().num_samples));
      return 0;
    } else if (phase == "baseline") {
      mm::data::MllmFile f = mm::data::read_mllm_file(path);
      int64_t val = 0;
      for (const auto& r : f.records) val += mm::data::is_validation_document(mm::data::record_key(r, f.media_root), 0.05, 1234);
      samples = static_cast<int64_t>(f.records.size()) - val;
      const double secs = seconds_since(t0);
      const int64_t rss = mm::resident_bytes() - rss0;
      std::printf("RESULT phase=baseline records=%lld seconds=%.3f rss_bytes_per_record=%.1f\n",
                  static_cast<long long>(records), secs, static_cast<double>(rss) / records);
      return samples > 0 ? 0 : 1;
    } else {
      std::fprintf(stderr, "dataset_open: --phase write|build|open|baseline\n");
      return 2;
    }
    const double secs = seconds_since(t0);
    const int64_t rss = mm::resident_bytes() - rss0;
    std::printf("RESULT phase=%s records=%lld seconds=%.3f rss_bytes_per_record=%.1f index_bytes_per_record=%.1f\n",
                phase.c_str(), static_cast<long long>(records), secs, static_cast<double>(rss) / records,
                static_cast<double>(held) / records);
    return samples > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dataset_open: %s\n", e.what());
    return 1;
  }
}
