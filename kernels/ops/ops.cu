#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/ops/ops.h"

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

// y = x * w / sqrt(mean(x^2) + eps)
// One block per row; each thread owns the strided elements i = tid + k * 256
// in both passes, so it re-reads only what it read itself.
__global__ void RmsNormKernel(const float* x,  // (n_rows, n)
                              const float* w,  // (n)
                              float* y,        // (n_rows, n)
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
  float* yr = y + row * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
}

// out = g / (1 + exp(-g)) * up
__global__ void SwiGluKernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

int ElementwiseBlocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

// Rotation of one (x0, x1) pair by theta = pos * inv_freq, all in float64.
__device__ __forceinline__ void Rotate(double x0, double x1, double theta, double* r0,
                                       double* r1) {
  double s, c;
  sincos(theta, &s, &c);
  *r0 = x0 * c - x1 * s;
  *r1 = x0 * s + x1 * c;
}

// Blocks [0, n_head): rotate q head b in place. Blocks [n_head, n_head +
// n_head_kv): rotate k head j, write it (f16) to k_cache[j][pos] and v head j
// to v_cache[j][pos]. Thread i handles rotation pair i (< n_rot / 2), then the
// pass-through elements [n_rot, head_dim) in a strided loop.
__global__ void RopeKvKernel(RopeKvShape sh, bool neox, const int* d_pos,
                             const double* inv_freq,  // (n_rot / 2)
                             float* q,                // (n_head, head_dim)
                             const float* k,          // (n_head_kv, head_dim)
                             const float* v,          // (n_head_kv, head_dim)
                             __half* k_cache,         // (n_head_kv, n_ctx, head_dim)
                             __half* v_cache) {       // (n_head_kv, n_ctx, head_dim)
  const int pos = *d_pos;
  const int hd = sh.head_dim, half_rot = sh.n_rot / 2;
  const int i = threadIdx.x;
  const bool is_q = blockIdx.x < sh.n_head;
  const int head = is_q ? blockIdx.x : blockIdx.x - sh.n_head;
  const bool write_cache = !is_q && pos >= 0 && pos < sh.n_ctx;
  const size_t cache_row = (static_cast<size_t>(head) * sh.n_ctx + (write_cache ? pos : 0)) * hd;
  const float* src = is_q ? q + static_cast<size_t>(head) * hd : k + static_cast<size_t>(head) * hd;
  if (i < half_rot) {
    const int i0 = neox ? i : 2 * i;
    const int i1 = neox ? i + half_rot : 2 * i + 1;
    double r0, r1;
    Rotate(src[i0], src[i1], static_cast<double>(pos) * inv_freq[i], &r0, &r1);
    if (is_q) {
      // In place: each pair is read and written by this thread only.
      q[static_cast<size_t>(head) * hd + i0] = static_cast<float>(r0);
      q[static_cast<size_t>(head) * hd + i1] = static_cast<float>(r1);
    } else if (write_cache) {
      k_cache[cache_row + i0] = __double2half(r0);
      k_cache[cache_row + i1] = __double2half(r1);
    }
  }
  if (!write_cache) return;
  for (int e = sh.n_rot + i; e < hd; e += blockDim.x) k_cache[cache_row + e] = __float2half_rn(src[e]);
  const float* vr = v + static_cast<size_t>(head) * hd;
  for (int e = i; e < hd; e += blockDim.x) v_cache[cache_row + e] = __float2half_rn(vr[e]);
}

// ---- embedding row gather: one device dequant per element ----
// Byte loads everywhere: q8_0 (34 B) and q5_0 (22 B) blocks are not aligned.
__device__ __forceinline__ float LoadF16(const uint8_t* p) {
  const unsigned short bits = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}

// Element j of one row. __fmul_rn / __fsub_rn forbid FMA contraction so the
// float32 rounding steps match formats/dequant.cc exactly.
template <GgmlType kType, bool kDpl>
__device__ float DequantElem(const uint8_t* row, int64_t j, int64_t n_cols) {
  if constexpr (kType == GgmlType::kF32) {
    return reinterpret_cast<const float*>(row)[j];
  } else if constexpr (kType == GgmlType::kF16) {
    return LoadF16(row + 2 * j);
  } else if constexpr (kType == GgmlType::kBF16) {
    const uint32_t bits = row[2 * j] | (row[2 * j + 1] << 8);
    return __uint_as_float(bits << 16);
  } else if constexpr (kType == GgmlType::kQ8_0) {
    const uint8_t* b = row + (j / 32) * 34;
    return __fmul_rn(LoadF16(b), static_cast<float>(static_cast<int8_t>(b[2 + j % 32])));
  } else if constexpr (kType == GgmlType::kQ5_0) {
    // w = d * (q - 16); q = nibble | fifth bit from qh (bit e of the u32).
    const uint8_t* b = row + (j / 32) * 22;
    const int e = static_cast<int>(j % 32), jj = e & 15;
    const uint32_t qh = b[2] | (b[3] << 8) | (b[4] << 16) | (static_cast<uint32_t>(b[5]) << 24);
    const int nib = e < 16 ? (b[6 + jj] & 0xF) : (b[6 + jj] >> 4);
    const int q = nib | (((qh >> e) & 1) << 4);
    return __fmul_rn(LoadF16(b), static_cast<float>(q - 16));
  } else if constexpr (kType == GgmlType::kQ4_K) {
    // w = (d * sc) * q - (dmin * m), sub-block s = e / 32, chunk e / 64.
    const uint8_t* b = row + (j / 256) * 144;
    const int e = static_cast<int>(j % 256), s = e / 32;
    const uint8_t* sc8 = b + 4;
    int sc, m;
    if (s < 4) {
      sc = sc8[s] & 63;
      m = sc8[s + 4] & 63;
    } else {
      sc = (sc8[s + 4] & 0xF) | ((sc8[s - 4] >> 6) << 4);
      m = (sc8[s + 4] >> 4) | ((sc8[s] >> 6) << 4);
    }
    const int q = (b[16 + 32 * (e / 64) + e % 32] >> ((s & 1) * 4)) & 0xF;
    const float dl = __fmul_rn(LoadF16(b), static_cast<float>(sc));
    const float ml = __fmul_rn(LoadF16(b + 2), static_cast<float>(m));
    return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
  } else {  // q6_K, raw 210-byte blocks or dpl planes
    // Half hf = e / 128; quarter t = (e % 128) / 32; l = e % 32:
    //   q = ((ql[64hf + l + 32(t&1)] >> 4(t>>1)) & 0xF) | ((qh[32hf + l] >> 2t) & 3) << 4
    //   w = (d * sc[8hf + l/16 + 2t]) * (q - 32)
    const int64_t blk = j / 256;
    const int e = static_cast<int>(j % 256);
    const uint8_t *ql, *qh, *sc, *d;
    if constexpr (kDpl) {
      const formats::Q6KPlanes pl = formats::Q6KDplPlanes(n_cols / 256);
      ql = row + pl.ql + blk * formats::kQ6KQlBytes;
      qh = row + pl.qh + blk * formats::kQ6KQhBytes;
      sc = row + pl.sc + blk * formats::kQ6KScBytes;
      d = row + pl.d + blk * formats::kQ6KDBytes;
    } else {
      const uint8_t* b = row + blk * formats::kQ6KBlockBytes;
      ql = b + formats::kQ6KQlOffset;
      qh = b + formats::kQ6KQhOffset;
      sc = b + formats::kQ6KScOffset;
      d = b + formats::kQ6KDOffset;
    }
    const int hf = e / 128, t = (e % 128) / 32, l = e % 32;
    const int lo = (ql[64 * hf + l + 32 * (t & 1)] >> (4 * (t >> 1))) & 0xF;
    const int hi = (qh[32 * hf + l] >> (2 * t)) & 3;
    const int q = (lo | (hi << 4)) - 32;
    const float ds = __fmul_rn(LoadF16(d), static_cast<float>(static_cast<int8_t>(sc[8 * hf + l / 16 + 2 * t])));
    return __fmul_rn(ds, static_cast<float>(q));
  }
}

// out[j] = dequant(table[*d_token])[j]
template <GgmlType kType, bool kDpl>
__global__ void EmbedKernel(const uint8_t* table,  // (n_rows, row_stride) bytes
                            uint64_t row_stride, int64_t n_rows, int64_t n_cols,
                            const int* d_token, float* out) {  // out: (n_cols)
  const int token = *d_token;
  if (token < 0 || token >= n_rows) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n_cols;
         j += (int64_t)gridDim.x * blockDim.x) {
      out[j] = __int_as_float(0x7fc00000);
    }
    return;
  }
  const uint8_t* row = table + static_cast<uint64_t>(token) * row_stride;
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n_cols;
       j += (int64_t)gridDim.x * blockDim.x) {
    out[j] = DequantElem<kType, kDpl>(row, j, n_cols);
  }
}

template <GgmlType kType, bool kDpl>
absl::Status LaunchEmbed(const WeightMatrix& t, const int* d_token, float* out, cudaStream_t s) {
  const int threads = 256;
  const int blocks = static_cast<int>((t.n_cols + threads - 1) / threads);
  EmbedKernel<kType, kDpl><<<blocks, threads, 0, s>>>(static_cast<const uint8_t*>(t.data),
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

absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n,
                    cudaStream_t stream) {
  if (n <= 0 || !gate || !up || !out) {
    return absl::InvalidArgumentError(absl::StrCat("SwiGlu: bad size ", n, " or null pointer"));
  }
  SwiGluKernel<<<ElementwiseBlocks(n, 256), 256, 0, stream>>>(gate, up, out, n);
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

absl::Status RopeWriteKv(const RopeKvShape& sh, RopeStyle style, const int* d_pos,
                         const double* inv_freq, float* q, const float* k, const float* v,
                         uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream) {
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
  const int threads = ((sh.head_dim / 2 + 31) / 32) * 32;
  RopeKvKernel<<<sh.n_head + sh.n_head_kv, threads, 0, stream>>>(
      sh, style == RopeStyle::kNeox, d_pos, inv_freq, q, k, v,
      reinterpret_cast<__half*>(k_cache), reinterpret_cast<__half*>(v_cache));
  DPL_CUDA_CHECK_LAUNCH();
  return absl::OkStatus();
}

absl::Status EmbedRow(const WeightMatrix& t, const int* d_token, float* out,
                      cudaStream_t stream) {
  const auto traits = formats::TraitsOf(t.type);
  if (!t.data || !d_token || !out || t.n_rows <= 0 || t.n_cols <= 0 ||
      t.n_cols % traits.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EmbedRow: bad table (", traits.name, ", n_rows=", t.n_rows, ", n_cols=", t.n_cols,
        ") or null pointer"));
  }
  const int64_t min_stride = t.n_cols / traits.block_elems * traits.block_bytes;
  if (t.row_stride < min_stride) {
    return absl::InvalidArgumentError(absl::StrCat("EmbedRow: row_stride ", t.row_stride,
                                                   " < ", min_stride, " bytes of a ",
                                                   traits.name, " row"));
  }
  if (t.layout == TensorLayout::kDplQ6K) {
    if (t.type != GgmlType::kQ6_K) {
      return absl::InvalidArgumentError(
          absl::StrCat("EmbedRow: layout dpl_q6k holds only q6_K, not ", traits.name));
    }
    return LaunchEmbed<GgmlType::kQ6_K, true>(t, d_token, out, stream);
  }
  switch (t.type) {
    case GgmlType::kF32: return LaunchEmbed<GgmlType::kF32, false>(t, d_token, out, stream);
    case GgmlType::kF16: return LaunchEmbed<GgmlType::kF16, false>(t, d_token, out, stream);
    case GgmlType::kBF16: return LaunchEmbed<GgmlType::kBF16, false>(t, d_token, out, stream);
    case GgmlType::kQ8_0: return LaunchEmbed<GgmlType::kQ8_0, false>(t, d_token, out, stream);
    case GgmlType::kQ5_0: return LaunchEmbed<GgmlType::kQ5_0, false>(t, d_token, out, stream);
    case GgmlType::kQ4_K: return LaunchEmbed<GgmlType::kQ4_K, false>(t, d_token, out, stream);
    case GgmlType::kQ6_K: return LaunchEmbed<GgmlType::kQ6_K, false>(t, d_token, out, stream);
    default:
      return absl::UnimplementedError(
          absl::StrCat("EmbedRow: no device dequant for type ", traits.name));
  }
}

}  // namespace dpl::kernels
