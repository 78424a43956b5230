// Checkpoint metadata: any bytes as metadata.json of a real sharded checkpoint (seeds/checkpoint,
// a tiny run resplit to two data-parallel shards by make_seeds.sh), then every tensor of both
// kinds read whole, its pieces listed, and the training state, RNG and loader state read. Shard
// ranges must stay inside their files and inside the tensor; a tensor read has its stated shape.
#include <filesystem>

#include "fuzz_util.h"
#include "mindspeed_mm/checkpoint/train_checkpoint.h"

namespace fs = std::filesystem;

namespace {
std::string dir() { return mm::fuzz::scratch() + "/ck"; }
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string src = mm::fuzz::fixtures() + "/checkpoint";
  if (!fs::exists(src + "/metadata.json")) {
    std::fprintf(stderr, "fuzz_checkpoint_metadata: MM_FUZZ_FIXTURES must hold checkpoint/ (make_seeds.sh)\n");
    std::exit(1);
  }
  fs::copy(src, dir(), fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mm::fuzz::write("ck/metadata.json", {reinterpret_cast<const char*>(data), size});
  MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
    const mm::checkpoint::CheckpointReader r(dir());
    for (const std::string kind : {"model", "optimizer"})
      for (const std::string& name : r.names(kind)) {
        MM_FUZZ_EXPECT_ONLY_MM_ERRORS({
          const std::vector<int64_t> shape = r.shape(kind, name);
          (void)r.pieces(kind, name);
          const at::Tensor t = r.read_full(kind, name);
          if (t.sizes().vec() != shape || t.scalar_type() != r.dtype(kind, name)) __builtin_trap();
        });
      }
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS((void)r.train_state());
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS((void)r.rng_state());
    MM_FUZZ_EXPECT_ONLY_MM_ERRORS((void)r.loader_state(0, 2));
  });
  return 0;
}
