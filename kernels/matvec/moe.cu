// The mixture-of-experts kernels (moe.h): routing (softmax + top-k +
// renormalized weights), the routes grouped by expert, the expert-indexed
// matvec (the matvec skeleton, one CTA column per route or per tile of one
// expert's routes) and the weighted sum into the residual.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/ggml_types.h"
#include "kernels/cuda_check.h"
#include "kernels/launch.cuh"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/matvec/matvec_skeleton.cuh"
#include "kernels/matvec/moe.h"

namespace dpl::kernels {
namespace {

uint64_t Align256(uint64_t n) { return (n + 255) / 256 * 256; }

// ---------------------------------------------------------------------------
// RouteTopK: one warp per row; lane l holds the row's logits l, l + 32, ...
// (kPer of them). The k picks are k warp-wide argmaxes over the experts not
// taken yet, under the order (logit descending, id ascending): a total order
// once NaN reads as -inf, so every lane of the butterfly agrees on each pick.
// Selecting by logit is selecting by probability (exp is monotonic) without
// exp's rounding merging two logits into one probability.
// kPer: logits a lane holds, ceil(n_expert / 32) rounded up to a power of
// two (a template so a 128-expert row loops 4 times, not 32: ncu on an
// H100, 2026-12-07, one row of 128 experts, k 8: 10.3 us with the loops
// sized for 1,024 experts; the same bits either way).
constexpr int kRouteWarps = 4;

__device__ __forceinline__ bool RouteBefore(float av, int ai, float bv, int bi) {
  return bi == INT_MAX || (ai != INT_MAX && (av > bv || (av == bv && ai < bi)));
}

template <int kRoutePer>
__global__ void __launch_bounds__(32 * kRouteWarps)
    RouteTopKKernel(const float* __restrict__ logits,  // (n_rows, n_expert)
                    int n_rows, int n_expert, int k,
                    int* __restrict__ ids,          // (n_rows, k)
                    float* __restrict__ weights,    // (n_rows, k)
                    int* __restrict__ ids_copy) {   // (n_rows, k) or null
  GridDependencyWait();
  GridLaunchDependents();
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
  if (t >= n_rows) return;  // warp-uniform
  const float* l = logits + t * n_expert;
  float v[kRoutePer];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRoutePer; ++i) {
    const int e = lane + 32 * i;
    v[i] = -INFINITY;
    if (e < n_expert) {
      const float x = l[e];
      v[i] = isnan(x) ? -INFINITY : x;
      mx = fmaxf(mx, v[i]);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  // Z = sum_e exp(l_e - max): per lane in index order, then the butterfly
  // (every lane ends with the same bits: each step adds the same two values).
  float z = 0.f;
#pragma unroll
  for (int i = 0; i < kRoutePer; ++i) {
    if (lane + 32 * i < n_expert) z += expf(v[i] - mx);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
  uint32_t taken = 0;  // bit i: expert lane + 32 i picked
  float sum = 0.f;     // of the picked probabilities, in pick order (lane 0 uses it)
  int* row_ids = ids + t * k;
  float* row_w = weights + t * k;
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int i = 0; i < kRoutePer; ++i) {
      const int e = lane + 32 * i;
      if (e < n_expert && !((taken >> i) & 1u) && RouteBefore(v[i], e, bv, bi)) {
        bv = v[i];
        bi = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (RouteBefore(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    // k <= n_expert: an untaken expert exists, so bi is one.
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    const float p = expf(bv - mx) / z;
    sum += p;
    if (lane == 0) {
      row_ids[j] = bi;
      if (ids_copy != nullptr) ids_copy[t * k + j] = bi;
      row_w[j] = p;  // the probability for now; renormalized below
    }
  }
  if (lane == 0) {
    const float s = fmaxf(sum, 6.103515625e-5f);  // 2^-14, llama.cpp's clamp
    for (int j = 0; j < k; ++j) row_w[j] = row_w[j] / s;
  }
}

// ---------------------------------------------------------------------------
// The expert-indexed matvec: MatVecBody (matvec_skeleton.cuh) for one token
// (T = 1, so the body ignores blockIdx.x and the CTA column is the route),
// with the arguments moved to the route's expert, activation row and
// output row first.
struct MoeMatVecArgs {
  MatVecArgs mv;  // parts: w = expert 0's rows, y = route 0's output; xq/xd/xs = row 0's
  int64_t expert_stride[kMaxMatVecParts];  // bytes
  const int* ids = nullptr;                // (n_routes)
  int n_expert = 0;
  int x_div = 1;  // route r reads activation row r / x_div
};

template <class U, int KS>
__global__ void __launch_bounds__(32 * WarpsPerCta(KS)) ExpertMatVecT(const MoeMatVecArgs m) {
  // The expert ids and activations come from the kernels before: wait
  // before the first read (the body's own wait then returns at once, and it
  // loads the weights after it, since which weights depends on the id).
  GridDependencyWait();
  const int r = static_cast<int>(blockIdx.x);
  const int e = min(max(m.ids[r], 0), m.n_expert - 1);
  MatVecArgs a = m.mv;
  const int64_t xr = r / m.x_div;
  const int64_t nb = a.n_cols / kActBlock;
  a.xq += xr * a.n_cols;
  a.xd += xr * nb;
  a.xs += xr * nb;
#pragma unroll
  for (int i = 0; i < kMaxMatVecParts; ++i) {
    if (i < a.n_parts) {
      a.part[i].w += static_cast<int64_t>(e) * m.expert_stride[i];
      a.part[i].y += static_cast<int64_t>(r) * a.part[i].n_rows;
    }
  }
  matvec_detail::MatVecBody<U, 1, KS, 2, false, false>(a);
}

// ---------------------------------------------------------------------------
// RouteGroups: one warp. Pass 1 counts each expert's routes (the lanes of a
// 32-route chunk that share an expert found with __match_any_sync, their
// lowest lane adding their number); each lane then takes a run of experts in
// order, and warp prefix sums give every expert its first index into
// `order` and its first tile; pass 2 places each route at its expert's next
// index plus its rank among the chunk's lanes with that expert (so within an
// expert the routes keep ascending order: a stable sort, the same every
// run). 512 routes (64 rows, k = 8): 16 chunks a pass.
__device__ __forceinline__ int ClampExpert(int e, int n_expert) { return min(max(e, 0), n_expert - 1); }

__global__ void __launch_bounds__(32)
    RouteGroupsKernel(const int* __restrict__ ids,  // (n_routes)
                      int n_routes, int n_expert, int tile_routes,
                      int* __restrict__ n_tiles,    // (1)
                      int* __restrict__ order,      // (n_routes)
                      int* __restrict__ tiles) {    // (MoeMaxTiles, 3)
  GridDependencyWait();
  GridLaunchDependents();
  __shared__ int next[kMoeMaxExperts];  // per expert: its count, then its next index into order
  const int lane = threadIdx.x;
  for (int e = lane; e < n_expert; e += 32) next[e] = 0;
  __syncwarp();
  for (int r0 = 0; r0 < n_routes; r0 += 32) {
    const int r = r0 + lane;
    const int e = r < n_routes ? ClampExpert(ids[r], n_expert) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) next[e] += __popc(peers);
    __syncwarp();
  }
  const int per = (n_expert + 31) / 32;
  const int e0 = min(lane * per, n_expert), e1 = min(e0 + per, n_expert);
  int routes = 0, ntile = 0;
  for (int e = e0; e < e1; ++e) {
    routes += next[e];
    ntile += (next[e] + tile_routes - 1) / tile_routes;
  }
  int rsum = routes, tsum = ntile;  // inclusive prefix sums over the lanes
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, rsum, o);
    const int b = __shfl_up_sync(0xffffffffu, tsum, o);
    if (lane >= o) {
      rsum += a;
      tsum += b;
    }
  }
  if (lane == 31) n_tiles[0] = tsum;
  int first = rsum - routes, tile = tsum - ntile;
  for (int e = e0; e < e1; ++e) {
    const int c = next[e];
    for (int j = 0; j < c; j += tile_routes) {
      tiles[3 * tile] = e;
      tiles[3 * tile + 1] = first + j;
      tiles[3 * tile + 2] = min(tile_routes, c - j);
      ++tile;
    }
    next[e] = first;
    first += c;
  }
  __syncwarp();
  for (int r0 = 0; r0 < n_routes; r0 += 32) {
    const int r = r0 + lane;
    const int e = r < n_routes ? ClampExpert(ids[r], n_expert) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0) order[next[e] + __popc(peers & ((1u << lane) - 1u))] = r;
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) next[e] += __popc(peers);
    __syncwarp();
  }
}

// The grouped expert matvec where the type has no tensor-core form (q8_0
// rows that are not whole 256-column blocks): a CTA column per tile of
// RouteGroups (tiles of 8), its expert's weights, and the skeleton's 8-token
// tile gathering the tile's routes (RouteTokens: activation row route /
// x_div, output row route).
struct RouteTokens {
  const int* order = nullptr;  // the tile's first entry of MoeGroups::order
  int nt = 0;
  int x_div = 1;
  int xr[kMoeTileRoutes];
  int yr[kMoeTileRoutes];
  template <int T>
  __device__ __forceinline__ void Init(const MatVecArgs&) {
    static_assert(T == kMoeTileRoutes, "one tile of routes a CTA");
#pragma unroll
    for (int t = 0; t < T; ++t) {
      yr[t] = order[t < nt ? t : 0];
      xr[t] = yr[t] / x_div;
    }
  }
  // t is a constant or a select of two constants once the body is unrolled.
  __device__ __forceinline__ int x(int t) const {
    int v = xr[0];
#pragma unroll
    for (int i = 1; i < kMoeTileRoutes; ++i) v = t == i ? xr[i] : v;
    return v;
  }
  __device__ __forceinline__ int y(int t) const {
    int v = yr[0];
#pragma unroll
    for (int i = 1; i < kMoeTileRoutes; ++i) v = t == i ? yr[i] : v;
    return v;
  }
};

struct MoeGroupedArgs {
  MatVecArgs mv;  // parts: w = expert 0's rows, y = route 0's output; xq/xd/xs = row 0's
  int64_t expert_stride[kMaxMatVecParts];  // bytes
  const int* n_tiles = nullptr;
  const int* order = nullptr;
  const int* tiles = nullptr;
  int n_expert = 0;
  int x_div = 1;
};

template <class U, int KS>
__global__ void __launch_bounds__(32 * WarpsPerCta(KS)) ExpertMatVecGroupedT(const MoeGroupedArgs m) {
  GridDependencyWait();  // the tiles come from RouteGroups, the activations from before
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= m.n_tiles[0]) return;
  const int e = ClampExpert(m.tiles[3 * tile], m.n_expert);
  RouteTokens tk;
  tk.order = m.order + m.tiles[3 * tile + 1];
  tk.nt = m.tiles[3 * tile + 2];
  tk.x_div = m.x_div;
  MatVecArgs a = m.mv;
#pragma unroll
  for (int i = 0; i < kMaxMatVecParts; ++i) {
    if (i < a.n_parts) a.part[i].w += static_cast<int64_t>(e) * m.expert_stride[i];
  }
  matvec_detail::MatVecBody<U, kMoeTileRoutes, KS, 2, false, false>(a, tk);
}

using ExpertFn = void (*)(MoeMatVecArgs);
using GroupedFn = void (*)(MoeGroupedArgs);

template <class U, bool kGrouped>
auto PickKs(int ksplit) {
  using Fn = std::conditional_t<kGrouped, GroupedFn, ExpertFn>;
  switch (ksplit) {
    case 1: return kGrouped ? Fn(ExpertMatVecGroupedT<U, 1>) : Fn(ExpertMatVecT<U, 1>);
    case 2: return kGrouped ? Fn(ExpertMatVecGroupedT<U, 2>) : Fn(ExpertMatVecT<U, 2>);
    case 4: return kGrouped ? Fn(ExpertMatVecGroupedT<U, 4>) : Fn(ExpertMatVecT<U, 4>);
  }
  return Fn(nullptr);
}

template <bool kGrouped>
auto PickExpert(MatVecKernel kernel, int ksplit) {
  switch (kernel) {
    case MatVecKernel::kQ4K: return PickKs<Q4K, kGrouped>(ksplit);
    case MatVecKernel::kQ5K: return PickKs<Q5K, kGrouped>(ksplit);
    case MatVecKernel::kQ6KRaw: return PickKs<Q6K<false>, kGrouped>(ksplit);
    case MatVecKernel::kQ6KDpl: return PickKs<Q6K<true>, kGrouped>(ksplit);
    case MatVecKernel::kQ8_0: return PickKs<Q8_0<false>, kGrouped>(ksplit);
    case MatVecKernel::kQ8_0Dpl: return PickKs<Q8_0<true>, kGrouped>(ksplit);
    default: return PickKs<Q4K, kGrouped>(0);  // nullptr
  }
}

// Skeleton steps along one row of n_cols (the traits' Steps).
int64_t RowSteps(MatVecKernel kernel, int64_t n_cols) {
  switch (kernel) {
    case MatVecKernel::kQ4K:
    case MatVecKernel::kQ5K: return n_cols / 256;
    case MatVecKernel::kQ6KRaw:
    case MatVecKernel::kQ6KDpl: return (n_cols / 256 + 1) / 2;
    default: return (n_cols / 32 + 3) / 4;  // q8_0
  }
}

// ---------------------------------------------------------------------------
// MoeCombine: one thread per (row, column).
constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const float* __restrict__ y,        // (n_rows * k, n_cols)
                     const float* __restrict__ weights,  // (n_rows, k)
                     int64_t n, int k, int n_cols,
                     float* __restrict__ x) {  // (n_rows, n_cols)
  GridDependencyWait();
  GridLaunchDependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / n_cols, c = i - t * n_cols;
  float acc = 0.f;
  for (int j = 0; j < k; ++j) {
    acc += weights[t * k + j] * y[(t * k + j) * n_cols + c];
  }
  x[i] += acc;
}

absl::Status CheckGridX(int64_t grid, const char* what) {
  if (grid <= 0 || grid > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": grid of ", grid, " CTAs"));
  }
  return absl::OkStatus();
}

QuantOut OutOf(const MoeActs& a) { return {a.q, a.d, a.s, nullptr}; }

absl::Status CheckActs(const char* who, const MoeActs& a, int n_cols, int64_t n_rows) {
  if (a.q == nullptr) return absl::FailedPreconditionError(absl::StrCat(who, ": no activation buffer"));
  if (n_cols <= 0 || n_cols % kActBlock != 0 || n_rows <= 0 || n_rows * n_cols > a.max_values) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", n_rows, " x ", n_cols,
                                                   " activations (n_cols a multiple of 32), the buffer holds ",
                                                   a.max_values, " values"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExpertPlan> PlanExperts(const ExpertWeights& e, const DecodeTuning& tuning) {
  DPL_ASSIGN_OR_RETURN(const MatVecPlan mv, PlanMatVec(e.w, tuning));
  if (!MatVecMoeSupports(mv.kernel)) {
    return absl::UnimplementedError(
        absl::StrCat("expert tensors of type ", formats::TraitsOf(e.w.type).name,
                     " have no kernel (the expert matvec runs q4_K, q5_K, q6_K and q8_0)"));
  }
  if (e.n_expert < 1 || e.n_expert > kMoeMaxExperts) {
    return absl::InvalidArgumentError(
        absl::StrCat("experts: ", e.n_expert, " experts, outside [1, ", kMoeMaxExperts, "]"));
  }
  if (e.expert_stride != e.w.n_rows * e.w.row_stride) {
    return absl::InvalidArgumentError(absl::StrCat("experts: stride ", e.expert_stride, " bytes, not ",
                                                   e.w.n_rows, " rows of ", e.w.row_stride));
  }
  if (e.w.n_rows > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("experts: ", e.w.n_rows, " rows"));
  }
  // Warps a row group shares: enough steps for each to take one run of
  // depth 2 (a 2048-column q4_K row: 8 steps, k-split 4; 768 columns: 1).
  const int64_t steps = RowSteps(mv.kernel, e.w.n_cols);
  ExpertPlan p;
  p.kernel = mv.kernel;
  p.ksplit = steps >= 8 ? 4 : steps >= 4 ? 2 : 1;
  return p;
}

uint64_t MoeActsBytes(int64_t max_values) {
  const uint64_t n = static_cast<uint64_t>(max_values);
  return Align256(n) + 2 * Align256(n / kActBlock * sizeof(float));
}

MoeActs MoeActsIn(void* mem, int64_t max_values) {
  const uint64_t n = static_cast<uint64_t>(max_values);
  uint8_t* base = static_cast<uint8_t*>(mem);
  MoeActs a;
  a.q = reinterpret_cast<int8_t*>(base);
  a.d = reinterpret_cast<float*>(base + Align256(n));
  a.s = reinterpret_cast<float*>(base + Align256(n) + Align256(n / kActBlock * sizeof(float)));
  a.max_values = max_values;
  return a;
}

absl::Status MoeNormQuantize(const float* x, const float* w, float eps, int n_cols, int n_rows,
                             float* h, const MoeActs& acts, cudaStream_t stream, bool pdl) {
  DPL_RETURN_IF_ERROR(CheckActs("MoE norm + quantize", acts, n_cols, n_rows));
  if (x == nullptr || w == nullptr || h == nullptr || x == h) {
    return absl::InvalidArgumentError("MoE norm + quantize: null pointer, or h == x");
  }
  return LaunchNormQuantize(x, w, eps, n_cols, n_rows, h, OutOf(acts), pdl, stream);
}

absl::Status MoeSwiGluQuantize(const float* gate, const float* up, int n_cols, int n_rows, float* g,
                               const MoeActs& acts, cudaStream_t stream, bool pdl) {
  DPL_RETURN_IF_ERROR(CheckActs("MoE SwiGLU + quantize", acts, n_cols, n_rows));
  if (gate == nullptr || up == nullptr || g == nullptr) {
    return absl::InvalidArgumentError("MoE SwiGLU + quantize: null pointer");
  }
  return LaunchSwiGluQuantize(gate, up, n_cols, n_rows, g, OutOf(acts), pdl, stream);
}

absl::Status RouteTopK(const float* logits, int n_rows, int n_expert, int k, int* ids,
                       float* weights, cudaStream_t stream, bool pdl, int* ids_copy) {
  if (n_rows <= 0 || n_expert < 1 || n_expert > kMoeMaxExperts || k < 1 || k > n_expert) {
    return absl::InvalidArgumentError(absl::StrCat("route top-k: ", n_rows, " rows of ", n_expert,
                                                   " experts, k ", k, " (1 <= k <= n_expert <= ",
                                                   kMoeMaxExperts, ")"));
  }
  if (logits == nullptr || ids == nullptr || weights == nullptr) {
    return absl::InvalidArgumentError("route top-k: null pointer");
  }
  const int64_t grid = (int64_t{n_rows} + kRouteWarps - 1) / kRouteWarps;
  DPL_RETURN_IF_ERROR(CheckGridX(grid, "route top-k"));
  void (*fn)(const float*, int, int, int, int*, float*, int*) = RouteTopKKernel<kMoeMaxExperts / 32>;
  if (n_expert <= 32) fn = RouteTopKKernel<1>;
  else if (n_expert <= 64) fn = RouteTopKKernel<2>;
  else if (n_expert <= 128) fn = RouteTopKKernel<4>;
  else if (n_expert <= 256) fn = RouteTopKKernel<8>;
  else if (n_expert <= 512) fn = RouteTopKKernel<16>;
  return LaunchKernel(fn, dim3(static_cast<unsigned>(grid)), dim3(32 * kRouteWarps), 0,
                      stream, pdl, logits, n_rows, n_expert, k, ids, weights, ids_copy);
}

namespace {

// What both expert launches share: the parts checked and laid into `a` (route
// 0's outputs, expert 0's weights, row 0's activations), their expert
// strides, the row blocks of the grid.
struct ExpertLaunch {
  MatVecArgs a;
  int64_t expert_stride[kMaxMatVecParts] = {};
  int64_t blocks = 0;
  int n_expert = 0;
  MatVecKernel kernel = MatVecKernel::kQ4K;
  int ksplit = 1;
};

// rows_per_cta: of the kernel the launch runs (the skeleton's RowsPerCta
// of the plan's k-split, or the mma form's kMmaCtaRows).
absl::StatusOr<ExpertLaunch> PrepareExperts(const char* who, absl::Span<const ExpertOut> parts,
                                            const MoeActs& x, int n_cols, int n_routes, int x_div,
                                            int rows_per_cta) {
  if (parts.empty() || parts.size() > static_cast<size_t>(kMaxMatVecParts)) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", parts.size(), " parts (1..", kMaxMatVecParts, ")"));
  }
  if (n_routes <= 0 || x_div <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", n_routes, " routes, x_div ", x_div));
  }
  const int64_t x_rows = (int64_t{n_routes} + x_div - 1) / x_div;
  DPL_RETURN_IF_ERROR(CheckActs(who, x, n_cols, x_rows));
  if (parts[0].plan == nullptr || parts[0].w == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": part 0 incomplete"));
  }
  const ExpertPlan& p0 = *parts[0].plan;
  ExpertLaunch L;
  MatVecArgs& a = L.a;
  a.n_parts = static_cast<int>(parts.size());
  a.n_cols = n_cols;
  a.n_tokens = 1;
  a.xq = x.q;
  a.xd = x.d;
  a.xs = x.s;
  for (size_t i = 0; i < parts.size(); ++i) {
    const ExpertOut& o = parts[i];
    if (o.w == nullptr || o.plan == nullptr || o.y == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": part ", i, " incomplete"));
    }
    if (o.w->w.n_cols != n_cols || o.plan->kernel != p0.kernel || o.plan->ksplit != p0.ksplit ||
        o.w->n_expert != parts[0].w->n_expert) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": part ", i, " differs from part 0 in columns (", o.w->w.n_cols, " vs ", n_cols,
          "), kernel, k-split or expert count"));
    }
    MatVecPart& pt = a.part[i];
    pt.w = static_cast<const uint8_t*>(o.w->w.data);
    pt.row_stride = o.w->w.row_stride;
    pt.n_rows = static_cast<int>(o.w->w.n_rows);
    pt.row_block0 = static_cast<int>(L.blocks);
    pt.y = o.y;
    L.expert_stride[i] = o.w->expert_stride;
    L.blocks += (o.w->w.n_rows + rows_per_cta - 1) / rows_per_cta;
  }
  if (L.blocks > kMaxGridY) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", L.blocks, " row blocks"));
  }
  L.n_expert = parts[0].w->n_expert;
  L.kernel = p0.kernel;
  L.ksplit = p0.ksplit;
  return L;
}

absl::Status NotCompiled(const char* who, const ExpertLaunch& L) {
  return absl::InvalidArgumentError(
      absl::StrCat(who, ": kernel ", MatVecKernelName(L.kernel), " with k-split ", L.ksplit, " is not compiled"));
}

}  // namespace

absl::Status ExpertMatVec(absl::Span<const ExpertOut> parts, const MoeActs& x, int n_cols,
                          int n_routes, int x_div, const int* ids, cudaStream_t stream, bool pdl) {
  constexpr const char* kWho = "expert matvec";
  if (ids == nullptr) return absl::InvalidArgumentError("expert matvec: no expert ids");
  if (parts.empty() || parts[0].plan == nullptr) return absl::InvalidArgumentError("expert matvec: no part 0");
  DPL_ASSIGN_OR_RETURN(const ExpertLaunch L, PrepareExperts(kWho, parts, x, n_cols, n_routes, x_div,
                                                            RowsPerCta(parts[0].plan->ksplit)));
  MoeMatVecArgs m;
  m.mv = L.a;
  std::copy(std::begin(L.expert_stride), std::end(L.expert_stride), std::begin(m.expert_stride));
  m.ids = ids;
  m.n_expert = L.n_expert;
  m.x_div = x_div;
  const ExpertFn fn = PickExpert<false>(L.kernel, L.ksplit);
  if (fn == nullptr) return NotCompiled(kWho, L);
  return LaunchKernel(fn, dim3(static_cast<unsigned>(n_routes), static_cast<unsigned>(L.blocks)),
                      dim3(32 * WarpsPerCta(L.ksplit)), 0, stream, pdl, m);
}

int64_t MoeMaxTiles(int64_t n_routes, int n_expert, int tile_routes) {
  return n_routes / tile_routes + std::min<int64_t>(n_expert, n_routes);
}

int MoeTileRoutes(int n_routes, int n_expert, MatVecKernel kernel, int n_cols) {
  if (!MatVecMmaSupports(kernel, n_cols)) return kMoeTileRoutes;
  const int mean = (n_routes + n_expert - 1) / n_expert;
  return mean <= 8 ? 8 : mean <= 16 ? 16 : mean <= 32 ? 32 : 64;
}

uint64_t MoeGroupsBytes(int max_routes, int n_expert) {
  const uint64_t tiles = static_cast<uint64_t>(MoeMaxTiles(max_routes, n_expert, kMoeTileRoutes));
  return Align256(sizeof(int)) + Align256(static_cast<uint64_t>(max_routes) * sizeof(int)) +
         Align256(3 * tiles * sizeof(int));
}

MoeGroups MoeGroupsIn(void* mem, int max_routes, int n_expert) {
  uint8_t* base = static_cast<uint8_t*>(mem);
  MoeGroups g;
  g.n_tiles = reinterpret_cast<int*>(base);
  g.order = reinterpret_cast<int*>(base + Align256(sizeof(int)));
  g.tiles = reinterpret_cast<int*>(base + Align256(sizeof(int)) +
                                   Align256(static_cast<uint64_t>(max_routes) * sizeof(int)));
  g.max_routes = max_routes;
  g.n_expert = n_expert;
  return g;
}

absl::Status RouteGroups(const int* ids, int n_routes, int tile_routes, const MoeGroups& groups,
                         cudaStream_t stream, bool pdl) {
  if (ids == nullptr || groups.n_tiles == nullptr || groups.order == nullptr || groups.tiles == nullptr) {
    return absl::InvalidArgumentError("route groups: null pointer");
  }
  if (n_routes <= 0 || n_routes > groups.max_routes || groups.n_expert < 1 ||
      groups.n_expert > kMoeMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat("route groups: ", n_routes, " routes of ", groups.n_expert,
                                                   " experts (the buffers hold ", groups.max_routes,
                                                   " routes, at most ", kMoeMaxExperts, " experts)"));
  }
  if (tile_routes < kMoeTileRoutes || tile_routes > kMmaMaxTokens || tile_routes % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("route groups: tiles of ", tile_routes, " routes"));
  }
  return LaunchKernel(RouteGroupsKernel, dim3(1), dim3(32), 0, stream, pdl, ids, n_routes, groups.n_expert,
                      tile_routes, groups.n_tiles, groups.order, groups.tiles);
}

absl::Status ExpertMatVecGrouped(absl::Span<const ExpertOut> parts, const MoeActs& x, int n_cols,
                                 int n_routes, int x_div, const MoeGroups& groups, int tile_routes,
                                 cudaStream_t stream, bool pdl) {
  constexpr const char* kWho = "grouped expert matvec";
  if (parts.empty() || parts[0].plan == nullptr) return absl::InvalidArgumentError("grouped expert matvec: no part 0");
  const MatVecKernel kernel = parts[0].plan->kernel;
  const bool mma = MatVecMmaSupports(kernel, n_cols);
  DPL_ASSIGN_OR_RETURN(const ExpertLaunch L,
                       PrepareExperts(kWho, parts, x, n_cols, n_routes, x_div,
                                      mma ? kMmaCtaRows : RowsPerCta(parts[0].plan->ksplit)));
  if (n_routes > groups.max_routes || groups.n_expert != L.n_expert || groups.n_tiles == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kWho, ": ", n_routes, " routes of ", L.n_expert,
                                                   " experts, groups for ", groups.max_routes, " of ",
                                                   groups.n_expert));
  }
  if (tile_routes != MoeTileRoutes(n_routes, L.n_expert, kernel, n_cols) && !(mma && tile_routes % 8 == 0 &&
                                                                               tile_routes >= 8 &&
                                                                               tile_routes <= kMmaMaxTokens)) {
    return absl::InvalidArgumentError(absl::StrCat(kWho, ": tiles of ", tile_routes, " routes for kernel ",
                                                   MatVecKernelName(kernel), " (", n_cols, " columns)"));
  }
  const int64_t grid = MoeMaxTiles(n_routes, L.n_expert, tile_routes);
  DPL_RETURN_IF_ERROR(CheckGridX(grid, kWho));
  if (mma) {
    // The int8 tensor-core form (matvec_mma.cu), a tile of up to 64 routes
    // a CTA: each expert's weights read once per tile for all its routes.
    MatVecArgs a = L.a;
    for (int i = 0; i < a.n_parts; ++i) a.part[i].splits = 1;
    MmaGroupArgs g;
    g.n_tiles = groups.n_tiles;
    g.order = groups.order;
    g.tiles = groups.tiles;
    std::copy(std::begin(L.expert_stride), std::end(L.expert_stride), std::begin(g.expert_stride));
    g.n_expert = L.n_expert;
    g.x_div = x_div;
    return LaunchMatVecMmaGrouped(kernel, a, L.blocks, g, tile_routes, grid, pdl, stream);
  }
  MoeGroupedArgs m;
  m.mv = L.a;
  std::copy(std::begin(L.expert_stride), std::end(L.expert_stride), std::begin(m.expert_stride));
  m.n_tiles = groups.n_tiles;
  m.order = groups.order;
  m.tiles = groups.tiles;
  m.n_expert = L.n_expert;
  m.x_div = x_div;
  const GroupedFn fn = PickExpert<true>(L.kernel, L.ksplit);
  if (fn == nullptr) return NotCompiled(kWho, L);
  return LaunchKernel(fn, dim3(static_cast<unsigned>(grid), static_cast<unsigned>(L.blocks)),
                      dim3(32 * WarpsPerCta(L.ksplit)), 0, stream, pdl, m);
}

absl::Status MoeCombine(const float* y, const float* weights, int n_rows, int k, int n_cols, float* x,
                        cudaStream_t stream, bool pdl) {
  if (n_rows <= 0 || k <= 0 || n_cols <= 0 || y == nullptr || weights == nullptr || x == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE combine: ", n_rows, " rows, k ", k, ", ", n_cols, " columns (or a null pointer)"));
  }
  const int64_t n = int64_t{n_rows} * n_cols;
  const int64_t grid = (n + kCombineThreads - 1) / kCombineThreads;
  DPL_RETURN_IF_ERROR(CheckGridX(grid, "MoE combine"));
  return LaunchKernel(MoeCombineKernel, dim3(static_cast<unsigned>(grid)), dim3(kCombineThreads), 0,
                      stream, pdl, y, weights, n, k, n_cols, x);
}

}  // namespace dpl::kernels
