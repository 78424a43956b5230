// Safetensors IO: a validating, zero-copy reader over a read-only mapping of the file, and an
// atomic writer. Format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {str: str}}, then the data section, which the tensors tile exactly.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mm::st {

// One tensor's header entry. begin/end are byte offsets relative to the data section.
struct TensorInfo {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

struct Mapping;  // the file's mapping; lives as long as the reader or any tensor viewing it

// Opens and fully validates a safetensors file (as strictly as HF's reader: contiguous, non-
// overlapping offsets, sizes matching dtype x shape, no duplicate keys). Every failure is an
// mm::Error naming the file and, where relevant, the tensor. Thread-safe after construction.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);

  const std::vector<std::string>& keys() const;  // in file order (sorted by offset)
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws mm::Error when missing

  // A CPU tensor viewing the mapping (zero-copy; copies only when the data is misaligned for
  // its dtype). Writes to it stay private to this process: the file is never modified.
  at::Tensor get(const std::string& name) const;
  // An owned contiguous copy, independent of the file.
  at::Tensor get_copy(const std::string& name) const;

  // Gives back the memory of the mapping's pages wholly inside [p, p + bytes) (madvise
  // MADV_DONTNEED: read again from the file if touched later); a range outside the mapping is
  // ignored. For streaming readers (mm convert) that touch each page once: only for pages no
  // tensor has written to (a private mapping's written pages would read as the file again).
  void release(const void* p, size_t bytes) const;

  const std::map<std::string, std::string>& metadata() const;  // "__metadata__"
  const std::string& path() const;
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section

 private:
  std::string path_;
  std::shared_ptr<Mapping> map_;
  uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::unordered_map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// Writes atomically: to path + ".tmp", fsync, rename. Tensors are made contiguous and CPU; names
// must be unique and not "__metadata__". The header is compact JSON padded with spaces to a
// multiple of 8 bytes (as HF does); data offsets follow insertion order.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A tensor to be written without holding it yet: name, dtype and shape for the header; the
// data comes from `fetch(name)`, called once per tensor in order while the file is written, so a
// writer needs only one tensor in memory at a time (streaming export of sharded weights).
struct TensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
using TensorFetch = std::function<at::Tensor(const std::string& name)>;
void save_safetensors(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFetch& fetch,
                      const std::map<std::string, std::string>& metadata = {});
// The same with each tensor's bytes pushed by write(name, sink) in pieces (a window of a mapped
// input at a time): the writer never holds a whole tensor. mm::Error when a tensor's byte count
// differs from its spec.
using TensorWriter = std::function<void(const std::string& name, const std::function<void(const void*, size_t)>& sink)>;
void save_safetensors_streamed(const std::string& path, const std::vector<TensorSpec>& specs, const TensorWriter& write,
                               const std::map<std::string, std::string>& metadata = {});
std::vector<TensorSpec> specs_of(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// Writes bytes to path + ".tmp", fsyncs, renames over path (and fsyncs the directory): a crash
// leaves either the old file or the new one. Used for index files beside the shards.
void write_file_atomic(const std::string& path, const std::string& bytes);
// The same for bytes produced piece by piece: body(write) calls write(data, n) as often as it likes.
using ByteSink = std::function<void(const void* data, size_t n)>;
void write_file_atomic_streaming(const std::string& path, const std::function<void(const ByteSink& write)>& body);

// Safetensors dtype strings: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL (and F8_E4M3/F8_E5M2 on
// libtorch >= 2.1). Both throw mm::Error for anything else.
std::string dtype_to_safetensors(at::ScalarType dtype);
at::ScalarType dtype_from_safetensors(const std::string& name);

}  // namespace mm::st
