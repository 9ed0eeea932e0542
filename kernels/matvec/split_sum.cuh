// The end of a k-split product on the mma forms (grid.z = splits,
// matvec_geometry.h MmaSplits / MmaF16Splits): every CTA of a row tile has
// written its partial sums; the last of the tile's CTAs to finish adds them
//   y[t, r] = (sum_z partial[z, t, r]) (+ bias[r]) (+ residual[t, r])
// in split order z = 0, 1, ..., the same additions in the same order as the
// separate sum kernel (MmaSumSplits), so the same bits, without its launch.
// "Last" is a counter per row tile (MatVecPart::split_done) that each CTA
// bumps once its partials are fenced, and that the last CTA puts back to
// zero for the next launch (the pattern of the CUDA sample
// threadFenceReduction; the partials are read past L1, which other SMs'
// writes do not reach).
#pragma once

#include <cuda_runtime.h>

#include "kernels/matvec/matvec_kernels.h"

namespace dpl::kernels {

// Called by every thread of a CTA of a split part after its partials are
// written: rows row0 .. row0 + rows - 1 of the part are the tile's.
template <int kThreads>
__device__ __forceinline__ void SumSplitsIfLast(const MatVecPart& P, int n_tokens, int tile,
                                                int row0, int rows) {
  __threadfence();  // this thread's partials visible to the whole GPU ...
  __syncthreads();  // ... for every thread, before the count
  // Thread 0 counts; the barrier tells every thread what it saw (no shared
  // memory: the f16 form's stages fill what two CTAs a SM may have).
  const bool last = __syncthreads_or(
      threadIdx.x == 0 && atomicAdd(P.split_done + tile, 1u) == static_cast<unsigned>(P.splits - 1));
  if (!last) return;
  __threadfence();  // every other split's partials are visible past this
  const int nr = min(rows, P.n_rows - row0);
  const int n = n_tokens * nr;
  const int64_t plane = static_cast<int64_t>(n_tokens) * P.n_rows;
  // kBatch elements a thread at a time, each split's loads issued before
  // the first add: one round trip to L2 a batch, not one a split.
  constexpr int kBatch = 4;
  for (int i0 = 0; i0 < n; i0 += kBatch * kThreads) {
    int64_t o[kBatch];
    int row[kBatch];
    float p[kMmaMaxSplits][kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kThreads + static_cast<int>(threadIdx.x);
      const int tok = i / nr;
      row[k] = row0 + (i - tok * nr);
      o[k] = i < n ? static_cast<int64_t>(tok) * P.n_rows + row[k] : -1;
#pragma unroll
      for (int z = 0; z < kMmaMaxSplits; ++z) {
        p[z][k] = o[k] >= 0 && z < P.splits ? __ldcg(P.partial + z * plane + o[k]) : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (o[k] < 0) continue;
      float v = p[0][k];
#pragma unroll
      for (int z = 1; z < kMmaMaxSplits; ++z) {
        if (z < P.splits) v += p[z][k];
      }
      if (P.bias != nullptr) v += P.bias[row[k]];
      if (P.residual != nullptr) v += P.residual[o[k]];  // may alias y: read before write
      P.y[o[k]] = v;
    }
  }
  if (threadIdx.x == 0) P.split_done[tile] = 0;  // ready for the next launch
}

}  // namespace dpl::kernels
