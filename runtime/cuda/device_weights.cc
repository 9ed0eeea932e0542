#include "runtime/cuda/device_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "formats/parallel_for.h"
#include "kernels/cuda_check.h"

namespace dpl::runtime {

absl::StatusOr<std::pair<uint64_t, uint64_t>> DeviceMemoryInfo() {
  size_t free_bytes = 0, total_bytes = 0;
  DPL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return std::pair<uint64_t, uint64_t>(free_bytes, total_bytes);
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Load(const std::string& path,
                                                                   const LoadOptions& options) {
  auto file = formats::DplFile::Open(path);
  if (!file.ok()) {
    if (absl::StrContains(file.status().message(), "not a .dpl file")) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": the CUDA runtime loads .dpl files only; convert a GGUF first with "
                "`dpl-convert MODEL.gguf MODEL.dpl`"));
    }
    return file.status();
  }
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->file_ = std::make_unique<formats::DplFile>(std::move(*file));
  const uint64_t need = w->file_->header().data_bytes;
  auto mem = DeviceMemoryInfo();
  if (!mem.ok()) return mem.status();
  if (need > mem->first) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "not enough device memory for the weights: %.2f GiB needed, %.2f GiB free of %.2f GiB",
        need / 1073741824.0, mem->first / 1073741824.0, mem->second / 1073741824.0));
  }
  DPL_CUDA_CHECK(cudaMalloc(&w->base_, std::max<uint64_t>(need, 1)));
  absl::Status s = w->Upload(options);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  return w;
}

DeviceWeights::~DeviceWeights() {
  if (base_ != nullptr) cudaFree(base_);
}

absl::StatusOr<const uint8_t*> DeviceWeights::TensorPtr(absl::string_view name) const {
  const formats::DplTensorEntry* t = file_->FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
  return base_ + t->offset;
}

// Two pinned staging buffers alternate: while the GPU copies buffer b, host
// threads fill buffer 1-b (memcpy from the mapping, or zstd frames inflated
// straight into it). An event per buffer says when its copy has finished.
absl::Status DeviceWeights::Upload(const LoadOptions& opt) {
  const formats::DplFile& f = *file_;
  const uint64_t total = f.header().data_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  const int threads = opt.host_threads > 0
                          ? opt.host_threads
                          : static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  // Compressed files: a staging buffer holds whole frames.
  uint64_t chunk = opt.staging_bytes;
  if (f.compressed()) {
    const uint64_t fr = f.header().frame_raw_bytes;
    chunk = std::max(fr, chunk / fr * fr);
  }
  cudaStream_t stream;
  DPL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint8_t* staging[2] = {nullptr, nullptr};
  cudaEvent_t done[2];
  absl::Status status;
  auto cleanup = [&] {
    cudaStreamSynchronize(stream);
    for (int b = 0; b < 2; ++b) {
      if (staging[b]) cudaFreeHost(staging[b]);
      cudaEventDestroy(done[b]);
    }
    cudaStreamDestroy(stream);
  };
  for (int b = 0; b < 2; ++b) {
    DPL_CUDA_CHECK(cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming));
    DPL_CUDA_CHECK(cudaHostAlloc(&staging[b], chunk, cudaHostAllocDefault));
  }
  const uint8_t* region = f.data_region();  // nullptr when compressed
  int b = 0;
  for (uint64_t at = 0; at < total && status.ok(); at += chunk, b ^= 1) {
    const uint64_t n = std::min(chunk, total - at);
    // Wait until this buffer's previous copy has drained.
    cudaError_t e = cudaEventSynchronize(done[b]);
    if (e != cudaSuccess) {
      status = kernels::CudaStatus(e, "cudaEventSynchronize", __FILE__, __LINE__);
      break;
    }
    uint8_t* dst = staging[b];
    if (region != nullptr) {
      constexpr uint64_t kSlice = 4ull << 20;
      const size_t slices = (n + kSlice - 1) / kSlice;
      status = formats::ParallelFor(threads, slices, [&](size_t i) {
        const uint64_t off = i * kSlice;
        std::memcpy(dst + off, region + at + off, std::min(kSlice, n - off));
        return absl::OkStatus();
      });
    } else {
      const uint64_t fr = f.header().frame_raw_bytes;
      const size_t first = at / fr;
      const size_t count = (n + fr - 1) / fr;
      status = formats::ParallelFor(threads, count, [&](size_t i) {
        return f.DecompressFrame(first + i, dst + i * fr);
      });
    }
    if (!status.ok()) break;
    e = cudaMemcpyAsync(base_ + at, dst, n, cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) e = cudaEventRecord(done[b], stream);
    if (e != cudaSuccess) status = kernels::CudaStatus(e, "cudaMemcpyAsync", __FILE__, __LINE__);
  }
  cudaError_t e = cudaStreamSynchronize(stream);
  if (status.ok() && e != cudaSuccess) status = kernels::CudaStatus(e, "upload", __FILE__, __LINE__);
  cleanup();
  stats_.bytes = total;
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return status;
}

}  // namespace dpl::runtime
