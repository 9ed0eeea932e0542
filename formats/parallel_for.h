// Runs fn(i) for i in [0, n) on up to `threads` workers (the caller's thread
// is one of them); items are handed out one at a time, so uneven items
// balance. The first error stops the hand-out and is returned.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace dpl::formats {

inline absl::Status ParallelFor(int threads, size_t n,
                                const std::function<absl::Status(size_t)>& fn) {
  threads = std::max(1, std::min<int>(threads, static_cast<int>(std::min<size_t>(n, 1 << 20))));
  std::atomic<size_t> next{0};
  std::vector<absl::Status> errors(threads);
  auto work = [&](int w) {
    for (size_t i = next++; i < n; i = next++) {
      absl::Status s = fn(i);
      if (!s.ok()) {
        errors[w] = std::move(s);
        next = n;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& t : pool) t.join();
  for (const absl::Status& s : errors) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dpl::formats
