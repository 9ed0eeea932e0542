#include "runtime/cuda/device_weights.h"

#include <cuda_runtime.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "formats/parallel_for.h"
#include "base/status_macros.h"
#include "formats/model_file.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_handles.h"

namespace dpl::runtime {

absl::StatusOr<std::pair<uint64_t, uint64_t>> DeviceMemoryInfo() {
  size_t free_bytes = 0, total_bytes = 0;
  DPL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return std::pair<uint64_t, uint64_t>(free_bytes, total_bytes);
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Load(const std::string& path,
                                                                   const LoadOptions& options) {
  DPL_ASSIGN_OR_RETURN(const formats::Container container, formats::DetectContainer(path));
  if (container != formats::Container::kDpl) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the CUDA runtime loads .dpl files only; convert a GGUF first with "
              "`dpl-convert MODEL.gguf MODEL.dpl`"));
  }
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<formats::ModelFile> index,
                       formats::ModelFile::OpenIndex(path));
  return Load(*index, options);
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Load(const formats::ModelFile& index,
                                                                   const LoadOptions& options) {
  const std::string& path = index.path();
  if (index.dpl_file() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the CUDA runtime loads .dpl files only; convert a GGUF first with "
              "`dpl-convert MODEL.gguf MODEL.dpl`"));
  }
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->file_ = index.dpl_file();
  const uint64_t need = w->file_->header().data_bytes;
  DPL_ASSIGN_OR_RETURN(const auto mem, DeviceMemoryInfo());
  if (need > mem.first) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "not enough device memory for the weights: %.2f GiB needed, %.2f GiB free of %.2f GiB",
        need / 1073741824.0, mem.first / 1073741824.0, mem.second / 1073741824.0));
  }
  DPL_ASSIGN_OR_RETURN(w->base_, kernels::DeviceBuffer<uint8_t>::Allocate(std::max<uint64_t>(need, 1)));
  // A file truncated while it is copied becomes an error naming it, not SIGBUS.
  DPL_RETURN_IF_ERROR(Annotate(w->file_->SafeRead([&] { return w->Upload(options); }), path));
  return w;
}

absl::StatusOr<UploadMethod> ParseUploadMethod(absl::string_view name) {
  if (name == "auto") return UploadMethod::kAuto;
  if (name == "pin") return UploadMethod::kPinnedFile;
  if (name == "staged") return UploadMethod::kStaged;
  return absl::InvalidArgumentError(
      absl::StrCat("--weights-upload '", name, "': expected auto, pin or staged"));
}

absl::StatusOr<const uint8_t*> DeviceWeights::TensorPtr(absl::string_view name) const {
  const formats::DplTensorEntry* t = file_->FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
  return base_.get() + t->offset;
}

namespace {

// How long the load waits for a pinning worker that has stopped making
// progress before it copies that worker's chunk through staging itself: a
// 64 MiB chunk pins in 2.4-8 ms where pinning works (H100 boxes).
constexpr auto kPinWatchdog = std::chrono::seconds(2);

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The staging's memcpy / zstd workers: host_threads, or the cores (at most
// 16) the pinning workers leave.
int StagingThreads(const LoadOptions& opt, int pin_threads) {
  if (opt.host_threads > 0) return opt.host_threads;
  const int cores = static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  return std::max(1, cores - pin_threads);
}

}  // namespace

// What the chunks' producers share: the claim counter, and each chunk's
// state. Shared with the pinning workers by shared_ptr, since a worker stuck
// in cudaHostRegister past the watchdog is detached and may outlive the load.
struct DeviceWeights::Chunks {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> state;  // chunk i: 0 unclaimed or pinning, 1 copied from its pinned pages,
                           // 2 staged (or to be), -1 pinning failed
  std::string error;       // the first pinning failure
  bool abandoned = false;  // the load stopped waiting: a worker unpins what it pins after
  int live = 0;            // workers still running
  std::atomic<size_t> next{0};
  std::atomic<int64_t> pin_ns{0};
};

// A pinning worker: claims chunk i, pins its pages (cudaHostRegister,
// read-only), enqueues its copy on the worker's own stream and records an
// event; chunks whose copies are done are unpinned before the next claim,
// and the rest before the worker returns, so the load ends with nothing
// pinned. Why not unpin after the load, on a thread (H100 box): unpinning
// beside the decoder's setup held the driver and took setup from ~7 to
// 37-72 ms. A worker stops at its first failure (the load stages that chunk).
void DeviceWeights::PinWorker(std::shared_ptr<Chunks> c, std::shared_ptr<const formats::DplFile> file,
                              uint8_t* dst, uint64_t chunk, int device, cudaStream_t stream) {
  struct Copying {
    uint8_t* p;
    cudaEvent_t done;
  };
  std::deque<Copying> copying;
  // Unpins the chunks whose copies are done (all of them, waiting, at the end).
  auto retire = [&](bool wait) {
    while (!copying.empty()) {
      const Copying& f = copying.front();
      if (!wait && cudaEventQuery(f.done) == cudaErrorNotReady) break;
      if (cudaEventSynchronize(f.done) != cudaSuccess || cudaHostUnregister(f.p) != cudaSuccess ||
          cudaEventDestroy(f.done) != cudaSuccess) {
        cudaGetLastError();  // consumed: a copy that failed shows in the stream's sync
      }
      copying.pop_front();
    }
  };
  struct Leave {
    Chunks& c;
    std::function<void(bool)> retire;
    ~Leave() {
      retire(true);
      std::lock_guard<std::mutex> l(c.mu);
      --c.live;
      c.cv.notify_all();
    }
  } leave{*c, retire};
  if (cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
  const uint64_t total = file->header().data_bytes;
  uint8_t* region = const_cast<uint8_t*>(file->data_region());
  const size_t n = c->state.size();
  for (size_t i = c->next++; i < n; i = c->next++) {
    retire(false);
    const uint64_t len = std::min(chunk, total - i * chunk);
    uint8_t* p = region + i * chunk;
    const auto t = std::chrono::steady_clock::now();
    cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterReadOnly);
    c->pin_ns += static_cast<int64_t>(Since(t) * 1e9);
    cudaEvent_t done = nullptr;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    std::lock_guard<std::mutex> l(c->mu);
    if (c->abandoned) {  // the load went on without this worker
      if (e == cudaSuccess && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
      if (done != nullptr) cudaEventDestroy(done);
      return;
    }
    // Enqueued under the lock: once the load is abandoned no copy is added.
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst + i * chunk, p, len, cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) e = cudaEventRecord(done, stream);
    if (e != cudaSuccess) {
      cudaGetLastError();  // consumed, as DPL_CUDA_CHECK does
      if (c->error.empty()) {
        c->error = absl::StrCat("pinning the file's pages for the copy engine failed (",
                                cudaGetErrorString(e), ")");
      }
      c->state[i] = -1;  // staged by the load instead
      // A copy enqueued before a failed record still reads p: wait for it.
      if (cudaStreamSynchronize(stream) != cudaSuccess) cudaGetLastError();
      if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();  // if it pinned
      if (done != nullptr) cudaEventDestroy(done);
      c->cv.notify_all();
      return;
    }
    c->state[i] = 1;
    copying.push_back({p, done});
    c->cv.notify_all();
  }
}

// The data region in chunks of staging_bytes, in file order, by one of two
// producers: pin_threads workers that pin the file mapping's own pages and
// let the copy engine read them (no host memcpy; PinWorker), or this thread
// filling two pinned staging buffers in turn with host_threads memcpy (or
// zstd) workers; chunks a worker could not pin, or left unfinished for
// kPinWatchdog, are staged after. Which one (H100 boxes, 7B and 14B,
// docs/PERF.md "Start-up"): pinning moved 19-29 GB/s on every box tried
// (41-49 where the chunks stayed pinned to the end of the load) whatever
// the box's memcpy, staging 14-42 GB/s from box to box (10.4 on the loaded
// H200 box of issue 33): kAuto stages where the host copies fast
// (kStageFromGbPerS) and pins where it does not.
absl::Status DeviceWeights::Upload(const LoadOptions& opt) {
  const formats::DplFile& f = *file_;
  const uint64_t total = f.header().data_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  const uint8_t* region = f.data_region();  // nullptr when compressed
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // Chunks: whole frames for a compressed file, whole pages otherwise.
  uint64_t chunk = std::max(page, opt.staging_bytes / page * page);
  if (f.compressed()) {
    const uint64_t fr = f.header().frame_raw_bytes;
    chunk = std::max(fr, opt.staging_bytes / fr * fr);
  }
  int device = 0;
  DPL_CUDA_CHECK(cudaGetDevice(&device));
  int pin_threads = 0;
  if (opt.method != UploadMethod::kStaged) {
    int read_only = 0;
    DPL_CUDA_CHECK(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device));
    std::string why;
    if (region == nullptr) {
      why = "a compressed file is inflated, not pinned";
    } else if (opt.method == UploadMethod::kAuto && opt.host_copy_gb_per_s >= kStageFromGbPerS) {
      why = absl::StrFormat("the host copies at %.0f GB/s", opt.host_copy_gb_per_s);
    } else if (!read_only) {
      why = "this GPU cannot pin read-only host memory";
    } else if (reinterpret_cast<uintptr_t>(region) % page != 0) {
      why = "the data region does not start on a page";
    }
    if (!why.empty() && opt.method == UploadMethod::kPinnedFile) return absl::UnavailableError(why);
    stats_.fallback = why;
    if (why.empty()) pin_threads = std::max(1, opt.pin_threads);
  }
  const size_t n = total == 0 ? 0 : (total + chunk - 1) / chunk;
  auto c = std::make_shared<Chunks>();
  c->state.assign(n, 0);
  // The workers' streams outlive every copy they enqueue: synchronized below
  // before they are destroyed, and an abandoned worker enqueues nothing.
  std::vector<kernels::Stream> pin_streams;
  std::vector<std::thread> workers;
  // Whatever happens below: no copy may read a chunk once it is unpinned or
  // its staging buffer freed, and no worker is left waiting to be joined.
  struct Finish {
    std::shared_ptr<Chunks> c;
    std::vector<std::thread>& workers;
    ~Finish() {
      {
        std::lock_guard<std::mutex> l(c->mu);
        c->abandoned = true;
        c->next = c->state.size();
      }
      for (std::thread& w : workers) {
        if (w.joinable()) w.detach();  // only a worker stuck in the driver is left
      }
    }
  } finish{c, workers};
  for (int w = 0; w < std::min<int>(pin_threads, static_cast<int>(n)); ++w) {
    DPL_ASSIGN_OR_RETURN(kernels::Stream s, kernels::CreateStream());
    {
      std::lock_guard<std::mutex> l(c->mu);
      ++c->live;
    }
    workers.emplace_back(PinWorker, c, file_, base_.get(), chunk, device, s.get());
    pin_streams.push_back(std::move(s));
  }

  // The staged producer, on this thread: every chunk when nothing pins, and
  // the chunks the workers could not pin.
  DPL_ASSIGN_OR_RETURN(const kernels::Stream stream, kernels::CreateStream());
  kernels::PinnedBuffer<uint8_t> staging[2];
  kernels::Event done[2];
  struct Drain {
    cudaStream_t s;
    ~Drain() { cudaStreamSynchronize(s); }
  } drain{stream.get()};
  const int threads = StagingThreads(opt, pin_threads);
  int b = 0;
  auto stage = [&](size_t i) -> absl::Status {
    if (staging[0].get() == nullptr) {
      const auto t = std::chrono::steady_clock::now();
      for (int k = 0; k < 2; ++k) {
        DPL_ASSIGN_OR_RETURN(staging[k], kernels::PinnedBuffer<uint8_t>::Allocate(chunk));
        DPL_ASSIGN_OR_RETURN(done[k], kernels::CreateEvent());
      }
      stats_.staging_seconds += Since(t);
    }
    const uint64_t at = i * chunk, len = std::min(chunk, total - at);
    auto t = std::chrono::steady_clock::now();
    DPL_CUDA_CHECK(cudaEventSynchronize(done[b].get()));  // this buffer's previous copy drained
    stats_.wait_seconds += Since(t);
    t = std::chrono::steady_clock::now();
    uint8_t* dst = staging[b].get();
    if (region != nullptr) {
      constexpr uint64_t kSlice = 4ull << 20;
      DPL_RETURN_IF_ERROR(formats::ParallelFor(threads, (len + kSlice - 1) / kSlice, [&](size_t s) {
        const uint64_t off = s * kSlice;
        std::memcpy(dst + off, region + at + off, std::min(kSlice, len - off));
        return absl::OkStatus();
      }));
    } else {
      const uint64_t fr = f.header().frame_raw_bytes;
      DPL_RETURN_IF_ERROR(formats::ParallelFor(threads, (len + fr - 1) / fr, [&](size_t k) {
        return f.DecompressFrame(at / fr + k, dst + k * fr);
      }));
    }
    stats_.fill_seconds += Since(t);
    DPL_CUDA_CHECK(cudaMemcpyAsync(base_.get() + at, dst, len, cudaMemcpyHostToDevice, stream.get()));
    DPL_CUDA_CHECK(cudaEventRecord(done[b].get(), stream.get()));
    b ^= 1;
    ++stats_.staged_chunks;
    return absl::OkStatus();
  };
  // Staging beside the pinning workers lost on every box it was tried on
  // (both claiming one counter: 23-35 GB/s in all, against 27-29 and 41-49
  // for the pinning alone): it stages alone or after them.
  if (pin_threads == 0) {
    for (size_t i = c->next++; i < n; i = c->next++) {
      {
        std::lock_guard<std::mutex> l(c->mu);
        c->state[i] = 2;
      }
      DPL_RETURN_IF_ERROR(stage(i));
    }
  }
  // The workers' chunks: wait while they make progress; a chunk whose
  // pinning failed, or that no worker finished within kPinWatchdog of the
  // last progress, is staged here instead.
  std::vector<size_t> redo;
  bool stuck = false;
  {
    std::unique_lock<std::mutex> l(c->mu);
    // In flight: claimed by a worker, not yet pinned and copied (or failed).
    auto in_flight = [&] {
      size_t k = 0;
      for (size_t i = 0; i < std::min(n, c->next.load()); ++i) k += c->state[i] == 0;
      return k;
    };
    while (c->live > 0 && (in_flight() > 0 || c->next.load() < n)) {
      const size_t before = in_flight();
      const size_t claimed = c->next.load();
      if (!c->cv.wait_for(l, kPinWatchdog, [&] {
            return c->live == 0 || in_flight() < before || c->next.load() > claimed;
          })) {
        stuck = true;  // no progress for kPinWatchdog: a worker is stuck in the driver
        break;
      }
    }
    c->abandoned = true;
    c->next = n;
    for (size_t i = 0; i < n; ++i) {
      if (c->state[i] == 0 || c->state[i] == -1) {
        if (stats_.fallback.empty()) {
          stats_.fallback = !c->error.empty() ? c->error
                                              : absl::StrCat("pinning a chunk took over ",
                                                             std::chrono::seconds(kPinWatchdog).count(), " s");
        }
        c->state[i] = 2;
        redo.push_back(i);
      }
    }
  }
  if (!redo.empty() && opt.method == UploadMethod::kPinnedFile) {
    return absl::UnavailableError(stats_.fallback);
  }
  for (size_t i : redo) DPL_RETURN_IF_ERROR(stage(i));
  if (!stuck) {  // every worker has returned or is returning; a stuck one is left to Finish
    for (std::thread& w : workers) w.join();
  }
  for (const kernels::Stream& s : pin_streams) DPL_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  const auto t = std::chrono::steady_clock::now();
  DPL_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  stats_.wait_seconds += Since(t);
  stats_.bytes = total;
  stats_.pinned_chunks = static_cast<int>(std::count(c->state.begin(), c->state.end(), 1));
  stats_.pin_seconds = c->pin_ns.load() / 1e9;
  stats_.seconds = Since(t0);
  return absl::OkStatus();
}

double MeasureHostCopy(const formats::MappedFile& m, uint64_t bytes, int threads,
                       const LoadOptions& options) {
  constexpr uint64_t kSlice = 4ull << 20, kScratch = 64ull << 20;
  bytes = std::min(bytes, m.size());
  if (bytes == 0) return 0;
  if (threads <= 0) threads = StagingThreads(options, 0);  // as the staging that auto would choose
  m.Populate(0, bytes);
  void* scratch = ::mmap(nullptr, kScratch, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (scratch == MAP_FAILED) return 0;
  uint8_t* dst = static_cast<uint8_t*>(scratch);
  const auto t = std::chrono::steady_clock::now();
  // Reads of a truncated file past its end see zeros (MappedFile's guard);
  // the load that follows reports it.
  formats::ParallelFor(threads, (bytes + kSlice - 1) / kSlice, [&](size_t i) {
    const uint64_t at = i * kSlice;
    std::memcpy(dst + at % kScratch, m.data() + at, std::min(kSlice, bytes - at));
    return absl::OkStatus();
  }).IgnoreError();
  const double sec = Since(t);
  ::munmap(scratch, kScratch);
  return sec > 0 ? bytes / sec / 1e9 : 0;
}

}  // namespace dpl::runtime
