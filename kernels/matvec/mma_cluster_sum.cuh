// The k-split sum of a tensor-core matvec inside a thread block cluster,
// shared by the int8 form (matvec_mma.cu, 64-row tiles) and the f16 form
// (matvec_mma_f16.cu, 128-row tiles). A launch whose clusters are a row
// tile's P.splits CTAs (cluster rank = blockIdx.z): each CTA leaves its
// kRows rows x T tokens of partial sums in its own shared memory as
// red[token][row] (kPitch floats a token row), and CTA z adds the z-th
// 1/splits of the tile's outputs over all the cluster's shared memories
// (distributed shared memory), in split order, then bias and residual:
//   y[t, r] = ((p_0[t, r] + p_1[t, r]) + ... + p_{S-1}[t, r]) (+ bias[r]) (+ residual[t, r])
// MmaSumSplits' additions in its order, so the same bits, with no partials
// through global memory and no second launch. Why: the sum kernels were 112
// of a 16-sequence 7B step's 425 launches (docs/PERF.md, "A 16-sequence
// step, kernel by kernel"); one CTA adding a whole tile lost (its chain of
// L2 round trips, "The k-split sums in the row tile's last CTA"): here
// every CTA of the tile adds a share.
#pragma once

#include <cooperative_groups.h>

#include "kernels/matvec/matvec_kernels.h"

namespace dpl::kernels {

// CTAs in this CTA's thread block cluster: 1 unless launched as clusters.
__device__ __forceinline__ int ClusterCtas() {
  return static_cast<int>(cooperative_groups::this_cluster().num_blocks());
}

// Call with every CTA of the cluster after each has written its red tile
// (and before any of them reuses that shared memory): the first cluster
// barrier publishes the tiles, the second keeps each CTA's shared memory
// alive until the others have read it. kThreads: the CTA's threads.
template <int kRows, int kPitch, int kThreads>
__device__ __forceinline__ void ClusterSumTile(const MatVecArgs& a, const MatVecPart& P, int row0, int z,
                                               int n_tok, float* red) {
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();  // every split's partials written and visible cluster-wide
  const int splits = P.splits;
  const int n_out = n_tok * kRows;
  const int lo = n_out * z / splits, hi = n_out * (z + 1) / splits;
  for (int o = lo + static_cast<int>(threadIdx.x); o < hi; o += kThreads) {
    const int tok = o / kRows, r = o % kRows, row = row0 + r;
    if (row >= P.n_rows) continue;
    const int at = tok * kPitch + r;
    float p[kMmaMaxSplits];  // every split's load in flight before the first add
#pragma unroll
    for (int s = 0; s < kMmaMaxSplits; ++s) {
      p[s] = s < splits ? cluster.map_shared_rank(red, s)[at] : 0.f;
    }
    float v = p[0];
#pragma unroll
    for (int s = 1; s < kMmaMaxSplits; ++s) {
      if (s < splits) v += p[s];
    }
    const int64_t off = static_cast<int64_t>(tok) * P.n_rows + row;
    if (P.bias != nullptr) v += P.bias[row];
    if (P.residual != nullptr) v += P.residual[off];  // may alias y: read before write
    P.y[off] = v;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

}  // namespace dpl::kernels
