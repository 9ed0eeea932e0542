// Probe for issue 33 (not part of the build): how fast can a file's bytes go
// from the page cache to the GPU? Each trial maps the file afresh (a new
// process's mapping has no page-table entries yet), moves its whole length
// into one device buffer and reports GB/s:
//   staged T:       today's DeviceWeights path: two 64 MiB pinned buffers, T
//                   threads memcpy from the mapping into one while the other
//                   is copied to the device;
//   pread T:        the same buffers filled by pread(2) (no page faults);
//   register C K:   the mapping itself registered for DMA
//                   (cudaHostRegister ReadOnly) in C MiB chunks by K threads,
//                   each chunk copied as soon as it is registered;
//                   unregistration timed apart (it can run after start-up);
//   regone C:       one C MiB chunk registered, copied, unregistered (each timed);
//   regshared C:    one C MiB registration of a MAP_SHARED mapping instead;
//   reganon C:      one C MiB registration of anonymous memory (a copy);
//   pageable C:     cudaMemcpyAsync straight from the mapping, C MiB a call;
//   popstaged T:    populate T, then staged T on the populated mapping;
//   populate K:     madvise(MADV_POPULATE_READ) of the mapping alone, K
//                   threads (what prefaulting during context creation buys).
// `cold` before a trial drops the file from the page cache
// (posix_fadvise DONTNEED) so the disk is read.
//
// Build: nvcc -O2 -std=c++17 -o load_probe tools/perf/load_probe.cu -lpthread
// Run:   ./load_probe FILE "staged 16" "register 256 4" "populate 8" "cold register 256 4" ...
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "probe_util.cuh"  // CK

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif


namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

template <class F>
void Parallel(int threads, size_t n, F fn) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& t : pool) t.join();
}

// "shared" as the first trial: every later mapping is MAP_SHARED (the only
// kind whose pages cudaHostRegister pinned on the H100 box; a MAP_PRIVATE
// file mapping's registration did not return).
bool g_shared = false;

struct File {
  int fd = -1;
  uint64_t size = 0;
  const uint8_t* map = nullptr;
};

File Open(const char* path) {
  File f;
  f.fd = ::open(path, O_RDONLY);
  if (f.fd < 0) {
    std::perror(path);
    std::exit(1);
  }
  struct stat st;
  ::fstat(f.fd, &st);
  f.size = static_cast<uint64_t>(st.st_size);
  return f;
}

void Map(File& f) {
  void* p = ::mmap(nullptr, f.size, PROT_READ, g_shared ? MAP_SHARED : MAP_PRIVATE, f.fd, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  f.map = static_cast<const uint8_t*>(p);
}
void Unmap(File& f) {
  ::munmap(const_cast<uint8_t*>(f.map), f.size);
  f.map = nullptr;
}

constexpr uint64_t kStaging = 64ull << 20;

// Two pinned buffers alternating; fill(dst, at, n) fills one.
template <class Fill>
double Staged(const File& f, uint8_t* dev, int threads, Fill fill) {
  static uint8_t* staging[2] = {nullptr, nullptr};
  static cudaEvent_t done[2];
  static cudaStream_t s;
  if (staging[0] == nullptr) {
    for (int b = 0; b < 2; ++b) {
      CK(cudaHostAlloc(&staging[b], kStaging, cudaHostAllocDefault));
      CK(cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming));
    }
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  const auto t0 = Clock::now();
  int b = 0;
  for (uint64_t at = 0; at < f.size; at += kStaging, b ^= 1) {
    const uint64_t n = std::min(kStaging, f.size - at);
    CK(cudaEventSynchronize(done[b]));
    constexpr uint64_t kSlice = 4ull << 20;
    uint8_t* dst = staging[b];
    Parallel(threads, (n + kSlice - 1) / kSlice, [&](size_t i) {
      const uint64_t off = i * kSlice;
      fill(dst + off, at + off, std::min(kSlice, n - off));
    });
    CK(cudaMemcpyAsync(dev + at, dst, n, cudaMemcpyHostToDevice, s));
    CK(cudaEventRecord(done[b], s));
  }
  CK(cudaStreamSynchronize(s));
  return Since(t0);
}

// Chunks registered by K threads in order of need; the main thread copies
// chunk i as soon as it is registered.
void Register(const File& f, uint8_t* dev, uint64_t chunk, int threads, double* load_s,
              double* reg_s, double* unreg_s) {
  const size_t n = (f.size + chunk - 1) / chunk;
  std::vector<int> state(n, 0);  // 0 pending, 1 registered, -1 failed
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  std::atomic<int64_t> reg_ns{0};
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) {
        const uint64_t at = i * chunk, len = std::min(chunk, f.size - at);
        const auto t = Clock::now();
        const cudaError_t e = cudaHostRegister(const_cast<uint8_t*>(f.map + at), len,
                                               cudaHostRegisterReadOnly);
        reg_ns += static_cast<int64_t>(Since(t) * 1e9);
        if (e != cudaSuccess) std::fprintf(stderr, "register chunk %zu: %s\n", i, cudaGetErrorString(e));
        std::lock_guard<std::mutex> l(mu);
        state[i] = e == cudaSuccess ? 1 : -1;
        cv.notify_all();
      }
    });
  }
  for (size_t i = 0; i < n; ++i) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return state[i] != 0; });
    if (state[i] < 0) std::exit(1);
    l.unlock();
    const uint64_t at = i * chunk, len = std::min(chunk, f.size - at);
    CK(cudaMemcpyAsync(dev + at, f.map + at, len, cudaMemcpyHostToDevice, s));
  }
  CK(cudaStreamSynchronize(s));
  *load_s = Since(t0);
  for (auto& t : pool) t.join();
  *reg_s = reg_ns.load() / 1e9;
  const auto t1 = Clock::now();
  next = 0;
  pool.clear();
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) {
        CK(cudaHostUnregister(const_cast<uint8_t*>(f.map + i * chunk)));
      }
    });
  }
  for (auto& t : pool) t.join();
  *unreg_s = Since(t1);
  CK(cudaStreamDestroy(s));
}

// MADV_POPULATE_READ of the whole mapping, 64 MiB slices over `threads`; seconds.
double Populate(const File& f, int threads) {
  constexpr uint64_t kSlice = 64ull << 20;
  const auto t0 = Clock::now();
  Parallel(threads, (f.size + kSlice - 1) / kSlice, [&](size_t i) {
    const uint64_t at = i * kSlice;
    ::madvise(const_cast<uint8_t*>(f.map + at), std::min(kSlice, f.size - at), MADV_POPULATE_READ);
  });
  return Since(t0);
}

void DropCache(File& f) {
  ::fdatasync(f.fd);
  ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
}

// Reads every page once so that the next trial starts warm.
void Warm(File& f) {
  Map(f);
  ::madvise(const_cast<uint8_t*>(f.map), f.size, MADV_POPULATE_READ);
  Unmap(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: load_probe FILE TRIAL...\n");
    return 1;
  }
  auto t = Clock::now();
  CK(cudaFree(nullptr));
  std::printf("context: %.0f ms\n", Since(t) * 1e3);
  int ro = 0;
  CK(cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0));
  int pma = 0, pmt = 0;
  CK(cudaDeviceGetAttribute(&pma, cudaDevAttrPageableMemoryAccess, 0));
  CK(cudaDeviceGetAttribute(&pmt, cudaDevAttrPageableMemoryAccessUsesHostPageTables, 0));
  std::printf("host register read-only supported: %d, pageable memory access %d (host page tables %d)\n",
              ro, pma, pmt);
  File f = Open(argv[1]);
  uint8_t* dev = nullptr;
  t = Clock::now();
  CK(cudaMalloc(&dev, f.size));
  std::printf("cudaMalloc %.2f GB: %.0f ms\n", f.size / 1e9, Since(t) * 1e3);
  Warm(f);
  for (int a = 2; a < argc; ++a) {
    std::istringstream in(argv[a]);
    std::string op;
    in >> op;
    bool cold = false;
    if (op == "shared") {
      g_shared = true;
      continue;
    }
    if (op == "cold") {
      cold = true;
      in >> op;
    }
    if (cold) DropCache(f);
    Map(f);
    double sec = 0;
    std::string extra;
    if (op == "staged" || op == "pread") {
      int threads = 16;
      in >> threads;
      if (op == "staged") {
        sec = Staged(f, dev, threads, [&](uint8_t* d, uint64_t at, uint64_t n) {
          std::memcpy(d, f.map + at, n);
        });
      } else {
        sec = Staged(f, dev, threads, [&](uint8_t* d, uint64_t at, uint64_t n) {
          for (uint64_t done = 0; done < n;) {
            const ssize_t r = ::pread(f.fd, d + done, n - done, static_cast<off_t>(at + done));
            if (r <= 0) std::exit(1);
            done += static_cast<uint64_t>(r);
          }
        });
      }
    } else if (op == "register") {
      int mib = 256, threads = 4;
      in >> mib >> threads;
      double reg = 0, unreg = 0;
      Register(f, dev, static_cast<uint64_t>(mib) << 20, threads, &sec, &reg, &unreg);
      char b[160];
      std::snprintf(b, sizeof b, " (register %.0f ms of thread time, unregister %.0f ms after)",
                    reg * 1e3, unreg * 1e3);
      extra = b;
    } else if (op == "regone") {
      int mib = 256;
      in >> mib;
      const uint64_t len = std::min<uint64_t>(static_cast<uint64_t>(mib) << 20, f.size);
      const auto t0 = Clock::now();
      CK(cudaHostRegister(const_cast<uint8_t*>(f.map), len, cudaHostRegisterReadOnly));
      const double reg = Since(t0);
      const auto t1 = Clock::now();
      CK(cudaMemcpy(dev, f.map, len, cudaMemcpyHostToDevice));
      const double copy = Since(t1);
      const auto t2 = Clock::now();
      CK(cudaHostUnregister(const_cast<uint8_t*>(f.map)));
      char b[200];
      std::snprintf(b, sizeof b, " of %d MiB: register %.1f ms (%.1f GB/s), copy %.1f ms (%.1f GB/s), unregister %.1f ms",
                    mib, reg * 1e3, len / reg / 1e9, copy * 1e3, len / copy / 1e9, Since(t2) * 1e3);
      extra = b;
      sec = reg + copy;
    } else if (op == "regshared" || op == "reganon") {
      // One C MiB registration of a MAP_SHARED mapping of the file, or of
      // anonymous memory filled from it (is it the file mapping that cannot
      // be pinned, or pinning at all?).
      int mib = 64;
      in >> mib;
      const uint64_t len = std::min<uint64_t>(static_cast<uint64_t>(mib) << 20, f.size);
      void* p = op == "regshared" ? ::mmap(nullptr, len, PROT_READ, MAP_SHARED, f.fd, 0)
                                  : ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) std::exit(1);
      if (op == "reganon") std::memcpy(p, f.map, len);
      const unsigned flags = op == "regshared" ? cudaHostRegisterReadOnly : cudaHostRegisterDefault;
      const auto t0 = Clock::now();
      CK(cudaHostRegister(p, len, flags));
      const double reg = Since(t0);
      const auto t1 = Clock::now();
      CK(cudaMemcpy(dev, p, len, cudaMemcpyHostToDevice));
      const double copy = Since(t1);
      CK(cudaHostUnregister(p));
      ::munmap(p, len);
      char b[200];
      std::snprintf(b, sizeof b, " of %d MiB: register %.1f ms (%.1f GB/s), copy %.1f ms (%.1f GB/s)",
                    mib, reg * 1e3, len / reg / 1e9, copy * 1e3, len / copy / 1e9);
      extra = b;
      sec = reg + copy;
    } else if (op == "pageable") {
      // cudaMemcpyAsync straight from the mapping: the driver stages it.
      int mib = 64;
      in >> mib;
      const uint64_t c = static_cast<uint64_t>(mib) << 20;
      cudaStream_t st;
      CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      const auto t0 = Clock::now();
      for (uint64_t at = 0; at < f.size; at += c) {
        CK(cudaMemcpyAsync(dev + at, f.map + at, std::min(c, f.size - at), cudaMemcpyHostToDevice, st));
      }
      CK(cudaStreamSynchronize(st));
      sec = Since(t0);
      CK(cudaStreamDestroy(st));
    } else if (op == "popstaged") {
      int threads = 16;
      in >> threads;
      const double pop = Populate(f, threads);
      const double st = Staged(f, dev, threads, [&](uint8_t* d, uint64_t at, uint64_t n) {
        std::memcpy(d, f.map + at, n);
      });
      char b[120];
      std::snprintf(b, sizeof b, " (populate %.0f ms, then staged %.0f ms: %.1f GB/s)", pop * 1e3,
                    st * 1e3, f.size / st / 1e9);
      extra = b;
      sec = pop + st;
    } else if (op == "populate") {
      int threads = 8;
      in >> threads;
      sec = Populate(f, threads);
    } else {
      std::fprintf(stderr, "unknown trial '%s'\n", argv[a]);
      return 1;
    }
    Unmap(f);
    std::printf("%-28s %7.0f ms %6.1f GB/s%s\n", argv[a], sec * 1e3, f.size / sec / 1e9,
                extra.c_str());
    std::fflush(stdout);
    if (cold) Warm(f);
  }
  return 0;
}
