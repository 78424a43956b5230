#include "mindspeed_mm/config/config_io.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "mindspeed_mm/core/pattern.h"

namespace mm::config {

Check any() { return {}; }
Check gt(double lo) {
  return {[lo](double v) { return v > lo ? std::string() : cat("must be > ", lo); }, {}};
}
Check ge(double lo) {
  return {[lo](double v) { return v >= lo ? std::string() : cat("must be >= ", lo); }, {}};
}
Check in_range(double lo, double hi) {
  return {[lo, hi](double v) {
            return (v >= lo && v <= hi) ? std::string() : cat("must be in [", lo, ", ", hi, "]");
          },
          {}};
}
Check one_of(std::vector<std::string> choices) { return {nullptr, std::move(choices)}; }

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  std::ostringstream os;
  os << n;
  std::string s = os.str();
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}
}  // namespace

std::string suggest(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::max<size_t>(3, key.size() / 3) + 1;
  for (auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < best_d) { best_d = d; best = k; }
  }
  return best;
}

YAML::Node Reader::child(const char* key) const {
  // Const access: a missing key yields an invalid node instead of inserting one.
  const YAML::Node& cn = node_;
  return cn[key];
}

Reader::Reader(YAML::Node node, std::string path, const Source* source)
    : node_(node), path_(std::move(path)), source_(source) {}

std::string Reader::where(const std::string& key, const YAML::Node& n) const {
  std::string full = join(key);
  if (source_ && source_->overridden_keys.count(full)) return "on the command line";
  std::string file = source_ ? source_->file : "<config>";
  if (n && n.Mark().line >= 0) return cat("in ", file, " line ", n.Mark().line + 1);
  return cat("in ", file);
}

void Reader::fail(const std::string& key, const YAML::Node& n, const std::string& what) const {
  throw ConfigError(cat("config: ", join(key), " ", what, " ", where(key, n)));
}

YAML::Node Reader::scalar(const char* key) {
  known_.push_back(key);
  if (!node_.IsMap()) return YAML::Node();
  YAML::Node n = child(key);
  if (!n || n.IsNull()) return YAML::Node();
  if (!n.IsScalar()) fail(key, n, "must be a single value");
  return n;
}

template <class T>
static bool parse_scalar(const YAML::Node& n, T& out) {
  try {
    out = n.as<T>();
    return true;
  } catch (const YAML::Exception&) {
    return false;
  }
}

static void check_number(Reader& r, const char* key, const YAML::Node& n, double v, const Check& c) {
  if (!c.number) return;
  std::string err = c.number(v);
  if (!err.empty()) r.fail(key, n, cat(err, " (got ", n.Scalar(), ")"));
}

void Reader::operator()(const char* key, int64_t& v, const Check& c) {
  YAML::Node n = scalar(key);
  if (!n || n.IsNull()) return;
  int64_t x;
  if (!parse_scalar(n, x)) fail(key, n, cat("must be an integer (got '", n.Scalar(), "')"));
  check_number(*this, key, n, static_cast<double>(x), c);
  v = x;
}

void Reader::operator()(const char* key, double& v, const Check& c) {
  YAML::Node n = scalar(key);
  if (!n || n.IsNull()) return;
  double x;
  if (!parse_scalar(n, x) || std::isnan(x)) fail(key, n, cat("must be a number (got '", n.Scalar(), "')"));
  check_number(*this, key, n, x, c);
  v = x;
}

void Reader::operator()(const char* key, bool& v, const Check&) {
  YAML::Node n = scalar(key);
  if (!n || n.IsNull()) return;
  bool x;
  if (!parse_scalar(n, x)) fail(key, n, cat("must be true or false (got '", n.Scalar(), "')"));
  v = x;
}

void Reader::operator()(const char* key, std::string& v, const Check& c) {
  YAML::Node n = scalar(key);
  if (!n || n.IsNull()) return;
  std::string x = n.Scalar();
  if (!c.choices.empty() && std::find(c.choices.begin(), c.choices.end(), x) == c.choices.end()) {
    std::string list;
    for (auto& s : c.choices) list += (list.empty() ? "" : ", ") + s;
    std::string hint = suggest(x, c.choices);
    fail(key, n, cat("must be one of ", list, " (got '", x, "'", hint.empty() ? "" : ", did you mean '" + hint + "'?", ")"));
  }
  v = x;
}

void Reader::operator()(const char* key, std::vector<std::string>& v, const Check&) {
  known_.push_back(key);
  if (!node_.IsMap()) return;
  YAML::Node n = child(key);
  if (!n || n.IsNull()) return;
  std::vector<std::string> out;
  if (n.IsScalar()) {
    out.push_back(n.Scalar());
  } else if (n.IsSequence()) {
    for (auto item : n) {
      if (!item.IsScalar()) fail(key, item, "must be a list of strings");
      out.push_back(item.Scalar());
    }
  } else {
    fail(key, n, "must be a string or a list of strings");
  }
  v = out;
}

void Reader::operator()(const char* key, std::vector<double>& v, const Check& c) {
  known_.push_back(key);
  if (!node_.IsMap()) return;
  YAML::Node n = child(key);
  if (!n || n.IsNull()) return;
  if (!n.IsSequence()) fail(key, n, cat("must be a list of numbers (got '", scalar_text(n), "')"));
  std::vector<double> out;
  for (auto item : n) {
    double x;
    if (!item.IsScalar() || !parse_scalar(item, x)) fail(key, item, cat("must be a list of numbers (got '", scalar_text(item), "')"));
    check_number(*this, key, item, x, c);
    out.push_back(x);
  }
  v = out;
}

void Reader::operator()(const char* key, nlohmann::json& v, const Check&) {
  known_.push_back(key);
  if (!node_.IsMap()) return;
  YAML::Node n = child(key);
  if (!n || n.IsNull()) return;
  if (!n.IsMap()) fail(key, n, "must be a mapping");
  nlohmann::json j = yaml_to_json(n);
  // Keep the YAML's keys on top of the defaults.
  if (!v.is_object()) v = nlohmann::json::object();
  for (auto& [k, val] : j.items()) v[k] = val;
}

void Reader::finish() {
  if (!node_.IsMap()) return;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    std::string k = it->first.Scalar();
    if (std::find(known_.begin(), known_.end(), k) != known_.end()) continue;
    std::string hint = suggest(k, known_);
    std::string where_txt = where(k, it->first);
    throw ConfigError(cat("config: unknown key '", join(k), "'",
                          hint.empty() ? "" : cat(", did you mean '", join(hint), "'?"), " ", where_txt));
  }
}

void Writer::operator()(const char* key, const nlohmann::json& v, const Check&) {
  out_ << YAML::Key << key << YAML::Value;
  json_to_yaml(out_, v);
}

nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (!n || n.IsNull()) return nullptr;
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (auto it = n.begin(); it != n.end(); ++it) j[it->first.Scalar()] = yaml_to_json(it->second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (auto item : n) j.push_back(yaml_to_json(item));
    return j;
  }
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted string
  int64_t i;
  double d;
  bool b;
  if (parse_scalar(n, i)) return i;
  if (parse_scalar(n, d)) return d;
  if (parse_scalar(n, b)) return b;
  if (s == "null" || s == "~") return nullptr;
  return s;
}

void json_to_yaml(YAML::Emitter& out, const nlohmann::json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      json_to_yaml(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (auto& v : j) json_to_yaml(out, v);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    out << j.get<std::string>();
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<int64_t>();
  } else if (j.is_number()) {
    out << j.get<double>();
  } else {
    out << YAML::Null;
  }
}

void apply_override(YAML::Node& root, const std::string& assignment, Source& source) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(cat("config: override '", assignment, "' must look like key.sub=value"));
  std::string key = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    // Plain text that YAML cannot take, such as module patterns "[model.layers.{*}]": a bracketed
    // list splits at commas outside braces; anything else is a string.
    if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
      value = YAML::Node(YAML::NodeType::Sequence);
      std::string cur;
      int depth = 0;
      auto flush = [&] {
        auto b = cur.find_first_not_of(' '), e2 = cur.find_last_not_of(' ');
        if (b != std::string::npos) value.push_back(cur.substr(b, e2 - b + 1));
        cur.clear();
      };
      for (char ch : text.substr(1, text.size() - 2)) {
        if (ch == '{') ++depth;
        if (ch == '}') --depth;
        if (ch == ',' && depth == 0) flush();
        else cur += ch;
      }
      flush();
    } else {
      value = YAML::Node(text);
    }
  }
  if (!value || value.IsNull()) value = YAML::Node(text.empty() ? "" : text);
  std::vector<std::string> parts = split_path(key);
  for (auto& p : parts)
    if (p.empty()) throw ConfigError(cat("config: override '", assignment, "' has an empty key segment"));
  // yaml-cpp nodes are handles: walk down by reassigning a handle, creating maps as needed.
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next || next.IsNull()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[parts[i]];
    } else if (!next.IsMap()) {
      throw ConfigError(cat("config: override '", assignment, "': '", parts[i], "' is not a section"));
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = value;
  source.overridden_keys.insert(key);
}

}  // namespace mm::config
