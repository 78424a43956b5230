#include "mindspeed_mm/data/mllm/record_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string_view>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/data/text_dataset.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mm::data {

// The file, read-only mapped (null for an empty file).
struct MllmRecordIndex::Mapping {
  const char* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data) ::munmap(const_cast<char*>(data), size);
  }
};

namespace {

// 02: the header holds a checksum of everything after it (a cache is trusted only when it matches).
constexpr char kMagic[8] = {'M', 'M', 'R', 'I', 'D', 'X', '0', '2'};

uint64_t fnv(uint64_t h, std::string_view s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ULL;
  return (h ^ 0xFF) * 0x100000001B3ULL;  // a separator, so ("ab","c") and ("a","bc") differ
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// The end of the JSON value starting at `pos` (one past its last character), skipping strings
// and nesting; `size` when the text ends first.
size_t value_end(const char* t, size_t pos, size_t size) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < size; ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (depth == 0) return i;  // the enclosing array's end
      --depth;
    } else if (c == ',' && depth == 0) {
      return i;
    }
  }
  return size;
}

// FNV-1a over 8-byte little-endian words (the tail byte by byte): fast enough to check a 10M-
// record cache on every open, and any change to one word changes the sum.
struct Checksum {
  static constexpr uint64_t kPrime = 0x100000001B3ULL;
  uint64_t h = 0xCBF29CE484222325ULL;
  unsigned char carry[8];
  size_t n = 0;
  void add(const void* data, size_t len) {
    const auto* c = static_cast<const unsigned char*>(data);
    for (; len > 0 && n > 0; --len) push(*c++);
    for (; len >= 8; c += 8, len -= 8) {
      uint64_t w;
      std::memcpy(&w, c, 8);
      h = (h ^ w) * kPrime;
    }
    for (; len > 0; --len) push(*c++);
  }
  uint64_t done() {
    for (size_t i = 0; i < n; ++i) h = (h ^ carry[i]) * kPrime;
    n = 0;
    return h;
  }

 private:
  void push(unsigned char b) {
    carry[n++] = b;
    if (n == 8) {
      uint64_t w;
      std::memcpy(&w, carry, 8);
      h = (h ^ w) * kPrime;
      n = 0;
    }
  }
};

uint64_t checksum(std::string_view bytes) {
  Checksum c;
  c.add(bytes.data(), bytes.size());
  return c.done();
}

// The cache body is streamed to the file with its checksum kept on the way (no copy of it in
// memory: at 10M records it is hundreds of megabytes).
struct BodyWriter {
  std::ofstream& out;
  Checksum sum;
  void bytes(const void* p, size_t n) {
    out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    sum.add(p, n);
  }
  template <class T>
  void put(const T& v) { bytes(&v, sizeof(T)); }
  template <class T>
  void put_vec(const std::vector<T>& v) {
    if (!v.empty()) bytes(v.data(), v.size() * sizeof(T));
  }
  void put_str(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
};

// Reads the cache body front to back; every read is bounds-checked (false past the end).
struct BodyReader {
  std::string_view body;
  size_t pos = 0;
  template <class T>
  bool get(T& v) {
    if (body.size() - pos < sizeof(T)) return false;
    std::memcpy(&v, body.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
  }
  template <class T>
  bool get_vec(std::vector<T>& v, uint64_t n) {
    if (n > (body.size() - pos) / sizeof(T)) return false;  // before allocating: n comes from the file
    v.resize(n);
    if (n) std::memcpy(v.data(), body.data() + pos, n * sizeof(T));
    pos += n * sizeof(T);
    return true;
  }
  bool get_str(std::string& s) {
    uint32_t n = 0;
    if (!get(n) || n > body.size() - pos) return false;
    s.assign(body.data() + pos, n);
    pos += n;
    return true;
  }
};


struct Header {
  uint64_t settings = 0, file_size = 0;
  int64_t mtime_ns = 0;
  uint64_t array = 0, good = 0, skips = 0, bad = 0;
  uint64_t checksum = 0;  // of the body: every byte after the header
};

std::string cache_path(const std::string& path) { return path + ".mmidx"; }

}  // namespace

MllmRecordIndex::MllmRecordIndex(const std::string& path, const MllmAttr& attr, const std::string& media_root)
    : path_(path), name_(fs::path(path).filename().string()), attr_(attr), map_(std::make_unique<Mapping>()) {
  const fs::path root = media_root.empty() ? fs::path(path).parent_path() : fs::path(media_root);
  media_root_ = root.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MM_CHECK(fd >= 0, "data: cannot read '", path, "': ", std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    throw Error(cat("data: '", path, "' is not a regular file"));
  }
  file_size_ = static_cast<uint64_t>(sb.st_size);
  mtime_ns_ = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
  if (file_size_ > 0) {
    void* p = ::mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    MM_CHECK(p != MAP_FAILED, "data: cannot map '", path, "': ", std::strerror(err));
    map_->data = static_cast<const char*>(p);
    map_->size = file_size_;
  } else {
    ::close(fd);
  }
  // What a record's parse depends on besides the bytes: the field names and the media root.
  uint64_t settings = 0xCBF29CE484222325ULL;
  const std::string& root_str = media_root_;
  for (const std::string* s : {&attr.messages, &attr.images, &attr.videos, &attr.system, &attr.role_tag,
                               &attr.content_tag, &attr.user_tag, &attr.assistant_tag, &attr.system_tag, &root_str})
    settings = fnv(settings, *s);
  if (load_cache(settings)) return;
  scan();
  offsets_.shrink_to_fit();
  lengths_.shrink_to_fit();
  write_cache(settings);
}

MllmRecordIndex::~MllmRecordIndex() = default;

void MllmRecordIndex::scan() {
  const char* t = map_->data;
  const size_t size = map_->size;
  int64_t skipped = 0;
  auto note_skip = [&] {
    ++skipped;
    const int64_t next_good = static_cast<int64_t>(offsets_.size());
    if (!skips_.empty() && skips_.back().first == next_good) skips_.back().second = skipped;
    else skips_.emplace_back(next_good, skipped);
  };
  auto take = [&](std::string_view text, uint64_t offset, const std::string& where) {
    // A NUL byte ends nlohmann's input early: a record holding one is not JSON (as in read_mllm_file).
    json j = text.find('\0') == std::string_view::npos ? json::parse(text, nullptr, /*allow_exceptions=*/false)
                                                        : json(json::value_t::discarded);
    if (j.is_discarded()) {
      bad_.push_back({where, "not valid JSON"});
      return false;
    }
    MllmRecord r;
    std::string why = parse_mllm_record(j, attr_, media_root_, r);
    if (!why.empty()) {
      bad_.push_back({where, why});
      return false;
    }
    offsets_.push_back(offset);
    hashes_.push_back(document_hash(record_key(r, media_root_)));
    return true;
  };
  size_t first = 0;
  while (first < size && is_space(t[first])) ++first;
  array_ = first < size && t[first] == '[';
  if (array_) {
    const std::string broken = cat("data: '", path_, "' starts with '[' but is not a valid JSON array");
    size_t pos = first + 1;
    int64_t element = 0;
    while (true) {
      while (pos < size && is_space(t[pos])) ++pos;
      MM_CHECK(pos < size, broken);
      if (t[pos] == ']' && element == 0) {
        ++pos;
        break;
      }
      const size_t end = value_end(t, pos, size);
      MM_CHECK(end < size, broken);
      size_t last = end;
      while (last > pos && is_space(t[last - 1])) --last;
      MM_CHECK(last > pos, broken);
      const std::string_view text(t + pos, last - pos);
      MM_CHECK(text.find('\0') == std::string_view::npos && json::accept(text), broken);
      if (take(text, pos, cat(name_, "[", element, "]"))) lengths_.push_back(static_cast<uint32_t>(last - pos));
      else note_skip();
      ++element;
      pos = end + 1;
      if (t[end] == ']') break;
    }
    for (size_t i = pos; i < size; ++i) MM_CHECK(is_space(t[i]), broken);
    return;
  }
  int64_t line_no = 0;
  for (size_t pos = 0; pos < size;) {
    const char* nl = static_cast<const char*>(std::memchr(t + pos, '\n', size - pos));
    const size_t end = nl ? static_cast<size_t>(nl - t) : size;
    ++line_no;
    const std::string_view line(t + pos, end - pos);
    const size_t at = pos;
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
      note_skip();
      continue;
    }
    if (!take(line, at, cat(name_, ":", line_no))) note_skip();
  }
}

int64_t MllmRecordIndex::position(int64_t i) const {
  auto it = std::upper_bound(skips_.begin(), skips_.end(), std::make_pair(i, INT64_MAX));
  return i + (it == skips_.begin() ? 0 : std::prev(it)->second);
}

MllmRecord MllmRecordIndex::record(int64_t i) const {
  MM_CHECK(i >= 0 && i < size(), "data: record ", i, " of '", path_, "' is out of range (", size(), " records)");
  const char* t = map_->data;
  const uint64_t start = offsets_[static_cast<size_t>(i)];
  size_t end;
  if (array_) {
    end = start + lengths_[static_cast<size_t>(i)];
  } else {
    const char* nl = static_cast<const char*>(std::memchr(t + start, '\n', map_->size - start));
    end = nl ? static_cast<size_t>(nl - t) : map_->size;
  }
  const std::string where = array_ ? cat(name_, "[", position(i), "]") : cat(name_, ":", position(i) + 1);
  json j = json::parse(std::string_view(t + start, end - start), nullptr, /*allow_exceptions=*/false);
  MllmRecord r;
  const std::string why = j.is_discarded() ? "not valid JSON" : parse_mllm_record(j, attr_, media_root_, r);
  MM_CHECK(why.empty(), "data: ", where, " changed since '", path_, "' was opened: ", why);
  r.source = where;
  return r;
}

std::vector<bool> MllmRecordIndex::validation_split(double val_fraction, uint64_t seed) const {
  std::vector<bool> out(offsets_.size(), false);
  if (!(val_fraction > 0)) return out;
  if (!hashes_.empty() || offsets_.empty()) {
    for (size_t i = 0; i < hashes_.size(); ++i) out[i] = is_validation_hash(hashes_[i], val_fraction, seed);
    return out;
  }
  // The hashes stay in the cache file: read them in chunks.
  std::ifstream in(cache_path(path_), std::ios::binary);
  MM_CHECK(in, "data: the index of '", path_, "' disappeared while in use");
  const uint64_t n = offsets_.size();
  const std::streamoff at = static_cast<std::streamoff>(sizeof(kMagic) + sizeof(Header) + n * 8 +
                                                        (array_ ? n * 4 : 0) + skips_.size() * 16);
  in.seekg(at);
  std::vector<uint64_t> chunk(1 << 16);
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min<uint64_t>(chunk.size(), n - done);
    MM_CHECK(in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(k * 8)),
             "data: the index of '", path_, "' is truncated");
    for (uint64_t j = 0; j < k; ++j) out[done + j] = is_validation_hash(chunk[j], val_fraction, seed);
    done += k;
  }
  return out;
}

int64_t MllmRecordIndex::resident_bytes() const {
  return static_cast<int64_t>(offsets_.capacity() * 8 + lengths_.capacity() * 4 + skips_.capacity() * 16 +
                              hashes_.capacity() * 8);
}

// The cache is another file a user's disk can corrupt: it is used only when its checksum, its
// settings, the data file's size and mtime all match, and every offset, length and count it holds
// fits the data file; otherwise the file is scanned again. Nothing is kept from a rejected cache.
bool MllmRecordIndex::load_cache(uint64_t settings) {
  // Mapped, not read: the pages are the file's and go when it is unmapped, so a rank's resident
  // memory after the open is the index it keeps, not the cache file too.
  const int fd = ::open(cache_path(path_).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < sizeof(kMagic) + sizeof(Header)) {
    ::close(fd);
    return false;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return false;
  const std::unique_ptr<void, std::function<void(void*)>> unmap(p, [size](void* q) { ::munmap(q, size); });
  const std::string_view file(static_cast<const char*>(p), size);
  Header h;
  if (std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) return false;
  std::memcpy(&h, file.data() + sizeof(kMagic), sizeof(Header));
  const std::string_view body = file.substr(sizeof(kMagic) + sizeof(Header));
  if (h.settings != settings || h.file_size != file_size_ || h.mtime_ns != mtime_ns_ || h.array > 1 ||
      h.checksum != checksum(body))
    return false;
  BodyReader in{body};
  std::vector<uint64_t> offsets;
  std::vector<uint32_t> lengths;
  std::vector<std::pair<int64_t, int64_t>> skips;
  std::vector<BadRecord> bad;
  const bool array = h.array != 0;
  if (!in.get_vec(offsets, h.good) || (array && !in.get_vec(lengths, h.good))) return false;
  if (h.skips > (body.size() - in.pos) / 16) return false;
  skips.resize(h.skips);
  for (auto& sk : skips)
    if (!in.get(sk.first) || !in.get(sk.second) || sk.first < 0 || sk.second < 0) return false;
  if (h.good > (body.size() - in.pos) / 8) return false;
  in.pos += h.good * 8;  // the hashes: read when splitting
  if (h.bad > (body.size() - in.pos) / 8) return false;
  bad.resize(h.bad);
  for (auto& b : bad)
    if (!in.get_str(b.source) || !in.get_str(b.reason)) return false;
  if (in.pos != body.size()) return false;
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] >= file_size_ || (i > 0 && offsets[i] <= offsets[i - 1])) return false;
    if (array && lengths[i] > file_size_ - offsets[i]) return false;
  }
  array_ = array;
  offsets_ = std::move(offsets);
  lengths_ = std::move(lengths);
  skips_ = std::move(skips);
  bad_ = std::move(bad);
  from_cache_ = true;
  return true;
}

void MllmRecordIndex::write_cache(uint64_t settings) {
  const std::string final_path = cache_path(path_);
  const std::string tmp = cat(final_path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;  // a read-only folder: the next open scans again
    const Header placeholder{};
    out.write(kMagic, sizeof(kMagic));
    out.write(reinterpret_cast<const char*>(&placeholder), sizeof(placeholder));
    BodyWriter body{out};
    body.put_vec(offsets_);
    if (array_) body.put_vec(lengths_);
    for (const auto& sk : skips_) {
      body.put(sk.first);
      body.put(sk.second);
    }
    body.put_vec(hashes_);
    for (const auto& b : bad_) {
      body.put_str(b.source);
      body.put_str(b.reason);
    }
    const Header h{settings, file_size_, mtime_ns_, array_ ? 1u : 0u, offsets_.size(), skips_.size(), bad_.size(),
                   body.sum.done()};
    out.seekp(static_cast<std::streamoff>(sizeof(kMagic)));
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    if (!out.flush()) {
      out.close();
      fs::remove(tmp);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return;
  }
  // Written: the hashes are read back from the file when the split needs them.
  std::vector<uint64_t>().swap(hashes_);
}

}  // namespace mm::data
