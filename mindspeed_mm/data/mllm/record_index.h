// A data file's records by byte offset, so a training set of millions of records opens in a
// second and stays out of memory. The first open scans the file once (every record is parsed, to
// find the malformed ones and to hash the good ones' content for the train/val split) and caches
// the result beside it as FILE.mmidx; later opens read that cache while the file's size and
// modification time and the reading settings (field names, media root) are unchanged. The file
// itself is memory-mapped and a record is parsed only when it is asked for, on the loader's
// threads.
//
// Resident per good record: its byte offset (8 bytes; JSON-array files also a 4-byte length).
// Line numbers for the sources ("train.jsonl:12") come from a sparse table of the positions where
// blank or bad lines were skipped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mindspeed_mm/data/mllm/mllm_dataset.h"

namespace mm::data {

class MllmRecordIndex {
 public:
  // mm::Error naming the path when it cannot be read (or a '[' file is not a JSON array).
  // A cache that cannot be written (a read-only folder) only costs the next open a rescan.
  MllmRecordIndex(const std::string& path, const MllmAttr& attr = {}, const std::string& media_root = "");
  ~MllmRecordIndex();
  MllmRecordIndex(const MllmRecordIndex&) = delete;
  MllmRecordIndex& operator=(const MllmRecordIndex&) = delete;

  // Good records, in file order.
  int64_t size() const { return static_cast<int64_t>(offsets_.size()); }
  // Good record i, parsed now. Thread-safe.
  MllmRecord record(int64_t i) const;
  // The records that cannot be samples, named by file and line.
  const std::vector<BadRecord>& bad() const { return bad_; }
  const std::string& media_root() const { return media_root_; }
  // Whether record i is in the validation split of val_fraction (is_validation_hash of its
  // record_key); read from the cache file, one pass, nothing kept.
  std::vector<bool> validation_split(double val_fraction, uint64_t seed) const;
  // Whether this open reused the cache; bytes held for the records (offsets, lengths, skips).
  bool from_cache() const { return from_cache_; }
  int64_t resident_bytes() const;

 private:
  struct Mapping;
  void scan();  // builds offsets_, lengths_, skips_, bad_ and hashes_
  bool load_cache(uint64_t settings_hash);
  void write_cache(uint64_t settings_hash);  // and drops hashes_ once they are in the file
  // 0-based line (JSONL) or element index (JSON array) of good record i.
  int64_t position(int64_t i) const;

  std::string path_, name_, media_root_;
  MllmAttr attr_;
  std::unique_ptr<Mapping> map_;
  bool array_ = false, from_cache_ = false;
  std::vector<uint64_t> offsets_;
  std::vector<uint32_t> lengths_;                          // JSON arrays only
  std::vector<std::pair<int64_t, int64_t>> skips_;         // (first good record, positions skipped before it)
  std::vector<BadRecord> bad_;
  std::vector<uint64_t> hashes_;                           // only between a scan and its cache write
  uint64_t file_size_ = 0;
  int64_t mtime_ns_ = 0;
};

}  // namespace mm::data
