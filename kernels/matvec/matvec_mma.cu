// Quantized weights times a few tokens on the int8 tensor cores: for 2 to
// kMmaMaxTokens tokens (a batched decode step, a short prompt chunk),
//   y[t, r] = sum_blocks W[r] . x[t] (+ bias[r]) (+ residual[t, r])
// with the same math as the dp4a kernels (matvec_traits.cuh): integer dots
// of the weights' quants with the int8 activation blocks, scaled per
// sub-block in float. Here the integer dots of 16 rows x 8 tokens come from
// one mma.sync, so every weight byte is read and decoded once for all the
// tokens. The dp4a token tile decodes and scales per token (7B ffn_gate at 8
// tokens: ~120 us, 7x one token's 17 us); this path takes 35 us there, 46 at
// 16, and loses to dequantize + GEMM (~96) from ~24 tokens (gemm_bench,
// docs/PERF.md): each warp re-reads the activations and their scales, which
// is what to change next.
//
// CTA: KW warps (4, or 8 for long rows) over the same 16 rows (one m16
// tile), warp w taking the 256-weight blocks w, w + KW, ... of every row (a
// k-split: rows are few per CTA so that mid-size matrices still fill the
// GPU; q4_K loads each block one ahead of its use), then the warps' partial
// sums added in warp order through shared memory (deterministic).
// Each warp holds NT n8 token tiles (8 NT >= n_tokens).
//
// Fragments (PTX ISA, mma .s8): lane = 4 g + t.
//   m16n8k32  A: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]
//             B: b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]
//   m16n8k16  A: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..];  B: b0 = B[4t..4t+3][g]
//   C (both): c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// The k order inside one mma is free as long as A and B use the same one:
// for q4_K, logical k 4t..4t+3 and 16+4t..16+4t+3 are the sub-block's
// columns 8t..8t+7, so a thread's weights and activations are each one
// 8-byte load.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/block_row.cuh"
#include "kernels/cuda_check.h"
#include "kernels/launch.cuh"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/matvec/matvec_traits.cuh"

namespace dpl::kernels {
namespace {

// Warps per CTA (the k-split): 4, or 8 for rows of 32 blocks or more
// (ffn_down: 74), whose few row blocks (224 for 3584 rows) would otherwise
// leave the SMs with too few warps in flight.
constexpr int kMmaWarpsLongRows = 8;
constexpr int kMmaLongRowBlocks = 32;

// c += A (16x32 s8) B (32x8 s8). Not volatile: a pure function of its
// operands, which the compiler may schedule around the loads.
__device__ __forceinline__ void Mma16832(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += A (16x16 s8) B (16x8 s8)
__device__ __forceinline__ void Mma16816(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

// 6-bit scale and min of q4_K sub-block j from the block header's scale
// bytes s[0..11] (hdr.y, hdr.z, hdr.w): see KScaledSum.
__device__ __forceinline__ void Q4KScaleMin(const uint4& hdr, int j, float* sc, float* m) {
  const uint32_t s[12] = {Byte(hdr.y, 0), Byte(hdr.y, 1), Byte(hdr.y, 2), Byte(hdr.y, 3),
                          Byte(hdr.z, 0), Byte(hdr.z, 1), Byte(hdr.z, 2), Byte(hdr.z, 3),
                          Byte(hdr.w, 0), Byte(hdr.w, 1), Byte(hdr.w, 2), Byte(hdr.w, 3)};
  if (j < 4) {
    *sc = static_cast<float>(s[j] & 63);
    *m = static_cast<float>(s[j + 4] & 63);
  } else {
    *sc = static_cast<float>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<float>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// The activations of one launch, per token: int8 values and per-32 scales.
struct Acts {
  const int8_t* q;  // (n_tokens, n_cols)
  const float* d;   // (n_tokens, n_cols / 32)
  const float* s;   // (n_tokens, n_cols / 32) d * sum(q)
  int n_cols, nb, n_tokens;
};

// Per n-tile accumulators of one thread: rows g, g + 8 x tokens 2t, 2t + 1.
template <int NT>
struct Acc {
  float v[NT][4];
};

// q4_K (raw 144-byte blocks): block kb of rows w0 (row g) and w1 (row g+8).
//   y += d sc_j xd_j dot(q_j, xq_j) - dmin m_j xs_j   per sub-block j of 32
// This thread's bytes of one block: both headers, and 8 quant bytes of each
// 32-byte chunk per row (loaded one block ahead: Q4KLoad, then Q4KBlock).
struct Q4KRegs {
  uint4 h0, h1;
  uint2 q0[4], q1[4];
};

__device__ __forceinline__ Q4KRegs Q4KLoad(const uint8_t* w0, const uint8_t* w1, int kb, int t) {
  const uint8_t* b0 = w0 + static_cast<int64_t>(kb) * 144;
  const uint8_t* b1 = w1 + static_cast<int64_t>(kb) * 144;
  Q4KRegs r;
  r.h0 = LdW16Span(b0);
  r.h1 = LdW16Span(b1);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    r.q0[c] = LdW8(b0 + 16 + 32 * c + 8 * t);
    r.q1[c] = LdW8(b1 + 16 + 32 * c + 8 * t);
  }
  return r;
}

template <int NT>
__device__ __forceinline__ void Q4KBlock(const Q4KRegs& r, int kb, const Acts& x, int tok0, int g,
                                         int t, Acc<NT>& acc) {
  const uint4 &h0 = r.h0, &h1 = r.h1;
  const uint2 *q0 = r.q0, *q1 = r.q1;
  const float d0 = Half(h0.x & 0xFFFFu), dm0 = Half(h0.x >> 16);
  const float d1 = Half(h1.x & 0xFFFFu), dm1 = Half(h1.x >> 16);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    // The chunk's two sub-blocks j = 2c (low nibbles), 2c + 1 (high): their
    // activation scales are adjacent, one 8-byte load per token and array.
    const int xb = kb * 8 + 2 * c;
    float2 xd[NT][2], xs[NT][2];  // [tile][token ta, ta + 1] -> (sub-block 2c, 2c + 1)
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ta = tok0 + 8 * n + 2 * t + e;
        xd[n][e] = xs[n][e] = make_float2(0.f, 0.f);
        if (ta < x.n_tokens) {
          xd[n][e] = *reinterpret_cast<const float2*>(x.d + ta * x.nb + xb);
          xs[n][e] = *reinterpret_cast<const float2*>(x.s + ta * x.nb + xb);
        }
      }
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int j = 2 * c + hi, sh = 4 * hi;
      const uint32_t a0 = (q0[c].x >> sh) & 0x0F0F0F0Fu, a2 = (q0[c].y >> sh) & 0x0F0F0F0Fu;
      const uint32_t a1 = (q1[c].x >> sh) & 0x0F0F0F0Fu, a3 = (q1[c].y >> sh) & 0x0F0F0F0Fu;
      float sc0, m0, sc1, m1;
      Q4KScaleMin(h0, j, &sc0, &m0);
      Q4KScaleMin(h1, j, &sc1, &m1);
      const float ds0 = d0 * sc0, ds1 = d1 * sc1, mm0 = dm0 * m0, mm1 = dm1 * m1;
      const int col = kb * 256 + 32 * j;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int tb = tok0 + 8 * n + g;  // this lane's B column (token)
        uint2 bx = make_uint2(0, 0);
        if (tb < x.n_tokens) {
          bx = *reinterpret_cast<const uint2*>(x.q + static_cast<int64_t>(tb) * x.n_cols + col + 8 * t);
        }
        int c4[4] = {0, 0, 0, 0};
        Mma16832(c4, a0, a1, a2, a3, bx.x, bx.y);
        // C columns: tokens ta = tok0 + 8n + 2t and ta + 1.
        const float xda = hi ? xd[n][0].y : xd[n][0].x, xdb = hi ? xd[n][1].y : xd[n][1].x;
        const float xsa = hi ? xs[n][0].y : xs[n][0].x, xsb = hi ? xs[n][1].y : xs[n][1].x;
        float* v = acc.v[n];
        v[0] = fmaf(static_cast<float>(c4[0]), ds0 * xda, v[0]) - mm0 * xsa;
        v[1] = fmaf(static_cast<float>(c4[1]), ds0 * xdb, v[1]) - mm0 * xsb;
        v[2] = fmaf(static_cast<float>(c4[2]), ds1 * xda, v[2]) - mm1 * xsa;
        v[3] = fmaf(static_cast<float>(c4[3]), ds1 * xdb, v[3]) - mm1 * xsb;
      }
    }
  }
}

// q6_K, dpl rows (kDpl: planes ql | qh | sc | d, 16-byte aligned) or raw
// 210-byte blocks (fields 2-byte aligned: LdWords2); the same words either
// way, so both layouts give the same bits (as Q6K<kDpl> in matvec_traits):
//   y += d sc_s xd_b dot(q_s - 32, xq_s)   per sub-block s of 16 (k16 mma)
// Sub-block s = 8h + 2q + seg covers, within half h, columns 32q + 16seg ..
// +15; its quants come from ql[64h + 32 (q & 1) + l] nibble q >> 1 and
// qh[32h + l] bits 2q, 2q + 1, l = 16seg + 4t .. +3 for this thread.
template <bool kDpl>
struct Q6KBlockPtrs {
  const uint8_t *ql, *qh, *sc, *d;
  __device__ Q6KBlockPtrs(const uint8_t* row, int kb, int nbe) {
    using namespace formats;
    if constexpr (kDpl) {
      const Q6KPlanes pl = Q6KDplPlanes(nbe);
      ql = row + pl.ql + static_cast<int64_t>(kb) * kQ6KQlBytes;
      qh = row + pl.qh + static_cast<int64_t>(kb) * kQ6KQhBytes;
      sc = row + pl.sc + static_cast<int64_t>(kb) * kQ6KScBytes;
      d = row + pl.d + static_cast<int64_t>(kb) * kQ6KDBytes;
    } else {
      const uint8_t* blk = row + static_cast<int64_t>(kb) * kQ6KBlockBytes;
      ql = blk + kQ6KQlOffset;
      qh = blk + kQ6KQhOffset;
      sc = blk + kQ6KScOffset;
      d = blk + kQ6KDOffset;
    }
  }
  __device__ uint32_t Word(const uint8_t* p) const {
    if constexpr (kDpl) {
      return *reinterpret_cast<const uint32_t*>(p);
    } else {
      uint32_t w[1];
      LdWords2<1>(p, w);
      return w[0];
    }
  }
  __device__ void Scales(uint32_t (&w)[4]) const {
    if constexpr (kDpl) {
      const uint4 v = LdW16(sc);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      LdWords2<4>(sc, w);
    }
  }
};

template <bool kDpl, int NT>
__device__ __forceinline__ void Q6KBlock(const uint8_t* w0, const uint8_t* w1, int kb, int nbe,
                                         const Acts& x, int tok0, int g, int t, Acc<NT>& acc) {
  const Q6KBlockPtrs<kDpl> p0(w0, kb, nbe), p1(w1, kb, nbe);
  uint32_t sw0[4], sw1[4];
  p0.Scales(sw0);
  p1.Scales(sw1);
  const float d0 = Half(LdW2(p0.d)), d1 = Half(LdW2(p1.d));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t la0[2], lb0[2], hh0[2], la1[2], lb1[2], hh1[2];  // [seg]
#pragma unroll
    for (int seg = 0; seg < 2; ++seg) {
      const int l = 16 * seg + 4 * t;
      la0[seg] = p0.Word(p0.ql + 64 * h + l);
      lb0[seg] = p0.Word(p0.ql + 64 * h + 32 + l);
      hh0[seg] = p0.Word(p0.qh + 32 * h + l);
      la1[seg] = p1.Word(p1.ql + 64 * h + l);
      lb1[seg] = p1.Word(p1.ql + 64 * h + 32 + l);
      hh1[seg] = p1.Word(p1.qh + 32 * h + l);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // Activation block 8kb + 4h + q covers both segs: its scales for this
      // lane's C columns (tokens ta, ta + 1 of each tile).
      const int xb = kb * 8 + 4 * h + q;
      float xda[NT], xdb[NT];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int ta = tok0 + 8 * n + 2 * t;
        xda[n] = ta < x.n_tokens ? x.d[ta * x.nb + xb] : 0.f;
        xdb[n] = ta + 1 < x.n_tokens ? x.d[(ta + 1) * x.nb + xb] : 0.f;
      }
#pragma unroll
      for (int seg = 0; seg < 2; ++seg) {
        // The quarter's 6-bit values (as Q6K::Dot's v0..v3), minus 32.
        auto quants = [q](uint32_t la, uint32_t lb, uint32_t hh) {
          const uint32_t lo = q == 0 ? (la & 0x0F0F0F0Fu)
                              : q == 1 ? (lb & 0x0F0F0F0Fu)
                              : q == 2 ? ((la >> 4) & 0x0F0F0F0Fu)
                                       : ((lb >> 4) & 0x0F0F0F0Fu);
          const uint32_t hi = q == 0 ? ((hh << 4) & 0x30303030u)
                              : q == 1 ? ((hh << 2) & 0x30303030u)
                              : q == 2 ? (hh & 0x30303030u)
                                       : ((hh >> 2) & 0x30303030u);
          return static_cast<uint32_t>(Q6Signed(lo | hi));
        };
        const uint32_t a0 = quants(la0[seg], lb0[seg], hh0[seg]);
        const uint32_t a1 = quants(la1[seg], lb1[seg], hh1[seg]);
        const int s = 8 * h + 2 * q + seg;
        const float ds0 = d0 * static_cast<float>(static_cast<int8_t>(Byte(sw0[s >> 2], s & 3)));
        const float ds1 = d1 * static_cast<float>(static_cast<int8_t>(Byte(sw1[s >> 2], s & 3)));
        const int col = kb * 256 + 128 * h + 32 * q + 16 * seg + 4 * t;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const int tb = tok0 + 8 * n + g;
          uint32_t bx = 0;
          if (tb < x.n_tokens) {
            bx = *reinterpret_cast<const uint32_t*>(x.q + static_cast<int64_t>(tb) * x.n_cols + col);
          }
          int c4[4] = {0, 0, 0, 0};
          Mma16816(c4, a0, a1, bx);
          float* v = acc.v[n];
          v[0] = fmaf(static_cast<float>(c4[0]), ds0 * xda[n], v[0]);
          v[1] = fmaf(static_cast<float>(c4[1]), ds0 * xdb[n], v[1]);
          v[2] = fmaf(static_cast<float>(c4[2]), ds1 * xda[n], v[2]);
          v[3] = fmaf(static_cast<float>(c4[3]), ds1 * xdb[n], v[3]);
        }
      }
    }
  }
}

// grid (token tiles of 8 NT, row blocks of 16 over all parts), 4 warps.
template <MatVecKernel K, int NT, int KW>
__global__ void __launch_bounds__(32 * KW) MatVecMmaKernel(const MatVecArgs a) {
  constexpr int T = 8 * NT;
  __shared__ float partial[KW][16][T];  // (warp, row, token)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m = (a.n_parts > 1 && static_cast<int>(blockIdx.y) >= a.part[1].row_block0) +
                (a.n_parts > 2 && static_cast<int>(blockIdx.y) >= a.part[2].row_block0);
  const MatVecPart P = m == 0 ? a.part[0] : m == 1 ? a.part[1] : a.part[2];
  const int row0 = (static_cast<int>(blockIdx.y) - P.row_block0) * 16;
  const int tok0 = static_cast<int>(blockIdx.x) * T;
  // Rows past the matrix read its last row (valid memory) and write nothing.
  const int r0 = min(row0 + g, P.n_rows - 1), r1 = min(row0 + g + 8, P.n_rows - 1);
  const uint8_t* w0 = P.w + static_cast<int64_t>(r0) * P.row_stride;
  const uint8_t* w1 = P.w + static_cast<int64_t>(r1) * P.row_stride;
  GridDependencyWait();
  GridLaunchDependents();
  const Acts x{a.xq, a.xd, a.xs, a.n_cols, a.n_cols / 32, a.n_tokens};
  const int nbe = a.n_cols / 256;
  Acc<NT> acc;
#pragma unroll
  for (int n = 0; n < NT; ++n) acc.v[n][0] = acc.v[n][1] = acc.v[n][2] = acc.v[n][3] = 0.f;
  if constexpr (K == MatVecKernel::kQ4K) {
    if (warp < nbe) {
      Q4KRegs cur = Q4KLoad(w0, w1, warp, t);
      for (int kb = warp; kb < nbe; kb += KW) {
        Q4KRegs next = cur;
        if (kb + KW < nbe) next = Q4KLoad(w0, w1, kb + KW, t);  // in flight while cur is used
        Q4KBlock<NT>(cur, kb, x, tok0, g, t, acc);
        cur = next;
      }
    }
  } else {
    constexpr bool kDpl = K == MatVecKernel::kQ6KDpl;
    for (int kb = warp; kb < nbe; kb += KW) Q6KBlock<kDpl, NT>(w0, w1, kb, nbe, x, tok0, g, t, acc);
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    partial[warp][g][8 * n + 2 * t] = acc.v[n][0];
    partial[warp][g][8 * n + 2 * t + 1] = acc.v[n][1];
    partial[warp][g + 8][8 * n + 2 * t] = acc.v[n][2];
    partial[warp][g + 8][8 * n + 2 * t + 1] = acc.v[n][3];
  }
  __syncthreads();
  // Thread i writes (row i % 16, token i / 16), ...: 16 consecutive rows of
  // one token per 16 threads.
  for (int i = threadIdx.x; i < 16 * T; i += 32 * KW) {
    const int r = i & 15, tk = i >> 4;
    const int row = row0 + r, tok = tok0 + tk;
    if (row >= P.n_rows || tok >= a.n_tokens) continue;
    float v = partial[0][r][tk];
#pragma unroll
    for (int w = 1; w < KW; ++w) v += partial[w][r][tk];
    const int64_t o = static_cast<int64_t>(tok) * P.n_rows + row;
    if (P.bias != nullptr) v += P.bias[row];
    if (P.residual != nullptr) v += P.residual[o];  // may alias y: read before write
    P.y[o] = v;
  }
}

template <MatVecKernel K, int KW>
void (*PickTiles(int n_tokens))(MatVecArgs) {
  if (n_tokens <= 8) return MatVecMmaKernel<K, 1, KW>;
  if (n_tokens <= 16) return MatVecMmaKernel<K, 2, KW>;
  if (n_tokens <= 32) return MatVecMmaKernel<K, 4, KW>;
  return MatVecMmaKernel<K, 8, KW>;
}

template <MatVecKernel K>
void (*PickKernel(int n_tokens, int warps))(MatVecArgs) {
  return warps == kMmaWarpsLongRows ? PickTiles<K, kMmaWarpsLongRows>(n_tokens)
                                    : PickTiles<K, 4>(n_tokens);
}

}  // namespace

absl::Status LaunchMatVecMma(MatVecKernel kernel, const MatVecArgs& args, int64_t grid_y, bool pdl,
                             cudaStream_t stream) {
  if (args.n_tokens < 1 || args.n_tokens > kMmaMaxTokens || args.n_cols % 256 != 0 ||
      args.xq == nullptr || args.xd == nullptr || args.xs == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("matvec mma: ", args.n_tokens, " tokens, ",
                                                   args.n_cols, " columns or no int8 activations"));
  }
  const int warps = args.n_cols / 256 >= kMmaLongRowBlocks ? kMmaWarpsLongRows : 4;
  void (*fn)(MatVecArgs) = nullptr;
  if (kernel == MatVecKernel::kQ4K) fn = PickKernel<MatVecKernel::kQ4K>(args.n_tokens, warps);
  if (kernel == MatVecKernel::kQ6KDpl) fn = PickKernel<MatVecKernel::kQ6KDpl>(args.n_tokens, warps);
  if (kernel == MatVecKernel::kQ6KRaw) fn = PickKernel<MatVecKernel::kQ6KRaw>(args.n_tokens, warps);
  if (fn == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("matvec mma: no tensor-core kernel for kernel ", static_cast<int>(kernel)));
  }
  return LaunchKernel(fn, dim3(1, static_cast<unsigned>(grid_y)), dim3(32 * warps), 0, stream,
                      pdl, args);
}

}  // namespace dpl::kernels
