#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_check.h"
#include "kernels/dequant.cuh"
#include "kernels/launch.cuh"
#include "kernels/ops/kv_cache.h"
#include "kernels/ops/ops.h"
#include "kernels/rope.cuh"

namespace dpl::kernels {
namespace {

using formats::GgmlType;
using formats::TensorLayout;

constexpr int kNormThreads = 256;

// Sum over the block; every thread gets the result. scratch: 32 floats.
__device__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / 32;
  float t = lane < n_warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// An activation stored as float32, or rounded to f16 (__float2half_rn: the
// bits ConvertToF16 gives the float32 value) for the tensor-core products.
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__half* p, float v) { *p = __float2half_rn(v); }

// y = x * w / sqrt(mean(x^2) + eps)
// One block per row; each thread owns the strided elements i = tid + k * 256
// in both passes, so it re-reads only what it read itself.
template <class Out>
__global__ void RmsNormKernel(const float* x,  // (n_rows, n)
                              const float* w,  // (n)
                              Out* y,          // (n_rows, n)
                              int n, float eps) {
  __shared__ float scratch[32];
  const size_t row = blockIdx.x;
  const float* xr = x + row * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i];
    ss += v * v;
  }
  ss = BlockSum(ss, scratch);
  // IEEE sqrt and division (not rsqrtf) keep the scale within 1 ulp.
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  Out* yr = y + row * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) Store(yr + i, (xr[i] * scale) * w[i]);
}

// out = g / (1 + exp(-g)) * up
template <class Out>
__global__ void SwiGluKernel(const float* gate, const float* up, Out* out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float g = gate[i];
    Store(out + i, g / (1.0f + expf(-g)) * up[i]);
  }
}

int ElementwiseBlocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

// Blocks x in [0, n_head): rotate q head x in place. Blocks [n_head, n_head +
// n_head_kv): rotate k head j, write it (f16) to k_cache[row] and v head j
// to v_cache[row], row = KvRowOffset(pages, seq, n_head_kv, n_ctx, j, pos,
// head_dim) (kernels/kv_pages.h: regions ((seq n_head_kv + j) n_ctx + pos)
// head_dim; pages: one table load, block tables[seq max_blocks + (pos >>
// block_shift)]). With a norm weight (qwen3), each head is first RMS-normed:
// x = x * w / sqrt(mean(x^2) + eps) over its head_dim values.
// Thread i handles rotation pair i (< n_rot / 2), then the pass-through
// elements [n_rot, head_dim) in a strided loop.
// blockIdx.y = token t of the batch: q, k, v and d_pos advanced to row t.
__global__ void RopeKvKernel(RopeKvShape sh, bool neox, const int* d_pos,  // (n_tokens)
                             const int* d_seq,        // (n_tokens) or null
                             const double* inv_freq,  // (n_rot / 2)
                             HeadNorms norms,
                             float* q,                // (n_tokens, n_head, head_dim)
                             const float* k,          // (n_tokens, n_head_kv, head_dim)
                             const float* v,          // (n_tokens, n_head_kv, head_dim)
                             __half* k_cache,         // regions (n_seq, n_head_kv, n_ctx, head_dim);
                             __half* v_cache,         // pages (n_blocks, n_head_kv, block, head_dim)
                             KvPages pages) {         // tables (n_seq, max_blocks), or null: regions
  __shared__ float scratch[32];
  GridDependencyWait();
  GridLaunchDependents();
  const int t = blockIdx.y;
  const int pos = d_pos[t];
  const int seq = d_seq != nullptr ? max(d_seq[t], 0) : 0;
  const size_t q_row = static_cast<size_t>(t) * sh.n_head * sh.head_dim;
  const size_t kv_row = static_cast<size_t>(t) * sh.n_head_kv * sh.head_dim;
  q += q_row;
  k += kv_row;
  v += kv_row;
  const int hd = sh.head_dim, half_rot = sh.n_rot / 2;
  const int i = threadIdx.x;
  const bool is_q = blockIdx.x < sh.n_head;
  const int head = is_q ? blockIdx.x : blockIdx.x - sh.n_head;
  const bool write_cache = !is_q && pos >= 0 && pos < sh.n_ctx;
  // Paged: no table load for a q head or a position that writes nothing.
  const uint64_t cache_row =
      write_cache ? KvRowOffset(pages, seq, sh.n_head_kv, sh.n_ctx, head, pos, hd) : 0;
  const float* src = is_q ? q + static_cast<size_t>(head) * hd : k + static_cast<size_t>(head) * hd;
  const int i0 = neox ? i : 2 * i;
  const int i1 = neox ? i + half_rot : 2 * i + 1;
  float x0 = 0.f, x1 = 0.f;
  if (i < half_rot) x0 = src[i0], x1 = src[i1];
  // The head's RMSNorm scale (every thread takes part in the sum).
  const float* nw = is_q ? norms.q : norms.k;  // (head_dim) or null
  float scale = 1.0f;
  if (nw != nullptr) {
    float ss = x0 * x0 + x1 * x1;
    for (int e = sh.n_rot + i; e < hd; e += blockDim.x) ss += src[e] * src[e];
    ss = BlockSum(ss, scratch);
    // IEEE sqrt and division (not rsqrtf), as RmsNorm.
    scale = 1.0f / sqrtf(ss / static_cast<float>(hd) + norms.eps);
  }
  auto normed = [&](float x, int e) { return nw != nullptr ? (x * scale) * nw[e] : x; };
  if (i < half_rot) {
    double s, c, r0, r1;
    RopeSinCos(pos, inv_freq[i], &s, &c);
    RopeApply(normed(x0, i0), normed(x1, i1), s, c, &r0, &r1);
    if (is_q) {
      // In place: each pair is read and written by this thread only.
      q[static_cast<size_t>(head) * hd + i0] = static_cast<float>(r0);
      q[static_cast<size_t>(head) * hd + i1] = static_cast<float>(r1);
    } else if (write_cache) {
      k_cache[cache_row + i0] = __double2half(r0);
      k_cache[cache_row + i1] = __double2half(r1);
    }
  }
  if (is_q) {
    if (nw != nullptr) {  // pass-through elements, normed in place (read above, by this thread)
      for (int e = sh.n_rot + i; e < hd; e += blockDim.x) {
        q[static_cast<size_t>(head) * hd + e] = normed(src[e], e);
      }
    }
    return;
  }
  if (!write_cache) return;
  for (int e = sh.n_rot + i; e < hd; e += blockDim.x) {
    k_cache[cache_row + e] = __float2half_rn(normed(src[e], e));
  }
  const float* vr = v + static_cast<size_t>(head) * hd;
  for (int e = i; e < hd; e += blockDim.x) v_cache[cache_row + e] = __float2half_rn(vr[e]);
}

// ---- embedding row gather (kernels/dequant.cuh) ----

// out[t][j] = dequant(table[d_tokens[t]])[j]; blockIdx.y = token t. Block
// formats: one thread per 8 columns (DeviceFormat::Load8, the prompt GEMM's
// dequant); float formats: one per column.
template <GgmlType kType, bool kDpl>
__global__ void EmbedKernel(const uint8_t* table,  // (n_rows, row_stride) bytes
                            uint64_t row_stride, int64_t n_rows, int64_t n_cols,
                            const int* d_tokens,   // (n_tokens)
                            float* out) {          // (n_tokens, n_cols)
  constexpr bool kFloat = IsFloatFormat(kType);
  constexpr int kPer = kFloat ? 1 : 8;
  const int token = d_tokens[blockIdx.y];
  out += blockIdx.y * n_cols;
  const bool bad = token < 0 || token >= n_rows;
  const uint8_t* row = table + static_cast<uint64_t>(bad ? 0 : token) * row_stride;
  for (int64_t j = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * kPer; j < n_cols;
       j += (int64_t)gridDim.x * blockDim.x * kPer) {
    if (bad) {
      for (int i = 0; i < kPer; ++i) out[j + i] = __int_as_float(0x7fc00000);
    } else if constexpr (kFloat) {
      out[j] = FloatElem<kType>(row, j);
    } else {
      float v[8];
      DeviceFormat<kType, kDpl>::Load8(row, j, n_cols, v);
      for (int i = 0; i < 8; ++i) out[j + i] = v[i];
    }
  }
}

template <GgmlType kType, bool kDpl>
absl::Status LaunchEmbed(const WeightMatrix& t, const int* d_token, int n_tokens, float* out,
                         cudaStream_t s) {
  if constexpr (!IsFloatFormat(kType)) {
    constexpr int kAlign = DeviceFormat<kType, kDpl>::kRowAlign;
    if (reinterpret_cast<uintptr_t>(t.data) % kAlign != 0 || t.row_stride % kAlign != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EmbedRows: ", formats::TraitsOf(kType).name, " table rows must be ", kAlign,
          "-byte aligned (data and row_stride)"));
    }
  }
  const int threads = 256;
  const int64_t per_block = threads * (IsFloatFormat(kType) ? 1 : 8);
  const dim3 grid(static_cast<unsigned>((t.n_cols + per_block - 1) / per_block), n_tokens);
  EmbedKernel<kType, kDpl><<<grid, threads, 0, s>>>(static_cast<const uint8_t*>(t.data),
                                                   t.row_stride, t.n_rows, t.n_cols, d_token,
                                                   out);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

}  // namespace

absl::Status RmsNorm(const float* x, const float* w, float* y, int n_rows, int n, float eps,
                     cudaStream_t stream) {
  if (n_rows <= 0 || n <= 0 || !x || !w || !y) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNorm: bad shape or null pointer (n_rows=", n_rows, ", n=", n, ")"));
  }
  RmsNormKernel<<<n_rows, kNormThreads, 0, stream>>>(x, w, y, n, eps);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

absl::Status RmsNormF16(const float* x, const float* w, uint16_t* y, int n_rows, int n, float eps,
                        cudaStream_t stream) {
  if (n_rows <= 0 || n <= 0 || !x || !w || !y) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormF16: bad shape or null pointer (n_rows=", n_rows, ", n=", n, ")"));
  }
  RmsNormKernel<<<n_rows, kNormThreads, 0, stream>>>(x, w, reinterpret_cast<__half*>(y), n, eps);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n,
                    cudaStream_t stream) {
  if (n <= 0 || !gate || !up || !out) {
    return absl::InvalidArgumentError(absl::StrCat("SwiGlu: bad size ", n, " or null pointer"));
  }
  SwiGluKernel<<<ElementwiseBlocks(n, 256), 256, 0, stream>>>(gate, up, out, n);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

absl::Status SwiGluF16(const float* gate, const float* up, uint16_t* out, int64_t n,
                       cudaStream_t stream) {
  if (n <= 0 || !gate || !up || !out) {
    return absl::InvalidArgumentError(absl::StrCat("SwiGluF16: bad size ", n, " or null pointer"));
  }
  SwiGluKernel<<<ElementwiseBlocks(n, 256), 256, 0, stream>>>(gate, up, reinterpret_cast<__half*>(out), n);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

__global__ void RopeTableKernel(const int* d_pos, const double* inv_freq, int n_half,
                                double2* cos_sin) {  // (n_half): (cos, sin)
  GridDependencyWait();
  GridLaunchDependents();
  const int j = threadIdx.x;
  if (j >= n_half) return;
  double s, c;
  RopeSinCos(d_pos[0], inv_freq[j], &s, &c);
  cos_sin[j] = make_double2(c, s);
}

absl::Status RopeTable(const int* d_pos, const double* inv_freq, int n_half, double* cos_sin,
                       cudaStream_t stream, bool pdl) {
  if (!d_pos || !inv_freq || !cos_sin || n_half <= 0 || n_half > 512) {
    return absl::InvalidArgumentError(absl::StrCat("RopeTable: n_half ", n_half, " or a null pointer"));
  }
  return LaunchKernel(RopeTableKernel, dim3(1), dim3(((n_half + 31) / 32) * 32), 0, stream, pdl,
                      d_pos, inv_freq, n_half, reinterpret_cast<double2*>(cos_sin));
}

absl::Status RopeWriteKv(const RopeKvShape& sh, RopeStyle style, const int* d_pos,
                         const double* inv_freq, const HeadNorms& norms, float* q, const float* k,
                         const float* v, uint16_t* k_cache, uint16_t* v_cache, int n_tokens,
                         cudaStream_t stream, bool pdl, const int* d_seq, const KvPages& pages) {
  if (sh.n_head <= 0 || sh.n_head_kv <= 0 || sh.head_dim <= 0 || sh.head_dim % 2 != 0 ||
      sh.head_dim > 256 || sh.n_rot <= 0 || sh.n_rot % 2 != 0 || sh.n_rot > sh.head_dim ||
      sh.n_ctx <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RopeWriteKv: bad shape n_head=", sh.n_head, " n_head_kv=", sh.n_head_kv,
        " head_dim=", sh.head_dim, " n_rot=", sh.n_rot, " n_ctx=", sh.n_ctx));
  }
  if (!d_pos || !inv_freq || !q || !k || !v || !k_cache || !v_cache) {
    return absl::InvalidArgumentError("RopeWriteKv: null pointer");
  }
  if ((norms.q == nullptr) != (norms.k == nullptr)) {
    return absl::InvalidArgumentError("RopeWriteKv: a q norm without a k norm, or the reverse");
  }
  if (n_tokens <= 0 || n_tokens > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("RopeWriteKv: n_tokens ", n_tokens, " is outside [1, 65535]"));
  }
  DPL_RETURN_IF_ERROR(CheckKvPages(pages, sh.n_ctx, "RopeWriteKv"));
  const int threads = ((sh.head_dim / 2 + 31) / 32) * 32;
  const dim3 grid(sh.n_head + sh.n_head_kv, n_tokens);
  return LaunchKernel(RopeKvKernel, grid, dim3(threads), 0, stream, pdl, sh,
                      style == RopeStyle::kNeox, d_pos, d_seq, inv_freq, norms, q, k, v,
                      reinterpret_cast<__half*>(k_cache), reinterpret_cast<__half*>(v_cache), pages);
}

absl::Status EmbedRows(const WeightMatrix& t, const int* d_token, int n_tokens, float* out,
                       cudaStream_t stream) {
  if (n_tokens <= 0 || n_tokens > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbedRows: n_tokens ", n_tokens, " is outside [1, 65535]"));
  }
  const auto traits = formats::TraitsOf(t.type);
  if (!t.data || !d_token || !out || t.n_rows <= 0 || t.n_cols <= 0 ||
      t.n_cols % traits.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EmbedRows: bad table (", traits.name, ", n_rows=", t.n_rows, ", n_cols=", t.n_cols,
        ") or null pointer"));
  }
  const int64_t stride_min = static_cast<int64_t>(formats::LayoutRowStride(
      t.layout, static_cast<uint64_t>(t.n_cols / traits.block_elems), traits.block_bytes));
  if (t.row_stride < stride_min) {
    return absl::InvalidArgumentError(absl::StrCat("EmbedRows: row_stride ", t.row_stride, " < ",
                                                   stride_min, " bytes of a ", traits.name, " (",
                                                   formats::TensorLayoutName(t.layout), ") row"));
  }
  return VisitDeviceFormat(t.type, t.layout, "EmbedRows", [&](auto type, auto dpl) {
    return LaunchEmbed<decltype(type)::value, decltype(dpl)::value>(t, d_token, n_tokens, out, stream);
  });
}

}  // namespace dpl::kernels
