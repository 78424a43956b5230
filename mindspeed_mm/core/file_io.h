// read_file_bytes: a whole file as bytes, or nullopt when it cannot be read (missing, no
// permission, a directory, a read error), so each caller words its own error (which file, what it
// was meant to be).
#pragma once

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace mm {

// Why `path` cannot be read as a file, or "" when it can: "no such file", "is a directory",
// "cannot be read (Permission denied)". Callers put it after the path: "error: x.json: is a directory".
inline std::string file_problem(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) return "no such file";
  if (st.type() == std::filesystem::file_type::directory) return "is a directory, not a file";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot be read (") + std::strerror(errno) + ")";
  ::close(fd);
  return "";
}

// file_problem for a file whose read just failed: never empty.
inline std::string unreadable_reason(const std::string& path) {
  const std::string p = file_problem(path);
  return p.empty() ? "cannot be read" : p;
}

inline std::optional<std::string> read_file_bytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream os;
  try {
    os << in.rdbuf();
  } catch (const std::exception&) {
    return std::nullopt;  // libstdc++ throws from underflow on some read errors (EISDIR, EIO)
  }
  if (in.bad()) return std::nullopt;
  return os.str();
}

}  // namespace mm
