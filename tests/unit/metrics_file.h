// Reading `mm train`'s metrics JSONL in end-to-end tests.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_command.h"

namespace mm::test {

// iteration -> the last logged loss (a resumed run re-logs the iterations after its checkpoint).
inline std::map<int64_t, double> metrics_losses(const std::string& metrics_path) {
  std::map<int64_t, double> out;
  std::istringstream in(read_file(metrics_path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["iter"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

// Every logged validation loss, in order.
inline std::vector<double> metrics_val_losses(const std::string& metrics_path) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics_path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) out.push_back(j["val_loss"].get<double>());
  }
  return out;
}

}  // namespace mm::test
