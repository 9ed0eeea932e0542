// A mixture of experts' feed-forward on the device (qwen3moe), for n token
// rows, with no host round trip (the experts a row takes are data, read by
// the kernels from device memory, so the whole block captures in a graph):
//
//   logits = W_router h                                  (the f32 matvec, RunMatVec)
//   p = softmax(logits); the k most probable experts e_0..e_{k-1}    (RouteTopK)
//   w_j = p_{e_j} / max(sum_j p_{e_j}, 2^-14)            (llama.cpp's norm_topk_prob)
//   g_j = silu(W_gate[e_j] h) * (W_up[e_j] h)            (ExpertMatVec, MoeSwiGluQuantize)
//   x += sum_j w_j W_down[e_j] g_j                        (ExpertMatVec, MoeCombine)
//
// A route is one (row, j) pair, route r = row * k + j. The expert products
// are the matvec skeleton (matvec_skeleton.cuh) with one CTA column per
// route: grid (n_routes, row blocks), each CTA reading its route's expert id
// from device memory and offsetting the weight pointer by that expert's
// stride, so the bits of a route's product are those of the dense single-
// token matvec of that expert's matrix at the same k-split.
//
// Cost: every route reads its expert's rows, so an expert chosen by m rows
// of a pass is read m times (from L2 when it stays there). One token reads
// exactly its k experts (the memory roofline of active parameters). For
// passes of several rows, RouteGroups sorts the routes by expert into
// tiles of one expert's routes and ExpertMatVecGrouped multiplies each tile
// by its expert on the int8 tensor cores (matvec_mma.cu's form, up to 64
// routes a tile), so an expert chosen by m rows is read ceil(m / tile)
// times, not m (a 512-token prompt, k = 8 of 128: once or twice an expert
// instead of ~32 times), and the products run at the tensor cores' rate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/matvec/matvec_plan.h"
#include "kernels/tuning.h"
#include "kernels/weight_matrix.h"

namespace dpl::kernels {

// Experts RouteTopK takes per row: one warp holds a row's logits, 32 a lane.
inline constexpr int kMoeMaxExperts = 1024;

// A 3-D expert tensor on the device: n_expert matrices of (n_rows, n_cols),
// expert e's at w.data + e * expert_stride (the file's bytes: each expert's
// rows in the tensor's layout, back to back).
struct ExpertWeights {
  WeightMatrix w;             // expert 0's matrix
  int64_t expert_stride = 0;  // bytes, n_rows * row_stride
  int n_expert = 0;
};

// How ExpertMatVec reads one expert tensor, resolved once at load.
struct ExpertPlan {
  MatVecKernel kernel = MatVecKernel::kQ4K;
  int ksplit = 1;  // warps that share a row group (matvec_geometry.h), depth 2, no pipe
};

// Checks `e` (shape, stride and alignment of an expert's matrix as
// PlanMatVec does, the expert stride, n_expert) and picks its kernel and
// k-split. Unimplemented for a type without an expert kernel
// (MatVecMoeSupports): "expert tensors of type T have no kernel (...)".
absl::StatusOr<ExpertPlan> PlanExperts(const ExpertWeights& e, const DecodeTuning& tuning);

// Int8 activation blocks of the expert products (as act_quant.h's QuantOut,
// no f16 copy), carved once at load for up to max_values values.
struct MoeActs {
  int8_t* q = nullptr;  // (max_values) int8, rows of n_cols back to back
  float* d = nullptr;   // (max_values / 32) block scales
  float* s = nullptr;   // (max_values / 32) d * sum(q) per block
  int64_t max_values = 0;
};
// Bytes for max_values (a multiple of 32) and the buffers laid out in `mem`
// (256-byte aligned, that many bytes, owned by the caller).
uint64_t MoeActsBytes(int64_t max_values);
MoeActs MoeActsIn(void* mem, int64_t max_values);

// h = x * w / sqrt(mean(x^2) + eps) per row (RMSNorm; the ffn norm), written
// as float32 (the router's f32 matvec reads it) and quantized into `acts`.
// x, h: (n_rows, n_cols), not overlapping; w: (n_cols).
absl::Status MoeNormQuantize(const float* x, const float* w, float eps, int n_cols, int n_rows,
                             float* h, const MoeActs& acts, cudaStream_t stream, bool pdl);

// g = silu(gate) * up, written as float32 and quantized into `acts`.
// gate, up, g: (n_rows, n_cols); g may equal gate.
absl::Status MoeSwiGluQuantize(const float* gate, const float* up, int n_cols, int n_rows, float* g,
                               const MoeActs& acts, cudaStream_t stream, bool pdl);

// Per row t < n_rows of logits (n_rows, n_expert):
//   p_e = exp(l_e - max_e l) / sum_e exp(l_e - max_e l)
//   ids[t, j] = the j-th most probable expert (by logit, equal logits: the
//               lower id first), j < k
//   weights[t, j] = p_{ids[t, j]} / max(sum_j p_{ids[t, j]}, 2^-14)
// (the CPU reference's rule; NaN logits count as -inf). One warp a row.
// ids, weights: (n_rows, k). 1 <= k <= n_expert <= kMoeMaxExperts.
// ids_copy (tests, may be null): the ids written there too, (n_rows, k).
absl::Status RouteTopK(const float* logits, int n_rows, int n_expert, int k, int* ids,
                       float* weights, cudaStream_t stream, bool pdl, int* ids_copy = nullptr);

// One expert tensor of an ExpertMatVec launch and where it writes.
struct ExpertOut {
  const ExpertWeights* w = nullptr;
  const ExpertPlan* plan = nullptr;
  float* y = nullptr;  // (n_routes, w->w.n_rows)
};

// For every route r < n_routes and every part m (1 to kMaxMatVecParts
// tensors of equal n_cols, kernel and k-split: gate and up share a launch):
//   y_m[r] = W_m[ids[r]] x~[r / x_div]
// x~: the activations in `x` ((n_routes / x_div rows, n_cols), quantized by
// MoeNormQuantize or MoeSwiGluQuantize). ids: (n_routes) expert ids in
// [0, n_expert) (RouteTopK's; out-of-range ids are clamped, never read out
// of bounds). Gate/up: x_div = k (route r reads token r / k); down: 1.
absl::Status ExpertMatVec(absl::Span<const ExpertOut> parts, const MoeActs& x, int n_cols,
                          int n_routes, int x_div, const int* ids, cudaStream_t stream, bool pdl);

// The routes of a pass grouped by expert, in device memory (carved once at
// load, like MoeActs): `order` holds the route ids expert by expert (within
// an expert ascending), and the tiles cut each expert's run into pieces of
// at most tile_routes routes (RouteGroups' argument): tile i is {expert,
// first index into order, count}. n_tiles[0] says how many tiles
// RouteGroups wrote.
inline constexpr int kMoeTileRoutes = 8;  // the smallest tile: the skeleton's token tile
struct MoeGroups {
  int* n_tiles = nullptr;  // (1)
  int* order = nullptr;    // (max_routes)
  int* tiles = nullptr;    // (MoeMaxTiles(max_routes, n_expert), 3)
  int max_routes = 0;
  int n_expert = 0;
};
// Tiles n_routes routes over n_expert experts can need: each expert's run
// ends in at most one partial tile.
int64_t MoeMaxTiles(int64_t n_routes, int n_expert, int tile_routes);
// The tile size for n_routes routes over n_expert experts of an expert
// tensor of this kernel and width: types with the int8 tensor-core form
// (MatVecMmaSupports) take the smallest of 8, 16, 32, 64 that holds the mean
// routes an expert (fewer empty token slots in the mma), others 8 (the
// skeleton's token tile).
int MoeTileRoutes(int n_routes, int n_expert, MatVecKernel kernel, int n_cols);
// Bytes for max_routes routes of n_expert experts (any tile size), and the buffers laid out
// in `mem` (256-byte aligned, that many bytes, owned by the caller).
uint64_t MoeGroupsBytes(int max_routes, int n_expert);
MoeGroups MoeGroupsIn(void* mem, int max_routes, int n_expert);

// Groups routes [0, n_routes) of ids (RouteTopK's, (n_routes); out-of-range
// ids clamped as ExpertMatVec does) into `groups`: a stable counting sort by
// expert, then the tiles of at most tile_routes (8, 16, 32 or 64). One warp,
// on the device (graph-capturable). n_routes <= groups.max_routes.
absl::Status RouteGroups(const int* ids, int n_routes, int tile_routes, const MoeGroups& groups,
                         cudaStream_t stream, bool pdl);

// ExpertMatVec's outputs (each route's y_m[r]) over RouteGroups' tiles
// (made with tile_routes = MoeTileRoutes(...), or any multiple of 8 up to 64
// for a type with the tensor-core form), each tile's expert read once for
// all its routes: on the int8 tensor cores where the type has that form
// (within ~1e-6 of ExpertMatVec: the same integer dots, scaled and summed in
// the mma form's order; the same bits whatever the tile size), else the
// skeleton's 8-token tile (ExpertMatVec's bits). The grid covers
// MoeMaxTiles tiles; CTAs past n_tiles[0] exit.
absl::Status ExpertMatVecGrouped(absl::Span<const ExpertOut> parts, const MoeActs& x, int n_cols,
                                 int n_routes, int x_div, const MoeGroups& groups, int tile_routes,
                                 cudaStream_t stream, bool pdl);

// x[t] += sum_{j < k} weights[t, j] * y[t * k + j]   (j ascending: deterministic)
// y: (n_rows * k, n_cols); weights: (n_rows, k); x: (n_rows, n_cols).
absl::Status MoeCombine(const float* y, const float* weights, int n_rows, int k, int n_cols, float* x,
                        cudaStream_t stream, bool pdl);

}  // namespace dpl::kernels
