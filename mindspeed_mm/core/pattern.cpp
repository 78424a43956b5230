#include "mindspeed_mm/core/pattern.h"

#include <cctype>

#include "mindspeed_mm/core/errors.h"

namespace mm {
namespace {

bool parse_long(const std::string& s, long& v) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  v = std::stol(s);
  return true;
}

// Classic glob over one segment: '*' any run, '?' one character.
bool glob_match(const char* p, const char* s) {
  const char* star = nullptr;
  const char* back = nullptr;
  while (*s) {
    if (*p == '?' || (*p && *p == *s)) { ++p; ++s; }
    else if (*p == '*') { star = p++; back = s; }
    else if (star) { p = star + 1; s = ++back; }
    else return false;
  }
  while (*p == '*') ++p;
  return *p == 0;
}

}  // namespace

PathPattern::PathPattern(const std::string& pattern) : text_(pattern) {
  if (pattern.empty()) throw ConfigError("pattern: empty module-path pattern");
  auto parts = split_path(pattern);
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    Segment seg;
    if (part.empty()) throw ConfigError(cat("pattern '", pattern, "': empty segment"));
    if (part == "**") {
      if (i + 1 != parts.size()) throw ConfigError(cat("pattern '", pattern, "': '**' must be the last segment"));
      seg.kind = Segment::kDeep;
    } else if (part.front() == '{') {
      if (part.back() != '}') throw ConfigError(cat("pattern '", pattern, "': unbalanced '{' in segment '", part, "'"));
      std::string body = part.substr(1, part.size() - 2);
      auto dash = body.find('-');
      if (body == "*") {
        seg.kind = Segment::kAnyIndex;
      } else if (body.find(',') != std::string::npos) {
        seg.kind = Segment::kList;
        std::string cur;
        body += ',';
        for (char c : body) {
          if (c == ',') {
            long v;
            if (!parse_long(cur, v)) throw ConfigError(cat("pattern '", pattern, "': bad index '", cur, "' in '", part, "'"));
            seg.list.push_back(v);
            cur.clear();
          } else {
            cur += c;
          }
        }
      } else if (dash != std::string::npos) {
        seg.kind = Segment::kRange;
        if (!parse_long(body.substr(0, dash), seg.lo) || !parse_long(body.substr(dash + 1), seg.hi) || seg.lo > seg.hi)
          throw ConfigError(cat("pattern '", pattern, "': bad range '", part, "' (want {a-b} with a <= b)"));
      } else {
        long v;
        if (!parse_long(body, v)) throw ConfigError(cat("pattern '", pattern, "': bad index segment '", part, "'"));
        seg.kind = Segment::kRange;
        seg.lo = seg.hi = v;
      }
    } else {
      if (part.find_first_of("{}") != std::string::npos)
        throw ConfigError(cat("pattern '", pattern, "': braces must enclose a whole segment in '", part, "'"));
      seg.kind = Segment::kGlob;
      seg.glob = part;
    }
    segments_.push_back(seg);
  }
}

bool PathPattern::matches(const std::string& path) const {
  auto parts = split_path(path);
  size_t n = segments_.size();
  bool deep = segments_.back().kind == Segment::kDeep;
  if (deep) {
    if (parts.size() < n - 1) return false;
    --n;
  } else if (parts.size() != n) {
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    const Segment& s = segments_[i];
    const std::string& p = parts[i];
    long v;
    switch (s.kind) {
      case Segment::kGlob:
        if (!glob_match(s.glob.c_str(), p.c_str())) return false;
        break;
      case Segment::kAnyIndex:
        if (!parse_long(p, v)) return false;
        break;
      case Segment::kRange:
        if (!parse_long(p, v) || v < s.lo || v > s.hi) return false;
        break;
      case Segment::kList: {
        if (!parse_long(p, v)) return false;
        bool found = false;
        for (long x : s.list) found |= (x == v);
        if (!found) return false;
        break;
      }
      case Segment::kDeep:
        break;
    }
  }
  return true;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : path) {
    if (c == '.') { out.push_back(cur); cur.clear(); }
    else cur += c;
  }
  out.push_back(cur);
  return out;
}

bool matches_any(const std::vector<PathPattern>& patterns, const std::string& path) {
  for (auto& p : patterns)
    if (p.matches(path)) return true;
  return false;
}

std::vector<PathPattern> compile_patterns(const std::vector<std::string>& patterns) {
  std::vector<PathPattern> out;
  for (auto& p : patterns) out.emplace_back(p);
  return out;
}

}  // namespace mm
