// Owning handles for CUDA resources: each frees its resource exactly once, on
// every path out of a scope (errors included). Move-only.
//
//   DPL_ASSIGN_OR_RETURN(DeviceBuffer<float> x, DeviceBuffer<float>::Allocate(n));
//   DPL_ASSIGN_OR_RETURN(Stream s, Stream::Create());
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "kernels/cuda_check.h"

namespace dpl::kernels {

namespace internal {
// Where a buffer lives: cudaMalloc'ed device memory or pinned host memory.
struct DeviceMemory {
  static cudaError_t Alloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  void operator()(void* p) const { cudaFree(p); }
};
struct PinnedMemory {
  static cudaError_t Alloc(void** p, size_t bytes) {
    return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
  }
  void operator()(void* p) const { cudaFreeHost(p); }
};
}  // namespace internal

// n values of T in the memory Mem allocates, uninitialized; freed on
// destruction.
template <typename T, class Mem>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  static absl::StatusOr<CudaBuffer> Allocate(size_t n) {
    CudaBuffer b;
    void* p = nullptr;
    if (n > 0) DPL_CUDA_CHECK(Mem::Alloc(&p, n * sizeof(T)));
    b.p_.reset(p);
    b.n_ = n;
    return b;
  }
  T* get() const { return static_cast<T*>(p_.get()); }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  std::unique_ptr<void, Mem> p_;
  size_t n_ = 0;
};

template <typename T>
using DeviceBuffer = CudaBuffer<T, internal::DeviceMemory>;  // cudaMalloc
template <typename T>
using PinnedBuffer = CudaBuffer<T, internal::PinnedMemory>;  // cudaHostAlloc (page-locked)

// A CUDA resource handle H released by Destroy(H) (cudaStreamDestroy, ...).
template <typename H, cudaError_t (*Destroy)(H)>
class CudaHandle {
 public:
  CudaHandle() = default;
  explicit CudaHandle(H h) : h_(h) {}
  CudaHandle(CudaHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  CudaHandle& operator=(CudaHandle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  ~CudaHandle() { reset(); }

  H get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }
  void reset(H h = nullptr) {
    if (h_ != nullptr) Destroy(h_);
    h_ = h;
  }

 private:
  H h_ = nullptr;
};

using Stream = CudaHandle<cudaStream_t, cudaStreamDestroy>;
using Event = CudaHandle<cudaEvent_t, cudaEventDestroy>;
using Graph = CudaHandle<cudaGraph_t, cudaGraphDestroy>;
using GraphExec = CudaHandle<cudaGraphExec_t, cudaGraphExecDestroy>;

inline absl::StatusOr<Stream> CreateStream(unsigned flags = cudaStreamNonBlocking) {
  cudaStream_t s = nullptr;
  DPL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, flags));
  return Stream(s);
}

// A stream at the device's highest priority (its blocks take SMs before
// those of default-priority streams as SMs free up).
inline absl::StatusOr<Stream> CreateHighPriorityStream(unsigned flags = cudaStreamNonBlocking) {
  int least = 0, greatest = 0;  // numerically: greatest priority is the lowest number
  DPL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  DPL_CUDA_CHECK(cudaStreamCreateWithPriority(&s, flags, greatest));
  return Stream(s);
}

inline absl::StatusOr<Event> CreateEvent(unsigned flags = cudaEventDisableTiming) {
  cudaEvent_t e = nullptr;
  DPL_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
  return Event(e);
}

// Captures what `enqueue` launches on `stream` into a graph and instantiates
// it. The capture is always ended, also when enqueue fails (its error is
// returned). Graph kernels read their changing inputs (token, position) from
// device memory, so one capture serves every replay.
inline absl::StatusOr<GraphExec> CaptureGraph(cudaStream_t stream,
                                              absl::FunctionRef<absl::Status()> enqueue) {
  DPL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = enqueue();
  cudaGraph_t raw = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &raw);
  const Graph graph(raw);
  if (!enqueued.ok()) return enqueued;
  DPL_CUDA_CHECK(ended);
  cudaGraphExec_t exec = nullptr;
  DPL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph.get(), 0));
  return GraphExec(exec);
}

}  // namespace dpl::kernels
