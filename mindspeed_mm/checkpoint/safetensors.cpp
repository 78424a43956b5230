// Safetensors reader (validating, zero-copy over a private file mapping) and atomic writer.
// Validation follows HF's Rust reader: tensors must tile the data section exactly, in any header
// order, with no overlap, no gap and no trailing bytes.
#include "mindspeed_mm/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/torch_compat.h"
#include "mindspeed_mm/core/strings.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors IO assumes a little-endian host (the format is little-endian)"
#endif

namespace mm::st {

using ojson = nlohmann::ordered_json;

namespace {

// HF's reader refuses headers above this size (safetensors MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeName { at::ScalarType dtype; const char* name; };

const DtypeName kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
    {at::ScalarType::Float8_e4m3fn, "F8_E4M3"}, {at::ScalarType::Float8_e5m2, "F8_E5M2"},
};

bool lookup_dtype(const std::string& name, at::ScalarType* out) {
  for (const auto& d : kDtypes)
    if (name == d.name) { *out = d.dtype; return true; }
  return false;
}

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw Error(cat("safetensors: ", path, ": ", msg));
}

[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, const std::string& msg) {
  fail(path, cat("tensor \"", name, "\": ", msg));
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
  return s + "]";
}

uint64_t elem_size(at::ScalarType t) { return static_cast<uint64_t>(c10::elementSize(t)); }

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(path, cat("write failed: ", std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself already happened
  ::fsync(fd);
  ::close(fd);
}

// Runs body(fd, tmp_path) on path + ".tmp", fsyncs, renames over path. On any failure the
// temporary file is removed and the previous file at path is untouched.
template <class WriteBody>
void write_atomic(const std::string& path, WriteBody&& body) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, cat("cannot create: ", std::strerror(errno)));
  try {
    body(fd, tmp);
    if (::fsync(fd) != 0) fail(tmp, cat("fsync failed: ", std::strerror(errno)));
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail(tmp, cat("close failed: ", std::strerror(errno)));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail(path, cat("cannot rename ", tmp, " into place: ", std::strerror(errno)));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_parent_dir(path);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// dtype names

std::string dtype_to_safetensors(at::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  throw Error(cat("safetensors: dtype ", c10::toString(dtype), " has no safetensors equivalent"));
}

at::ScalarType dtype_from_safetensors(const std::string& name) {
  at::ScalarType t;
  if (!lookup_dtype(name, &t)) throw Error(cat("safetensors: unknown dtype \"", name, "\""));
  return t;
}

// ---------------------------------------------------------------------------------------------
// Reader

struct Mapping {
  char* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

namespace {

std::shared_ptr<Mapping> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, cat("cannot open: ", std::strerror(errno)));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  const auto size = static_cast<uint64_t>(sb.st_size);
  if (size < 8) {
    ::close(fd);
    fail(path, cat("file too short (", size, " bytes) to hold the 8-byte header length"));
  }
  // A private writable mapping: tensors viewing it may be modified in place without touching
  // the file (as torch's own from_file does); NORESERVE keeps huge files from being refused by
  // overcommit accounting. Fall back to read-only if the kernel refuses.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail(path, cat("mmap failed: ", std::strerror(err)));
  auto m = std::make_shared<Mapping>();
  m->addr = static_cast<char*>(p);
  m->size = size;
  return m;
}

// Parses the header, rejecting duplicate keys at any depth (nlohmann silently keeps the last).
ojson parse_header(const std::string& path, const char* begin, const char* end) {
  std::vector<std::set<std::string>> open_objects;
  std::string top_key, dup_key, dup_owner;
  bool dup = false;
  auto cb = [&](int, ojson::parse_event_t ev, ojson& parsed) {
    if (ev == ojson::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == ojson::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == ojson::parse_event_t::key && !open_objects.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (open_objects.size() == 1) top_key = k;
      if (!open_objects.back().insert(k).second && !dup) {
        dup = true;
        dup_key = k;
        dup_owner = open_objects.size() == 1 ? "" : top_key;
      }
    }
    return true;
  };
  ojson h;
  try {
    h = ojson::parse(begin, end, cb);
  } catch (const nlohmann::json::exception& e) {
    fail(path, cat("header is not valid JSON (", json_error_text(e.what()), ")"));
  }
  if (!h.is_object()) fail(path, cat("header is not a JSON object (got ", h.type_name(), ")"));
  if (dup && dup_owner.empty()) fail(path, cat("duplicate tensor name \"", dup_key, "\" in header"));
  if (dup) fail(path, cat("entry \"", dup_owner, "\": duplicate key \"", dup_key, "\" in header"));
  return h;
}

// A non-negative JSON integer, or an error naming what it is.
uint64_t json_uint(const std::string& path, const std::string& name, const ojson& v, const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) fail_tensor(path, name, cat("negative ", what, " ", printable(v.dump())));
  fail_tensor(path, name, cat("non-integer ", what, " ", printable(v.dump())));
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const ojson& e) {
  if (!e.is_object()) fail_tensor(path, name, cat("entry is not a JSON object (got ", e.type_name(), ")"));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!e.contains(field)) fail_tensor(path, name, cat("missing \"", field, "\""));

  TensorInfo ti{};
  const ojson& dt = e["dtype"];
  if (!dt.is_string()) fail_tensor(path, name, cat("\"dtype\" is not a string (got ", printable(dt.dump()), ")"));
  if (!lookup_dtype(dt.get<std::string>(), &ti.dtype))
    fail_tensor(path, name, cat("unknown dtype ", printable(dt.dump())));

  const ojson& shape = e["shape"];
  if (!shape.is_array()) fail_tensor(path, name, cat("\"shape\" is not an array (got ", printable(shape.dump()), ")"));
  uint64_t nbytes = elem_size(ti.dtype);
  for (const auto& d : shape) {
    uint64_t dim = json_uint(path, name, d, "dimension");
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(nbytes, dim, &nbytes))
      fail_tensor(path, name, cat("shape ", printable(shape.dump()), " is too large"));
    ti.shape.push_back(static_cast<int64_t>(dim));
  }

  const ojson& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail_tensor(path, name, cat("\"data_offsets\" must be 2 non-negative integers (got ", printable(off.dump()), ")"));
  ti.begin = json_uint(path, name, off[0], "data offset");
  ti.end = json_uint(path, name, off[1], "data offset");
  if (ti.begin > ti.end) fail_tensor(path, name, cat("data_offsets begin ", ti.begin, " > end ", ti.end));
  if (ti.end - ti.begin != nbytes)
    fail_tensor(path, name, cat("data_offsets span ", ti.end - ti.begin, " bytes but ", dt.get<std::string>(),
                                " ", shape_str(ti.shape), " needs ", nbytes, " bytes"));
  return ti;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path), map_(map_file(path)) {
  const uint64_t file_size = map_->size;
  uint64_t header_len;
  std::memcpy(&header_len, map_->addr, 8);
  if (header_len > file_size - 8)
    fail(path, cat("header length ", header_len, " exceeds file size ", file_size));
  if (header_len > kMaxHeaderBytes)
    fail(path, cat("header length ", header_len, " exceeds the ", kMaxHeaderBytes, "-byte limit"));
  data_offset_ = 8 + header_len;
  const uint64_t data_size = file_size - data_offset_;

  const char* h = map_->addr + 8;
  ojson header = parse_header(path, h, h + header_len);

  std::vector<std::string> names;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    const ojson& v = item.value();
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      if (!v.is_object()) fail(path, cat("__metadata__ is not a JSON object (got ", v.type_name(), ")"));
      for (const auto& m : v.items()) {
        if (!m.value().is_string())
          fail(path, cat("__metadata__ value for \"", m.key(), "\" is not a string (got ", printable(m.value().dump()), ")"));
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TensorInfo ti = parse_entry(path, name, v);
    if (ti.end > data_size)
      fail_tensor(path, name, cat("data_offsets end ", ti.end, " is beyond the data section (", data_size,
                                  " bytes)"));
    infos_.emplace(name, std::move(ti));
    names.push_back(name);
  }

  // File order; ties (empty tensors) sort before the tensor starting at the same offset.
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    const TensorInfo& x = infos_.at(a);
    const TensorInfo& y = infos_.at(b);
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t pos = 0;
  const std::string* last = nullptr;  // the tensor whose end is pos
  for (const auto& name : names) {
    const TensorInfo& ti = infos_.at(name);
    if (ti.begin < pos)
      fail_tensor(path, name, cat("data_offsets [", ti.begin, ", ", ti.end, "] overlap tensor \"", *last,
                                  "\" (ends at ", pos, ")"));
    if (ti.begin > pos)
      fail_tensor(path, name, cat("gap in data section: bytes [", pos, ", ", ti.begin,
                                  ") before this tensor belong to no tensor"));
    if (ti.end > pos || !last) last = &name;
    pos = ti.end;
  }
  if (pos != data_size)
    fail(path, cat("data section has ", data_size, " bytes but tensors cover only ", pos,
                   " (trailing bytes)"));
  keys_ = std::move(names);
}

const std::vector<std::string>& SafetensorsReader::keys() const { return keys_; }

bool SafetensorsReader::has(const std::string& name) const { return infos_.count(name) > 0; }

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) fail(path_, cat("no tensor \"", name, "\" (file has ", keys_.size(), " tensors)"));
  return it->second;
}

at::Tensor SafetensorsReader::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  if (ti.begin == ti.end) return at::empty(ti.shape, at::TensorOptions().dtype(ti.dtype));
  char* p = map_->addr + data_offset_ + ti.begin;
  // Kernels may assume natural alignment; offsets written by other tools need not give it.
  if (reinterpret_cast<uintptr_t>(p) % elem_size(ti.dtype) != 0) return get_copy(name);
  std::shared_ptr<Mapping> keep = map_;
  return at::from_blob(p, ti.shape, [keep](void*) {}, at::TensorOptions().dtype(ti.dtype));
}

at::Tensor SafetensorsReader::get_copy(const std::string& name) const {
  const TensorInfo& ti = info(name);
  at::Tensor t = at::empty(ti.shape, at::TensorOptions().dtype(ti.dtype));
  if (ti.end > ti.begin) std::memcpy(t.data_ptr(), map_->addr + data_offset_ + ti.begin, ti.end - ti.begin);
  return t;
}

void SafetensorsReader::release(const void* p, size_t bytes) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = std::max(reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(map_->addr));
  const auto hi = std::min(reinterpret_cast<uintptr_t>(p) + bytes, reinterpret_cast<uintptr_t>(map_->addr) + map_->size);
  const uintptr_t begin = (lo + page - 1) / page * page, end = hi / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return metadata_; }

const std::string& SafetensorsReader::path() const { return path_; }

// ---------------------------------------------------------------------------------------------
// Writer

std::vector<TensorSpec> specs_of(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<TensorSpec> out;
  for (const auto& [name, t] : tensors)
    out.push_back({name, t.defined() ? t.scalar_type() : at::kFloat, t.defined() ? t.sizes().vec() : std::vector<int64_t>{}});
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) fail_tensor(path, name, "tensor is undefined");
    if (t.layout() != at::kStrided) fail_tensor(path, name, "only dense (strided) tensors can be saved");
  }
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].first, i);
  save_safetensors(path, specs_of(tensors), [&](const std::string& name) { return tensors[index.at(name)].second; },
                   metadata);
}

void save_safetensors_streamed(const std::string& path, const std::vector<TensorSpec>& specs, const TensorWriter& write,
                               const std::map<std::string, std::string>& metadata) {
  ojson header = ojson::object();
  if (!metadata.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> seen;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const auto& spec : specs) {
    const std::string& name = spec.name;
    if (name == "__metadata__") fail(path, "\"__metadata__\" is reserved and cannot name a tensor");
    if (!seen.insert(name).second) fail(path, cat("duplicate tensor name \"", name, "\""));
    std::string dt;
    try {
      dt = dtype_to_safetensors(spec.dtype);
    } catch (const Error& e) {
      fail_tensor(path, name, e.what());
    }
    uint64_t numel = 1;
    for (int64_t d : spec.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t nbytes = numel * elem_size(spec.dtype);
    ojson e = ojson::object();
    e["dtype"] = dt;
    e["shape"] = spec.shape;
    e["data_offsets"] = ojson::array({offset, offset + nbytes});
    header[name] = std::move(e);
    sizes.push_back(nbytes);
    offset += nbytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(path, cat("a tensor name or metadata string is not valid UTF-8 (", json_error_text(e.what()), ")"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  const uint64_t header_len = text.size();

  write_atomic(path, [&](int fd, const std::string& tmp) {
    write_all(fd, &header_len, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (size_t i = 0; i < specs.size(); ++i) {
      uint64_t written = 0;
      write(specs[i].name, [&](const void* data, size_t n) {
        if (written + n > sizes[i])
          fail_tensor(tmp, specs[i].name, cat("more than the header's ", sizes[i], " bytes were written"));
        write_all(fd, data, n, tmp);
        written += n;
      });
      if (written != sizes[i])
        fail_tensor(tmp, specs[i].name, cat(written, " bytes were written, the header says ", sizes[i]));
    }
  });
}

void save_safetensors(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFetch& fetch,
                      const std::map<std::string, std::string>& metadata) {
  std::map<std::string, const TensorSpec*> by_name;
  for (const auto& spec : specs) by_name[spec.name] = &spec;
  save_safetensors_streamed(
      path, specs,
      [&](const std::string& name, const std::function<void(const void*, size_t)>& sink) {
        const TensorSpec& spec = *by_name.at(name);
        at::Tensor c = fetch(name).detach().to(at::kCPU).to(spec.dtype).contiguous();
        if (c.sizes().vec() != spec.shape)
          fail_tensor(path, name, cat("fetched tensor has shape ", c.sizes(), ", the header says ", c10::IntArrayRef(spec.shape)));
        if (c.nbytes() > 0) sink(c.data_ptr(), c.nbytes());
      },
      metadata);
}

void write_file_atomic_streaming(const std::string& path, const std::function<void(const ByteSink& write)>& body) {
  write_atomic(path, [&](int fd, const std::string& tmp) {
    body([&](const void* data, size_t n) { write_all(fd, data, n, tmp); });
  });
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_atomic(path, [&](int fd, const std::string& tmp) { write_all(fd, bytes.data(), bytes.size(), tmp); });
}

}  // namespace mm::st
