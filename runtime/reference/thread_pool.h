// A small persistent thread pool for the CPU reference: one blocking
// ParallelFor at a time, contiguous static chunks (so which worker computes
// which rows is a pure function of n and the pool size, never of timing).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dpl::reference {

class ThreadPool {
 public:
  // `n_threads` workers in total, the calling thread included (>= 1).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(worker, begin, end) on disjoint contiguous ranges covering
  // [0, n): worker w (0..size()-1) gets [n*w/size, n*(w+1)/size); empty
  // ranges are skipped. Returns when every call has returned. Not reentrant.
  using RangeFn = std::function<void(int worker, uint64_t begin, uint64_t end)>;
  void ParallelFor(uint64_t n, const RangeFn& fn);

 private:
  void WorkerLoop(int worker);
  void RunChunk(int worker);

  const int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped per ParallelFor
  int pending_ = 0;          // helper threads still running this generation
  bool stop_ = false;
  const RangeFn* fn_ = nullptr;
  uint64_t n_ = 0;
};

}  // namespace dpl::reference
