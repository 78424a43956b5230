// Multi-process tests: this test binary re-run as the ranks of `mm launch`, each rank running
// one DistWorker.* test (skipped in a plain run) with MM_DIST_WORKER set.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "run_command.h"

namespace mm::test {

inline std::string self_binary() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

// Runs the DistWorker test `name` on n ranks under mm launch; MM_DIST_MODE=mode for variants.
inline CommandResult launch_worker(int n, const std::string& name, const std::string& mode = "") {
  return run_command(mm_launch(n) + "env MM_DIST_WORKER=1 MM_DIST_MODE=" + mode + " " + self_binary() +
                     " --gtest_filter=DistWorker." + name);
}

// Every rank's GoogleTest run passed.
inline void expect_all_ranks_passed(const CommandResult& r, int n) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < n; ++k)
    EXPECT_NE(r.output.find("[rank " + std::to_string(k) + "] [  PASSED  ] 1 test"), std::string::npos) << r.output;
}

inline bool dist_worker() { return std::getenv("MM_DIST_WORKER") != nullptr; }
inline std::string dist_mode() { return std::getenv("MM_DIST_MODE") ? std::getenv("MM_DIST_MODE") : ""; }

}  // namespace mm::test
