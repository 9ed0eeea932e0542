#include "runtime/cuda/device_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

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

absl::StatusOr<const uint8_t*> DeviceWeights::TensorPtr(absl::string_view name) const {
  const formats::DplTensorEntry* t = file_->FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
  return base_.get() + t->offset;
}

// Two pinned staging buffers alternate: while the GPU copies buffer b, host
// threads fill buffer 1-b (memcpy from the mapping, or zstd frames inflated
// straight into it). An event per buffer says when its copy has finished.
// Measured on the H200 box (14B, page cache): memcpy from the mapping fills
// at 29.8 GB/s, pread(2) into the same buffers at 23-27 GB/s; the copies
// never wait (LoadStats::wait_seconds ~2 ms): the fill is the bound.
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
  DPL_ASSIGN_OR_RETURN(const kernels::Stream stream, kernels::CreateStream());
  kernels::PinnedBuffer<uint8_t> staging[2];
  kernels::Event done[2];
  for (int b = 0; b < 2; ++b) {
    DPL_ASSIGN_OR_RETURN(staging[b], kernels::PinnedBuffer<uint8_t>::Allocate(chunk));
    DPL_ASSIGN_OR_RETURN(done[b], kernels::CreateEvent());
  }
  // Whatever happens below, no copy may still read staging when it is freed.
  struct Drain {
    cudaStream_t s;
    ~Drain() { cudaStreamSynchronize(s); }
  } drain{stream.get()};
  const uint8_t* region = f.data_region();  // nullptr when compressed
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  int b = 0;
  for (uint64_t at = 0; at < total; at += chunk, b ^= 1) {
    const uint64_t n = std::min(chunk, total - at);
    auto t = std::chrono::steady_clock::now();
    DPL_CUDA_CHECK(cudaEventSynchronize(done[b].get()));  // this buffer's previous copy drained
    stats_.wait_seconds += since(t);
    t = std::chrono::steady_clock::now();
    uint8_t* dst = staging[b].get();
    if (region != nullptr) {
      constexpr uint64_t kSlice = 4ull << 20;
      const size_t slices = (n + kSlice - 1) / kSlice;
      DPL_RETURN_IF_ERROR(formats::ParallelFor(threads, slices, [&](size_t i) {
        const uint64_t off = i * kSlice;
        std::memcpy(dst + off, region + at + off, std::min(kSlice, n - off));
        return absl::OkStatus();
      }));
    } else {
      const uint64_t fr = f.header().frame_raw_bytes;
      const size_t first = at / fr;
      const size_t count = (n + fr - 1) / fr;
      DPL_RETURN_IF_ERROR(formats::ParallelFor(threads, count, [&](size_t i) {
        return f.DecompressFrame(first + i, dst + i * fr);
      }));
    }
    stats_.fill_seconds += since(t);
    DPL_CUDA_CHECK(cudaMemcpyAsync(base_.get() + at, dst, n, cudaMemcpyHostToDevice, stream.get()));
    DPL_CUDA_CHECK(cudaEventRecord(done[b].get(), stream.get()));
  }
  const auto t = std::chrono::steady_clock::now();
  DPL_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  stats_.wait_seconds += since(t);
  stats_.bytes = total;
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

}  // namespace dpl::runtime
