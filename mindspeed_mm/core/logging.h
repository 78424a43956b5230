// Logging: rank-aware, timestamped lines on stderr/stdout. Kept tiny on purpose.
#pragma once

#include <string>

#include "mindspeed_mm/core/errors.h"

namespace mm::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_level(Level level);
void set_rank(int rank);  // prefixes "[rank N]" when set >= 0 with world > 1
Level level();

void write(Level level, const std::string& msg);

// v with `decimals` digits after the point: fixed(2.30259, 4) = "2.3026".
std::string fixed(double v, int decimals);

template <class... A> void info(const A&... a) { if (level() <= Level::kInfo) write(Level::kInfo, cat(a...)); }
template <class... A> void warn(const A&... a) { if (level() <= Level::kWarn) write(Level::kWarn, cat(a...)); }
template <class... A> void debug(const A&... a) { if (level() <= Level::kDebug) write(Level::kDebug, cat(a...)); }
template <class... A> void error(const A&... a) { write(Level::kError, cat(a...)); }

}  // namespace mm::log
