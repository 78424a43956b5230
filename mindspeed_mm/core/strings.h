// Small string helpers shared across layers.
#pragma once

#include <string>
#include <string_view>

namespace mm {

inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Text from a file put into a one-line message: control and non-ASCII bytes become '?', and at
// most `max` characters are kept ("..." marks the cut), so random bytes cannot spill a terminal.
inline std::string printable(std::string_view s, size_t max = 80) {
  std::string out;
  for (const char c : s.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (s.size() > max) out += "...";
  return out;
}

// A message made one line for a terminal: control bytes (newlines included) become '?', UTF-8
// is kept, and it is cut at `max` bytes. `mm` prints every error through it.
inline std::string one_line(std::string_view s, size_t max = 1000) {
  std::string out;
  for (const char c : s.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u == 0x7f) ? '?' : c;
  }
  if (s.size() > max) out += "...";
  return out;
}

// nlohmann::json's exception text without its "[json.exception.parse_error.101] " tag, the bytes
// it quotes ("last read: '...'") made printable: "parse error at line 1, column 2: ...".
inline std::string json_error_text(std::string_view what) {
  if (!what.empty() && what.front() == '[') {
    const size_t close = what.find("] ");
    if (close != std::string_view::npos) what.remove_prefix(close + 2);
  }
  return printable(what, 160);
}

}  // namespace mm
