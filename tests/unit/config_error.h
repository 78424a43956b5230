// The message of the mm::ConfigError that f throws ("" when it throws none).
#pragma once

#include <functional>
#include <string>

#include "mindspeed_mm/core/errors.h"

namespace mm::test {

inline std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const mm::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace mm::test
