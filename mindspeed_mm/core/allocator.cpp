#include "mindspeed_mm/core/allocator.h"

#include <malloc.h>

namespace mm {

void configure_host_allocator() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace mm
