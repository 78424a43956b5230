// The `mm` binary: one entry point for every command.
#include <cstdio>
#include <string>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/torch_compat.h"

int main(int argc, char** argv) {
  std::printf("mm: libtorch %s\n", mm::compat::torch_version().c_str());
  return 0;
}
