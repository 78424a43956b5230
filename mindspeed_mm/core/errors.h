// Error types. Every failure a user can cause is one of these, carrying a one-line message
// that names the file, key or sample at fault. `mm` maps them to exit codes (ConfigError -> 2).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mm {

// A failure the user can act on: bad input file, bad checkpoint, bad data.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
  virtual int exit_code() const { return 1; }
};

// A configuration mistake (unknown key, wrong type, out of range). Exit code 2.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& msg) : Error(msg) {}
  int exit_code() const override { return 2; }
};

// Concatenates streamable values: fail(cat("expected ", n, " got ", m)).
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace mm

// MM_CHECK(cond, parts...) throws mm::Error with the concatenated message when cond is false.
#define MM_CHECK(cond, ...)                      \
  do {                                           \
    if (!(cond)) throw ::mm::Error(::mm::cat(__VA_ARGS__)); \
  } while (0)
