// DataLoader: in-order delivery from a worker pool, deterministic bad-sample replacement.
#include "mindspeed_mm/data/loader.h"

#include <c10/util/Exception.h>

#include "mindspeed_mm/core/errors.h"
#include "mindspeed_mm/core/logging.h"

namespace mm::data {

DataLoader::DataLoader(int64_t dataset_size, EncodeFn encode, CollateFn collate, ResumableSampler sampler,
                       LoaderOptions options)
    : n_(dataset_size),
      encode_(std::move(encode)),
      collate_(std::move(collate)),
      sampler_(std::move(sampler)),
      options_(options) {
  MM_CHECK(n_ > 0, "data loader: the dataset is empty");
  MM_CHECK(options_.batch_size >= 1, "data loader: batch size must be >= 1 (got ", options_.batch_size, ")");
  MM_CHECK(options_.num_workers >= 0, "data loader: num_workers must be >= 0 (got ", options_.num_workers, ")");
  MM_CHECK(options_.max_replacements >= 0, "data loader: max_replacements must be >= 0");
  if (!options_.sample_key) options_.sample_key = [](int64_t i) { return i; };
  options_.prefetch = std::max<int64_t>(options_.prefetch, 0);
  delivered_sampler_ = sampler_.state();
  start_workers();
}

DataLoader::~DataLoader() { stop_workers(); }

void DataLoader::start_workers() {
  stopping_ = false;
  try {
    for (int i = 0; i < options_.num_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::system_error& e) {
    stop_workers();
    throw Error(cat("data loader: cannot start ", options_.num_workers, " worker threads (", e.what(), ")"));
  }
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void DataLoader::dispatch_locked() {
  // Keep the batch being waited for plus `prefetch` more in flight.
  while (dispatched_ < next_seq_ + 1 + options_.prefetch) {
    Task t;
    t.seq = dispatched_++;
    t.indices = sampler_.next_n(options_.batch_size);
    t.sampler_after = sampler_.state();
    queue_.push_back(std::move(t));
    work_cv_.notify_one();
  }
}

void DataLoader::worker_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      task = std::move(queue_.front());
      queue_.erase(queue_.begin());
    }
    Result r = run(task);
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.emplace(task.seq, std::move(r));
    }
    done_cv_.notify_all();
  }
}

EncodedSample DataLoader::encode_slot(int64_t index, Result& r) {
  for (int64_t k = 0; k <= options_.max_replacements; ++k) {
    const int64_t i = (index + k) % n_;
    const int64_t key = options_.sample_key(i);
    ++r.attempts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = known_bad_.find(key);
      if (it != known_bad_.end()) {
        r.bad.emplace_back(key, it->second);
        continue;
      }
    }
    std::string why;
    try {
      return encode_(i);
    } catch (const Error& e) {
      why = e.what();
    } catch (const c10::Error& e) {
      why = e.what_without_backtrace();
      why = why.substr(0, why.find('\n'));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      known_bad_.emplace(key, why);
    }
    r.bad.emplace_back(key, why);
  }
  throw Error(cat("data: ", options_.max_replacements + 1, " consecutive bad samples from index ", index,
                  "; the last: ", r.bad.back().second));
}

DataLoader::Result DataLoader::run(const Task& task) {
  Result r;
  r.sampler_after = task.sampler_after;
  try {
    std::vector<EncodedSample> samples;
    samples.reserve(task.indices.size());
    for (int64_t i : task.indices) samples.push_back(encode_slot(i, r));
    r.batch = collate_(samples);
  } catch (...) {
    r.error = std::current_exception();
  }
  return r;
}

void DataLoader::deliver(Result& r) {
  if (r.error) std::rethrow_exception(r.error);
  LoaderStats next = stats_;
  next.batches += 1;
  next.samples += r.batch.num_samples;
  next.attempts += r.attempts;
  next.bad_attempts += static_cast<int64_t>(r.bad.size());
  std::vector<const std::string*> fresh;
  for (auto& [key, why] : r.bad) {
    if (!next.bad.emplace(key, why).second) continue;
    if (next.first_bad.empty()) next.first_bad = why;
    fresh.push_back(&why);
  }
  if (next.attempts >= options_.min_samples_for_bad_check &&
      static_cast<double>(next.bad_attempts) > options_.max_bad_fraction * static_cast<double>(next.attempts)) {
    throw Error(cat("data: ", next.bad_attempts, " of ", next.attempts, " samples were bad (",
                    100.0 * next.bad_attempts / next.attempts, "%), more than data.max_bad_fraction ",
                    options_.max_bad_fraction, "; the first: ", next.first_bad));
  }
  for (const std::string* why : fresh) log::warn("data: skipping bad sample ", *why);
  stats_ = std::move(next);
  delivered_sampler_ = r.sampler_after;
}

Batch DataLoader::next() {
  Result r;
  if (options_.num_workers == 0) {
    Task t;
    t.seq = next_seq_++;
    t.indices = sampler_.next_n(options_.batch_size);
    t.sampler_after = sampler_.state();
    r = run(t);
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    dispatch_locked();
    done_cv_.wait(lock, [&] { return done_.count(next_seq_) > 0; });
    auto it = done_.find(next_seq_);
    r = std::move(it->second);
    done_.erase(it);
    ++next_seq_;
    dispatch_locked();
  }
  deliver(r);
  return std::move(r.batch);
}

nlohmann::json DataLoader::state() const {
  nlohmann::json bad = nlohmann::json::object();
  for (auto& [i, why] : stats_.bad) bad[std::to_string(i)] = why;
  return {{"sampler", delivered_sampler_},       {"batches", stats_.batches}, {"samples", stats_.samples},
          {"attempts", stats_.attempts},         {"bad_attempts", stats_.bad_attempts},
          {"first_bad", stats_.first_bad},       {"bad", bad}};
}

void DataLoader::load_state(const nlohmann::json& s) {
  MM_CHECK(s.is_object() && s.contains("sampler"), "data loader state: no 'sampler' field in ", s.dump().substr(0, 200));
  // Everything is checked on copies first: a state that does not fit leaves this loader as it was.
  ResumableSampler sampler = sampler_;
  sampler.load_state(s.at("sampler"));
  LoaderStats stats;
  try {
    stats.batches = s.value("batches", int64_t(0));
    stats.samples = s.value("samples", int64_t(0));
    stats.attempts = s.value("attempts", int64_t(0));
    stats.bad_attempts = s.value("bad_attempts", int64_t(0));
    stats.first_bad = s.value("first_bad", std::string());
    if (s.contains("bad"))
      for (auto& [k, v] : s.at("bad").items()) stats.bad.emplace(std::stoll(k), v.get<std::string>());
  } catch (const std::exception& e) {
    throw Error(cat("data loader state: malformed field (", e.what(), ")"));
  }
  stop_workers();
  queue_.clear();
  done_.clear();
  next_seq_ = dispatched_ = 0;
  sampler_ = std::move(sampler);
  delivered_sampler_ = sampler_.state();
  known_bad_ = stats.bad;
  stats_ = std::move(stats);
  start_workers();
}

}  // namespace mm::data
