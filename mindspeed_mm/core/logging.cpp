#include "mindspeed_mm/core/logging.h"

#include <cstdio>
#include <mutex>

namespace mm::log {
namespace {
Level g_level = Level::kInfo;
int g_rank = -1;
std::mutex g_mu;
}  // namespace

void set_level(Level l) { g_level = l; }
void set_rank(int r) { g_rank = r; }
Level level() { return g_level; }

void write(Level l, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warning", "error"};
  std::lock_guard<std::mutex> lock(g_mu);
  FILE* f = l >= Level::kWarn ? stderr : stdout;
  if (g_rank >= 0) std::fprintf(f, "[rank %d] ", g_rank);
  if (l != Level::kInfo) std::fprintf(f, "%s: ", names[static_cast<int>(l)]);
  std::fprintf(f, "%s\n", msg.c_str());
  std::fflush(f);
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

}  // namespace mm::log
