// read_file_bytes: a whole file as bytes, or nullopt when it cannot be opened, so each caller
// words its own error (which file, what it was meant to be).
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace mm {

inline std::optional<std::string> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace mm
