#include "mindspeed_mm/core/allocator.h"

#include <malloc.h>

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

}  // namespace mm
