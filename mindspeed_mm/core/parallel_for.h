// parallel_for: runs body(i) for i in [0, n) on up to num_threads threads (0: one per
// hardware thread), handing out indices in small chunks so uneven items balance. The first
// exception thrown by any body is rethrown on the caller's thread after all threads stop.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mm {

template <class Body>
void parallel_for(size_t n, int num_threads, Body body) {
  size_t threads = num_threads > 0 ? static_cast<size_t>(num_threads) : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, n);
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  const size_t chunk = std::max<size_t>(1, n / (threads * 16));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      size_t begin = next.fetch_add(chunk);
      if (begin >= n) return;
      size_t end = std::min(n, begin + chunk);
      try {
        for (size_t i = begin; i < end; ++i) body(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace mm
