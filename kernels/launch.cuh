// Programmatic dependent launch (Hopper PDL) for the decode step's chain of
// kernels, in one place: the device side (wait for the previous kernel,
// release the next one) and the host launch that asks for it.
//
// A kernel launched with `pdl` may start while the kernel before it on the
// stream is still running; it must not read that kernel's outputs (nor write
// what that kernel reads) before GridDependencyWait() returns, which is when
// the previous grid has finished and its memory is visible. Work that does
// not depend on it (loading weights, which never change) goes before the
// wait: that is what overlaps the previous kernel's tail. Without `pdl` the
// launch is an ordinary stream-ordered one and the wait returns at once, so
// the same kernel serves both. Every kernel that may be launched with `pdl`
// calls GridDependencyWait() before its first dependent access, and
// GridLaunchDependents() once its own wait has returned, so at most one grid
// waits ahead of the running one (a release at the very start would let a
// chain of waiting grids pile onto the SMs).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "absl/status/status.h"
#include "kernels/cuda_check.h"

namespace dpl::kernels {

__device__ __forceinline__ void GridDependencyWait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void GridLaunchDependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic
// dependent launch when `pdl` (cudaLaunchKernelEx with
// cudaLaunchAttributeProgrammaticStreamSerialization; a captured graph keeps
// it as a programmatic edge). Checks the launch.
// `cluster` (LaunchClusterKernel): CTAs grouped into thread block clusters
// of that shape (Hopper: co-scheduled on one GPC, sharing their shared
// memory); (1, 1, 1) is an ordinary launch.
template <typename... KArgs, typename... Args>
absl::Status LaunchClusterKernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, dim3 cluster,
                                 size_t smem, cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  DPL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
  return absl::OkStatus();
}

template <typename... KArgs, typename... Args>
absl::Status LaunchKernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, bool pdl, Args&&... args) {
  return LaunchClusterKernel(kernel, grid, block, dim3(1, 1, 1), smem, stream, pdl,
                             std::forward<Args>(args)...);
}

// Kernel may use `bytes` of dynamic shared memory: above 48 KB that needs
// an opt-in, made once per process and kernel (so captured launches make
// no extra API call).
template <auto Kernel>
absl::Status OptInSharedMemory(int bytes) {
  if (bytes <= 48 * 1024) return absl::OkStatus();
  static std::atomic<bool> opted_in{false};
  if (!opted_in.load(std::memory_order_relaxed)) {
    DPL_CUDA_CHECK(
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    opted_in.store(true, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

}  // namespace dpl::kernels
