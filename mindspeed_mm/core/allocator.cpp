#include "mindspeed_mm/core/allocator.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>

#include <cstdlib>
#include <string>

namespace mm {

void configure_host_allocator() {
  // MM_HOST_ALLOCATOR=system keeps glibc's defaults (freed blocks go back to the kernel): a lower
  // resident size, e.g. when measuring what a run really holds.
  const char* mode = std::getenv("MM_HOST_ALLOCATOR");
  if (mode && std::string(mode) == "system") return;
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

long long resident_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<long long>(resident) * sysconf(_SC_PAGESIZE);
}

}  // namespace mm
