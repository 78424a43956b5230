// YAML <-> typed config structs. Each config struct lists its fields once, in
// `template <class IO> void io(IO& io)`, as `io("key", field, check)`; the same list drives
// reading (type and range checks, unknown keys with a "did you mean"), and writing the
// resolved config (`mm train --print-config`).
//
// Every error is a ConfigError of one line naming the dotted key and where it came from:
//   config: training.lr must be > 0 (got -1) in fashion.yaml line 12
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mindspeed_mm/core/errors.h"

namespace mm::config {

// A value check: returns "" when fine, else the failed requirement ("must be > 0").
struct Check {
  std::function<std::string(double)> number;
  std::vector<std::string> choices;  // for strings
};
Check any();
Check gt(double lo);
Check ge(double lo);
Check in_range(double lo, double hi);  // inclusive
Check one_of(std::vector<std::string> choices);

std::string suggest(const std::string& key, const std::vector<std::string>& known);

// Where a YAML document came from, for messages.
struct Source {
  std::string file;                          // "fashion.yaml"
  std::set<std::string> overridden_keys;     // dotted keys set on the command line
};

class Reader {
 public:
  Reader(YAML::Node node, std::string path, const Source* source);

  void operator()(const char* key, int64_t& v, const Check& c = any());
  void operator()(const char* key, double& v, const Check& c = any());
  void operator()(const char* key, bool& v, const Check& c = any());
  void operator()(const char* key, std::string& v, const Check& c = any());
  void operator()(const char* key, std::vector<std::string>& v, const Check& c = any());
  void operator()(const char* key, std::vector<double>& v, const Check& c = any());
  void operator()(const char* key, nlohmann::json& v, const Check& c = any());  // free-form map
  template <class T>
  void section(const char* key, T& s) {
    known_.push_back(key);
    YAML::Node child = this->child(key);
    if (child && !child.IsNull() && !child.IsMap()) fail(key, child, "must be a mapping");
    Reader r(child && child.IsMap() ? child : YAML::Node(YAML::NodeType::Map), join(key), source_);
    s.io(r);
    r.finish();
  }
  // Throws for keys present in the YAML that no field asked for.
  void finish();

  [[noreturn]] void fail(const std::string& key, const YAML::Node& n, const std::string& what) const;
  std::string where(const std::string& key, const YAML::Node& n) const;

 private:
  friend class ReaderAccess;
  std::string join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  YAML::Node scalar(const char* key);
  YAML::Node child(const char* key) const;
  YAML::Node node_;
  std::string path_;
  const Source* source_;
  std::vector<std::string> known_;
};

class Writer {
 public:
  explicit Writer(YAML::Emitter& out) : out_(out) {}
  template <class T>
  void operator()(const char* key, const T& v, const Check& = any()) {
    out_ << YAML::Key << key << YAML::Value << v;
  }
  void operator()(const char* key, const nlohmann::json& v, const Check& = any());
  template <class T>
  void section(const char* key, T& s) {
    out_ << YAML::Key << key << YAML::Value << YAML::BeginMap;
    s.io(*this);
    out_ << YAML::EndMap;
  }

 private:
  YAML::Emitter& out_;
};

// Applies "a.b.c=value" to the YAML tree; the value is parsed as YAML ("[1, 2]", "3e-4", "true").
void apply_override(YAML::Node& root, const std::string& assignment, Source& source);

nlohmann::json yaml_to_json(const YAML::Node& n);
void json_to_yaml(YAML::Emitter& out, const nlohmann::json& j);

}  // namespace mm::config
