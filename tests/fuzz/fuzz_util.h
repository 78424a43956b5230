// Shared by the libFuzzer harnesses: a private scratch folder, files written into it, and the
// rule every harness checks: a parser given any bytes either succeeds or throws mm::Error (a
// one-line message naming the input). Anything else (another exception, a crash, a sanitizer
// report, a hang) is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "mindspeed_mm/core/errors.h"

namespace mm::fuzz {

// This process's scratch folder (removed and remade at the first call).
inline const std::string& scratch() {
  static const std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(t ? t : "/tmp") / ("mm_fuzz_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

inline std::string write(const std::string& name, std::string_view bytes) {
  const std::string path = scratch() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// The folder make_seeds.sh filled (seeds/ of the fuzz build): fixtures some harnesses start from.
inline std::string fixtures() {
  const char* d = std::getenv("MM_FUZZ_FIXTURES");
  return d ? d : "";
}

}  // namespace mm::fuzz

// Runs the statements given; mm::Error is the expected answer to bad bytes, anything else
// escapes to libFuzzer (variadic: the statements may hold commas).
#define MM_FUZZ_EXPECT_ONLY_MM_ERRORS(...) \
  try {                                    \
    __VA_ARGS__;                           \
  } catch (const ::mm::Error&) {           \
  }
