// q4_K, q5_K, q6_K (dpl) and q8_0 (dpl) weights times 2 to kMmaMaxTokens f16 token rows on
// Hopper's warpgroup tensor cores (wgmma, kernels/wgmma.cuh), Marlin's
// arithmetic with a multi-stage weight pipeline:
//   y[t, r] = sum_k w[r, k] x[t, k] (+ bias[r]) (+ residual[t, r]),
//   w[r, k] = d sc_j q - dmin m_j   (k in sub-block j of 32, q the nibble)
// Each weight is dequantized once, in registers, straight into an f16 A
// fragment (q exact as (0x6400 | q) - 1024, then one hfma2 with d sc_j and
// -dmin m_j), and the products accumulate in f32 across the whole row: no
// per-32 scaling of integer dots, the cost that bounds the int8 form
// (matvec_mma.cu) at 32-64 tokens (issue-bound at ~100 TFLOP/s,
// docs/PERF.md). The activations are the f16 copy of x that the activation
// quantizers write beside the int8 blocks (QuantOut::h), already in the
// order and layout the wgmma reads (F16Index, act_quant.h).
//
// CTA: one warpgroup (4 warps) over kMmaF16CtaRows = 128 rows, two m64
// tiles (warp w holds rows 16w..16w+15 of each: TileRow), and all T = 8 NT
// token slots, walking k a whole 256-column block a stage (half a block for
// q6_K at 64 tokens: W::kCols). Weights and activations of each stage go
// global -> shared by cp.async, kStages stages in flight (the weights of
// the first stages issued before the grid dependency wait: weights never
// change); a sub-block's four wgmmas (two tiles x two k16 steps, B read
// from shared memory by descriptor) run while the warps dequantize the next
// sub-block. Why wgmma, not mma.sync (H100, 7B, matvec_bench, docs/PERF.md
// "The f16 form on wgmma"): the mma.sync form issued every product and
// every B fragment load from the warps and waited on them (ncu at 64
// tokens: 7.4 warps a SM, issue slots 26% busy); with wgmma gate/up at 64
// tokens 62.0 -> 47.7 us, down 48.1 -> 35.3, the lm head 314 -> 283.
// Matrices with few row blocks split k over grid.z (MmaF16Splits), partials
// summed in split order by the int8 form's MmaSumSplits.
//
// Instructions a stage: few warps a SM, so each instruction of the
// per-stage chain costs time. Three cuts that keep every result bit: the
// copies' offsets worked out once (WeightCopies), each quad's four rows'
// scales unpacked once and shared by shuffles (not by all four lanes), and
// the nibbles at bit 4 made exact without a shift (Deq2Hi, Q6Pair). Three
// more from the SASS (989 -> 763 instructions a warp a stage at 64 tokens;
// the 32-sequence 7B step +4.3% on an H100, docs/PERF.md): mask | 0x6400
// as one lop3 (MaskOr6400), descriptors advanced by constants
// (WgmmaDescAdvance), activation copies at constant offsets.
//
// The k order inside one product is free as long as A and B use the same
// one: a sub-block's 32 columns are two k16 steps, and thread t of a quad
// takes columns 8t..8t+7 (8t..8t+3 as A's k = 2t, 2t+1, 2t+8, 2t+9 of step
// 0, 8t+4.. of step 1), so its quants are one 8-byte load per row; the f16
// copy holds the activations in that same k order (F16MmaPos). Without
// wgmma (the compute_90 PTX) MmaSubBlock multiplies by mma.sync from the
// same shared memory.
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cp_async.cuh"
#include "kernels/cuda_check.h"
#include "kernels/launch.cuh"
#include "formats/tensor_layout.h"
#include "kernels/attention/mma_f16.cuh"
#include "kernels/matvec/matvec_kernels.h"
#include "kernels/wgmma.cuh"

namespace dpl::kernels {
namespace {

constexpr int kWarps = kMmaF16CtaRows / 32;
constexpr int kThreads = 32 * kWarps;
// A stage is W::kCols columns: a whole 256-column block, or half of one.
// Why whole blocks (H100, tools/perf/stage_copy_probe.cu, the copies alone
// with no arithmetic, 7B gate/up): half-block stages (the header again
// with each half, 80 bytes a row a stage) move 1.63-1.88 TB/s, whole
// blocks (144 bytes a row) 2.04-2.23 TB/s. Half stages stay where whole
// ones would not fit two CTAs a SM: 64 tokens' activations.
constexpr int kMinStageCols = 128;

// One stage: the CTA's rows' weight bytes for W::kCols columns (W::kRow
// bytes a row, W::kChunks 16-byte copies of them) and the tokens'
// activations as the wgmma's B, as they lie in the f16 copy (F16Index):
// 16-byte chunk c of the stage's columns for token slot j at x[c][j], so
// that chunks 2c, 2c + 1 of the T slots are one k16 step's B in
// no-swizzle core matrices (8 slots x 16 bytes; SBO = 128 bytes between
// groups of 8 slots, LBO = 16 T between the two k halves).
template <class W, int T>
struct Stage {
  uint8_t w[kMmaF16CtaRows][W::kRow];
  __half x[W::kCols / 8][T][8];
};

// Stages in flight: as many as keep kCtas CTAs a SM (two: shared memory <=
// ~110 KB each; more: an equal share of the SM's 227 KB less the 1 KB the
// driver reserves a CTA), at most 4.
template <class W, int NT, int kCtas = 2>
constexpr int StagesFor() {
  constexpr int kBytes = static_cast<int>(sizeof(Stage<W, 8 * NT>));
  constexpr int kBudget = kCtas == 2 ? 110 * 1024 : (227 * 1024) / kCtas - 1024;
  return kBudget / kBytes >= 4 ? 4 : kBudget / kBytes;
}

__device__ __forceinline__ uint32_t U32(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 H2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// (a & kMask) | 0x64006400 (the f16 exponent that makes the masked bits an
// exact 1024 + v) as ONE lop3. Written in C++ the compiler emits an AND and
// an OR, two LOP3s, because a SASS LOP3 takes one immediate: the SASS of
// the 64-token q4_K kernel (H100, cuobjdump) had 134 ORs with 0x64006400 a
// stage a warp, 283 LOP3s of its 989 instructions. Here the OR's constant
// is a register, set once. Integer logic: the same bits.
template <uint32_t kMask>
__device__ __forceinline__ uint32_t MaskOr6400(uint32_t a) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "n"(kMask), "r"(0x64006400u));  // (a & b) | c
  return r;
}

// Bytes 0 and 2 of w (both < 2048) as an exact half2: (0x6400 | b) is 1024 + b.
__device__ __forceinline__ __half2 Bytes02(uint32_t w) {
  return __hsub2(H2(MaskOr6400<0x00FF00FFu>(w)), H2(0x64006400u));
}

// Two weights from the nibbles at bits 0..3 and 16..19 of p: q s - m, q
// exact in f16, one rounding. q5_K's fifth bits (at bits 4 and 20 of
// fifth; 0 for q4_K, where the OR folds away) join the mantissa: 1024 + q,
// q < 32, still exact.
__device__ __forceinline__ uint32_t Deq2Lo(uint32_t p, __half2 s, __half2 neg_m, uint32_t fifth = 0) {
  const __half2 q = __hsub2(H2(MaskOr6400<0x000F000Fu>(p) | fifth), H2(0x64006400u));
  return U32(__hfma2(q, s, neg_m));
}
// The same from the nibbles at bits 4..7 and 20..23, without a shift:
// (0x6400 | 16 q) is 1024 + 16 q, and (1024 + 16 q) / 16 - 64 = q exactly
// (Marlin's trick), so the result has the same bits as Deq2Lo(p >> 4).
// q5_K's fifth bits at bits 8 and 24 (16 q <= 496 stays in the mantissa).
__device__ __forceinline__ uint32_t Deq2Hi(uint32_t p, __half2 s, __half2 neg_m, uint32_t fifth = 0) {
  const __half2 q = __hfma2(H2(MaskOr6400<0x00F000F0u>(p) | fifth), H2(0x2C002C00u),  // 1/16
                            H2(0xD400D400u));                                                  // -64
  return U32(__hfma2(q, s, neg_m));
}

// Two q6_K weights minus 32, exact in f16, from the nibbles at bits P..P+3
// and 16+P.. of lo and the two high bits at P+4.. and 20+P.. of hb (P = 0
// or 4): (0x6400 | v << P) is 1024 + 2^P v, so v - 32 is one hsub2 (P = 0)
// or one hfma2 by 1/16 (P = 4, no shift of the nibble); the same bits as
// subtracting 1056 from (0x6400 | v).
template <int P>
__device__ __forceinline__ __half2 Q6Pair(uint32_t lo, uint32_t hb) {
  constexpr uint32_t kLo = 0x000F000Fu << P, kHb = 0x00030003u << (P + 4);
  const uint32_t x = MaskOr6400<kLo>(lo) | (hb & kHb);
  if constexpr (P == 0) {
    return __hsub2(H2(x), H2(0x64206420u));  // 1024 + v - 1056
  } else {
    return __hfma2(H2(x), H2(0x2C002C00u), H2(0xD600D600u));  // (1024 + 16 v) / 16 - 96
  }
}

// This thread's share of a stage's weight copies: copy k is 16-byte chunk
// i % W::kChunks of CTA row i / W::kChunks, i = threadIdx + 128 k (consecutive
// threads take consecutive chunks of a row). The offsets that do not depend
// on the stage are worked out once: per stage a copy then costs a select and
// two adds, where the general form worked out a division, the row clamp and
// a 64-bit multiply every time (~15 instructions a copy in PTX; with the
// other two cuts below the q4_K kernel at 8 tokens went from 1,288 to 1,003
// SASS instructions). Rows past the matrix copy its last row (valid memory;
// never written back).
template <class W>
struct WeightCopies {
  static constexpr int kCopies = kMmaF16CtaRows * W::kChunks / kThreads;
  uint32_t src[kCopies];  // byte offset from P.w, without the stage's part
  uint32_t dst[kCopies];  // byte offset in a Stage
  uint8_t chunk[kCopies];

  __device__ WeightCopies(const MatVecPart& P, int nbe, int row0) {
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * kThreads;
      const int row = i / W::kChunks, c = i % W::kChunks;
      src[k] = static_cast<uint32_t>(min(row0 + row, P.n_rows - 1)) *
                   static_cast<uint32_t>(P.row_stride) + W::ChunkFixed(nbe, c);
      dst[k] = static_cast<uint32_t>(row * W::kRow + 16 * c);
      chunk[k] = static_cast<uint8_t>(c);
    }
  }

  // The weight bytes of stage ks (columns W::kCols ks ..) of the CTA's rows
  // into the stage at shared address st.
  __device__ __forceinline__ void Issue(const MatVecPart& P, int ks, uint32_t st) const {
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      CpAsync16ZeroFill(st + dst[k], P.w + (src[k] + W::ChunkStep(ks, chunk[k])), true);
    }
  }
};

// Stage ks's activations (columns W::kCols ks ..): W::kCols / 8 chunks of
// the T token slots of the CTA's token tile xh, one contiguous run in the
// f16 copy, copied linearly (slots past n_tokens hold whatever is there:
// their products land in output columns nobody reads).
template <class W, int T>
__device__ __forceinline__ void StageActivations(const __half* xh, int ks, Stage<W, T>& st) {
  constexpr int kCopies = W::kCols / 8 * T;  // 16-byte copies a stage
  static_assert(kCopies % kThreads == 0, "copies split evenly over the CTA");
  // This thread's first copy, then the others at constant offsets, which
  // ptxas folds into the copies' immediates. Why: with the index i = thread
  // + 128 k in the address (an int widened per copy) each copy cost five
  // integer instructions (SASS, 64-token q4_K kernel: 80 of a stage's 989).
  const uint8_t* src = reinterpret_cast<const uint8_t*>(xh) +
                       (static_cast<int64_t>(ks) * kCopies + threadIdx.x) * 16;
  const uint32_t dst = SmemAddr(&st.x[0][0][0]) + 16 * threadIdx.x;
#pragma unroll
  for (int k = 0; k < kCopies / kThreads; ++k) {
    CpAsync16ZeroFill(dst + 16 * kThreads * k, src + 16 * kThreads * k, true);
  }
}

// Row r (0, 1: +0, +8) of this thread in m64 tile i: the wgmma's A puts
// warp w on rows 16w..16w+15 of each 64-row tile.
__device__ __forceinline__ int TileRow(int warp, int i, int g, int r) {
  return 64 * i + 16 * warp + g + 8 * r;
}

// Sub-block jj (0..3) of a stage: the bytes b0 b1 b2 b3 of this thread's
// columns 8t + 4 step .. +3 as b0 b2 b1 b3, so that the nibble (or bit)
// pairs of columns (0, 1) sit at bits sh, 16 + sh and of (2, 3) at 8 + sh.
__device__ __forceinline__ uint32_t Pairs(uint32_t w) { return __byte_perm(w, 0, 0x3120); }

// c += A B for the CTA's two m64 tiles and all T = 8 NT tokens, on one
// 32-column sub-block jj of the stage's half at column x0: A[i][step] this
// thread's fragments of tile i's two k16 steps, B the staged activations at
// shared address x (chunks (x0 + 32 jj + 16 step) / 8, + 1). Four wgmmas,
// one commit group; the wait keeps this group in flight and retires the
// previous one, whose A registers the next sub-block's dequantization reuses.
// Without wgmma (compute_90 PTX) the warp multiplies its own 16 rows of each
// tile by mma.sync, B fragments read from the same chunks.
template <int NT>
__device__ __forceinline__ uint64_t StageDesc(uint32_t x) {
  constexpr uint32_t kChunkBytes = 16 * 8 * NT;
  return WgmmaDesc(x, kChunkBytes, 128);
}

// x0 and jj are constants after unrolling, so each wgmma's descriptor is
// the stage's (desc, StageDesc of x) plus a constant: two uniform
// instructions, where building it whole from the address took five (SASS:
// 80 of the 64-token q4_K kernel's 989 a stage).
template <int NT>
__device__ __forceinline__ void MmaSubBlock(uint32_t x, uint64_t desc0, int x0, int jj,
                                            const uint32_t (&A)[2][2][4],
                                            float (&acc)[2][NT][4]) {
  constexpr uint32_t kChunkBytes = 16 * 8 * NT;
#if DPL_HAS_WGMMA
  WgmmaFenceOperands(acc[0]);
  WgmmaFenceOperands(acc[1]);
  WgmmaFence();
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    const uint32_t c = static_cast<uint32_t>(x0 / 8 + 4 * jj + 2 * step);
    const uint64_t desc = WgmmaDescAdvance(desc0, c * kChunkBytes);
#pragma unroll
    for (int i = 0; i < 2; ++i) WgmmaF16<8 * NT>(acc[i], A[i][step], desc);
  }
  WgmmaCommit();
  WgmmaWait<1>();
  WgmmaFenceOperands(acc[0]);
  WgmmaFenceOperands(acc[1]);
#else
  (void)desc0;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    const uint32_t c = static_cast<uint32_t>(x0 / 8 + 4 * jj + 2 * step);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const uint32_t at = x + c * kChunkBytes + (8 * n + g) * 16 + 4 * t;  // (k 2t, 2t+1; slot 8n + g)
      uint32_t b0, b1;
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(b0) : "r"(at));
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(b1) : "r"(at + kChunkBytes));
#pragma unroll
      for (int i = 0; i < 2; ++i) attn_mma::Mma16816(acc[i][n], A[i][step], b0, b1);
    }
  }
#endif
}

// q4_K (raw 144-byte blocks: d, dmin, scales[12], qs[128]; qs[32c + l] holds
// sub-block 2c in its low nibble, 2c + 1 in its high one) and, with kQ5,
// q5_K (raw 176-byte blocks: d, dmin, scales[12], qh[32], qs[128]; the same
// nibbles and scales, and a fifth bit, bit j of qh[l] for element l of
// sub-block j):
//   w = d sc_j q - dmin m_j   (q5_K: q = nibble | fifth << 4)
// A stage row: the whole block (144 bytes in a 160-byte row; q5_K 176 in
// 224), or for half-block stages the header (and q5_K's qh) and the half's
// 64 quant bytes (in 96; q5_K 112 in 160); strides chosen so that a
// half-warp's 8-byte loads (rows g..g+3) fall on distinct banks. q5_K costs
// two instructions a pair more: its fifth bits moved into place and OR-ed in.
template <int kStageCols, bool kQ5>
struct QKF16 {
  static constexpr int kCols = kStageCols;
  static constexpr bool kWhole = kCols == 256;
  static constexpr int kBlock = kQ5 ? 176 : 144;
  static constexpr int kQhAt = 16, kQsAt = kQ5 ? kQhAt + 32 : 16;  // in the block and the stage row
  static constexpr int kRow = kQ5 ? (kWhole ? 224 : 160) : (kWhole ? 160 : 96);
  static constexpr int kChunks = (kQsAt + (kWhole ? 128 : 64)) / 16;  // header (qh), 8 (4) of quants
  // Chunk c of stage ks is at byte ChunkFixed(c) + ChunkStep(ks, c) of the row.
  __device__ static uint32_t ChunkFixed(int /*nbe*/, int c) { return 16 * c; }
  __device__ static uint32_t ChunkStep(int ks, int c) {
    if (kWhole) return static_cast<uint32_t>(ks) * kBlock;
    return static_cast<uint32_t>(ks >> 1) * kBlock + (c < kQsAt / 16 ? 0 : 64 * (ks & 1));
  }

  // Sub-block j's fifth bits of the two columns at bytes 0 and 2 of ph (a
  // Pairs() of qh bytes), moved to bits 4 and 20 (next to a low nibble) or
  // 8 and 24 (above a nibble at bit 4): Deq2Lo's and Deq2Hi's fifth.
  __device__ static uint32_t FifthLo(uint32_t ph, int j) {
    return (j <= 4 ? ph << (4 - j) : ph >> (j - 4)) & 0x00100010u;
  }
  __device__ static uint32_t FifthHi(uint32_t ph, int j) { return (ph << (8 - j)) & 0x01000100u; }

  // The half's (h) 6-bit scales sc_j and mins m_j, j = 4h .. 4h + 3, one
  // per byte (the q4_K scale packing, as Q4KUnpackScales in matvec_mma.cu),
  // made f16 products with d and -dmin: s02 = (d sc_4h, d sc_4h+2), s13 =
  // (.. +1, +3), and the same for the mins.
  struct HalfScales {
    __half2 s02, s13, m02, m13;
  };
  __device__ static HalfScales Scales(const uint4& hdr, int h) {
    const uint32_t sc = h ? (hdr.w & 0x0F0F0F0Fu) | ((hdr.y >> 2) & 0x30303030u)
                          : hdr.y & 0x3F3F3F3Fu;
    const uint32_t m = h ? ((hdr.w >> 4) & 0x0F0F0F0Fu) | ((hdr.z >> 2) & 0x30303030u)
                         : hdr.z & 0x3F3F3F3Fu;
    const __half2 d = __half2half2(__ushort_as_half(static_cast<unsigned short>(hdr.x & 0xFFFFu)));
    const __half2 ndm =
        __hneg2(__half2half2(__ushort_as_half(static_cast<unsigned short>(hdr.x >> 16))));
    HalfScales r;
    r.s02 = __hmul2(Bytes02(sc), d);
    r.s13 = __hmul2(Bytes02(sc >> 8), d);
    r.m02 = __hmul2(Bytes02(m), ndm);
    r.m13 = __hmul2(Bytes02(m >> 8), ndm);
    return r;
  }

  // One stage (half h of block kb) for this warp's two m16 tiles: rows
  // 32 warp + 16 i + g + 8 r for tile i, r = 0, 1. The four lanes of a quad
  // (same g) need the same four rows' scales: lane t unpacks row (i, r) = (t
  // / 2, t % 2) and the quad shares them by shuffles (16 shuffles instead of
  // unpacking three more rows, ~84 instructions in PTX).
  // q5_K: each row's 8 qh bytes (this thread's columns of every sub-block)
  // loaded once a half.
  template <int NT>
  __device__ static void Half(const Stage<QKF16, 8 * NT>& st, int h, int /*kb*/, int warp, int g,
                              int t, float (&acc)[2][NT][4]) {
    const int q0 = kQsAt + (kWhole ? 64 * h : 0);  // the half's quants in the stage row
    const int lane0 = (threadIdx.x & 31) & ~3;
    const uint32_t xs = SmemAddr(&st.x[0][0][0]);
    const uint64_t desc0 = StageDesc<NT>(xs);
    uint2 q[2][2][2];  // [tile][row g, g + 8][chunk]
    uint2 qh[2][2];    // q5_K: [tile][row g, g + 8]
    const HalfScales mine = Scales(
        *reinterpret_cast<const uint4*>(&st.w[TileRow(warp, t >> 1, g, t & 1)][0]), h);
    HalfScales sc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = TileRow(warp, i, g, r);
        const int src = lane0 + 2 * i + r;
        sc[i][r].s02 = H2(__shfl_sync(0xffffffffu, U32(mine.s02), src));
        sc[i][r].s13 = H2(__shfl_sync(0xffffffffu, U32(mine.s13), src));
        sc[i][r].m02 = H2(__shfl_sync(0xffffffffu, U32(mine.m02), src));
        sc[i][r].m13 = H2(__shfl_sync(0xffffffffu, U32(mine.m13), src));
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          q[i][r][c] = *reinterpret_cast<const uint2*>(&st.w[row][q0 + 32 * c + 8 * t]);
        }
        if constexpr (kQ5) qh[i][r] = *reinterpret_cast<const uint2*>(&st.w[row][kQhAt + 8 * t]);
      }
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      // Sub-block j = 4h + jj: chunk jj / 2 of the half, low nibbles for even jj.
      const int c = jj >> 1, j = 4 * h + jj;
      const bool hi = jj & 1;
      uint32_t A[2][2][4];  // [tile][k16 step][a0..a3]
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const __half2 s2 = hi ? sc[i][r].s13 : sc[i][r].s02;
          const __half2 m2 = hi ? sc[i][r].m13 : sc[i][r].m02;
          const __half2 s = (jj & 2) ? __high2half2(s2) : __low2half2(s2);
          const __half2 m = (jj & 2) ? __high2half2(m2) : __low2half2(m2);
#pragma unroll
          for (int step = 0; step < 2; ++step) {
            // Columns (0, 1) in bytes 0 and 2 of p (and ph), (2, 3) in bytes 1 and 3.
            const uint32_t p = Pairs(step ? q[i][r][c].y : q[i][r][c].x);
            const uint32_t p8 = p >> 8;
            uint32_t f = 0, f8 = 0;  // q5_K's fifth bits of the two pairs
            if constexpr (kQ5) {
              const uint32_t ph = Pairs(step ? qh[i][r].y : qh[i][r].x);
              f = hi ? FifthHi(ph, j) : FifthLo(ph, j);
              f8 = hi ? FifthHi(ph >> 8, j) : FifthLo(ph >> 8, j);
            }
            A[i][step][r] = hi ? Deq2Hi(p, s, m, f) : Deq2Lo(p, s, m, f);
            A[i][step][2 + r] = hi ? Deq2Hi(p8, s, m, f8) : Deq2Lo(p8, s, m, f8);
          }
        }
      }
      MmaSubBlock<NT>(xs, desc0, kWhole ? 128 * h : 0, jj, A, acc);
    }
  }
};

template <int kStageCols>
using Q4KF16 = QKF16<kStageCols, false>;
template <int kStageCols>
using Q5KF16 = QKF16<kStageCols, true>;

// q6_K in the dpl layout (planes ql | qh | sc | d, each 16-byte aligned:
// formats/tensor_layout.h): element l of half h, quarter q = l / 32, is
//   w = d sc_{8h + 2q + (l % 32) / 16} (v - 32),
//   v = nibble q / 2 of ql[64h + 32 (q & 1) + l % 32] | bits 2q, 2q+1 of qh[32h + l % 32] << 4.
// A stage row: the block's ql (128) and qh (64), or for half-block stages
// the half's (64, 32); then the block's 16 scales and the 16-byte chunk of
// d holding this block's: 224 (160) bytes, so that a half-warp's 8-byte
// loads (rows g..g+3) fall on distinct banks.
template <int kStageCols>
struct Q6KF16 {
  static constexpr int kCols = kStageCols;
  static constexpr bool kWhole = kCols == 256;
  static constexpr int kRow = kWhole ? 224 : 160;
  static constexpr int kQl = kWhole ? 8 : 4, kQh = kWhole ? 4 : 2;  // chunks of each
  static constexpr int kChunks = kQl + kQh + 2;                      // + sc, d
  static constexpr int kQhAt = 16 * kQl, kScAt = kQhAt + 16 * kQh, kDAt = kScAt + 16;
  // Chunk c of stage ks is at byte ChunkFixed(c) + ChunkStep(ks, c) of the row.
  __device__ static uint32_t ChunkFixed(int nbe, int c) {
    const formats::Q6KPlanes pl = formats::Q6KDplPlanes(static_cast<uint64_t>(nbe));
    if (c < kQl) return static_cast<uint32_t>(pl.ql) + 16 * c;
    if (c < kQl + kQh) return static_cast<uint32_t>(pl.qh) + 16 * (c - kQl);
    return static_cast<uint32_t>(c == kQl + kQh ? pl.sc : pl.d);
  }
  __device__ static uint32_t ChunkStep(int ks, int c) {
    const uint32_t kb = static_cast<uint32_t>(kWhole ? ks : ks >> 1);
    const uint32_t h = kWhole ? 0 : static_cast<uint32_t>(ks & 1);
    if (c < kQl) return kb * 128 + 64 * h;
    if (c < kQl + kQh) return kb * 64 + 32 * h;
    return c == kQl + kQh ? kb * 16 : (kb >> 3) * 16;
  }

  // The half's 8 int8 scales (bytes of sw) times d, as f16 pairs (j, j + 1)
  // for j = 0, 2, 4, 6: int8 b is exact as (0x6400 | (b ^ 0x80)) - 1152.
  struct HalfScales {
    __half2 s[4];
  };
  __device__ static HalfScales Scales(uint2 sw, __half2 d) {
    HalfScales r;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t w = k < 2 ? sw.x : sw.y;
      const uint32_t b = __byte_perm(w, 0, (k & 1) ? 0x7372 : 0x7170);  // bytes 2k, 2k+1 -> halves
      const __half2 v = __hsub2(H2((b ^ 0x00800080u) | 0x64006400u), H2(0x64806480u));
      r.s[k] = __hmul2(v, d);
    }
    return r;
  }

  // As Q4KF16::Half, the quad shares the four rows' scales: lane t unpacks
  // row (t / 2, t % 2), four shuffles a row.
  template <int NT>
  __device__ static void Half(const Stage<Q6KF16, 8 * NT>& st, int h, int kb, int warp, int g,
                              int t, float (&acc)[2][NT][4]) {
    const int kb8 = kb & 7;
    const int ql0 = kWhole ? 64 * h : 0, qh0 = kQhAt + (kWhole ? 32 * h : 0);
    const int lane0 = (threadIdx.x & 31) & ~3;
    const uint32_t xs = SmemAddr(&st.x[0][0][0]);
    const uint64_t desc0 = StageDesc<NT>(xs);
    uint2 ql[2][2][2], qh[2][2];  // [tile][row g, g + 8]([ql half])
    HalfScales sc[2][2];
    {
      const uint8_t* row = st.w[TileRow(warp, t >> 1, g, t & 1)];
      const HalfScales mine =
          Scales(*reinterpret_cast<const uint2*>(row + kScAt + 8 * h),
                 __half2half2(*reinterpret_cast<const __half*>(row + kDAt + 2 * kb8)));
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            sc[i][r].s[k] = H2(__shfl_sync(0xffffffffu, U32(mine.s[k]), lane0 + 2 * i + r));
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint8_t* row = st.w[TileRow(warp, i, g, r)];
        ql[i][r][0] = *reinterpret_cast<const uint2*>(row + ql0 + 8 * t);
        ql[i][r][1] = *reinterpret_cast<const uint2*>(row + ql0 + 32 + 8 * t);
        qh[i][r] = *reinterpret_cast<const uint2*>(row + qh0 + 8 * t);
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // Thread t's 8 columns of quarter q share scale 2q + t / 2 of the half.
      uint32_t A[2][2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const __half2 s = (t >> 1) ? __high2half2(sc[i][r].s[q]) : __low2half2(sc[i][r].s[q]);
          const uint2 lw = ql[i][r][q & 1];
#pragma unroll
          for (int step = 0; step < 2; ++step) {
            const uint32_t p = Pairs(step ? lw.y : lw.x);
            const uint32_t ph = Pairs(step ? qh[i][r].y : qh[i][r].x);
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {  // columns (0, 1), then (2, 3)
              // The nibble sits at bit 4 (q >> 1) + 8 hi of p, the two high
              // bits at 2 q + 8 hi of ph; Q6Pair wants the nibble at bit P
              // of (hi ? p >> 8 : p) and the two bits at P + 4.
              const uint32_t lo = hi ? p >> 8 : p;
              const int shift = 2 * q + 8 * hi - (4 * (q >> 1) + 4);
              const uint32_t hb = shift >= 0 ? ph >> shift : ph << -shift;
              const __half2 v = (q >> 1) ? Q6Pair<4>(lo, hb) : Q6Pair<0>(lo, hb);
              A[i][step][2 * hi + r] = U32(__hmul2(v, s));
            }
          }
        }
      }
      MmaSubBlock<NT>(xs, desc0, kWhole ? 128 * h : 0, q, A, acc);
    }
  }
};

// q8_0 in the dpl layout (planes qs | d, formats/tensor_layout.h; a row of
// n_cols = 256 nbe columns: qs at byte k for column k, then the blocks' f16
// d from byte 256 nbe):
//   w = d_{k / 32} qs[k]   (qs int8)
// Each 32-column sub-block of a stage is one q8_0 block. A stage row: the
// stage's qs (256 or 128 bytes) and the 16-byte chunk of the d plane with its
// 256-column block's 8 scales: 288 (160) bytes, so that a half-warp's 8-byte
// loads (rows g..g+3) fall on distinct banks. int8 q is exact in f16 as
// (0x6400 | (q ^ 0x80)) - 1152, then one multiply by d: one rounding, as
// q4_K's q s - m.
template <int kStageCols>
struct Q8_0F16 {
  static constexpr int kCols = kStageCols;
  static constexpr bool kWhole = kCols == 256;
  static constexpr int kQs = kCols / 16;  // 16-byte chunks of qs a stage row
  static constexpr int kChunks = kQs + 1;  // + the d chunk
  static constexpr int kRow = kWhole ? 288 : 160;
  static constexpr int kDAt = 16 * kQs;
  // Chunk c of stage ks is at byte ChunkFixed(c) + ChunkStep(ks, c) of the row.
  __device__ static uint32_t ChunkFixed(int nbe, int c) {
    return c < kQs ? 16 * c : static_cast<uint32_t>(nbe) * 256;
  }
  __device__ static uint32_t ChunkStep(int ks, int c) {
    if (c < kQs) return static_cast<uint32_t>(ks) * kCols;
    return static_cast<uint32_t>(kWhole ? ks : ks >> 1) * 16;
  }

  // Two weights from the (q ^ 0x80) bytes at bits 0..7 and 16..23 of p,
  // times the block's scale s.
  __device__ static uint32_t Deq2(uint32_t p, __half2 s) {
    const __half2 q = __hsub2(H2(MaskOr6400<0x00FF00FFu>(p)), H2(0x64806480u));  // 1152 + q - 1152
    return U32(__hmul2(q, s));
  }

  template <int NT>
  __device__ static void Half(const Stage<Q8_0F16, 8 * NT>& st, int h, int /*kb*/, int warp, int g,
                              int t, float (&acc)[2][NT][4]) {
    const int q0 = kWhole ? 128 * h : 0;  // the half's qs in the stage row
    const uint32_t xs = SmemAddr(&st.x[0][0][0]);
    const uint64_t desc0 = StageDesc<NT>(xs);
    uint2 d[2][2];  // [tile][row g, g + 8]: the half's 4 scales (blocks 4h .. 4h + 3)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        d[i][r] = *reinterpret_cast<const uint2*>(&st.w[TileRow(warp, i, g, r)][kDAt + 8 * h]);
      }
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      uint32_t A[2][2][4];  // [tile][k16 step][a0..a3]
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // This thread's columns 8t .. 8t + 7 of block 4h + jj, and its scale.
          const uint2 q = *reinterpret_cast<const uint2*>(&st.w[TileRow(warp, i, g, r)][q0 + 32 * jj + 8 * t]);
          const uint32_t dw = jj < 2 ? d[i][r].x : d[i][r].y;
          const __half2 s = (jj & 1) ? __high2half2(H2(dw)) : __low2half2(H2(dw));
#pragma unroll
          for (int step = 0; step < 2; ++step) {
            // Columns (0, 1) in bytes 0 and 2 of p, (2, 3) in bytes 1 and 3;
            // the sign bits flipped once for all four.
            const uint32_t p = Pairs(step ? q.y : q.x) ^ 0x80808080u;
            A[i][step][r] = Deq2(p, s);
            A[i][step][2 + r] = Deq2(p >> 8, s);
          }
        }
      }
      MmaSubBlock<NT>(xs, desc0, kWhole ? 128 * h : 0, jj, A, acc);
    }
  }
};

// CTAs in this CTA's thread block cluster: 1 unless launched as clusters.
__device__ __forceinline__ int ClusterCtas() {
  return static_cast<int>(cooperative_groups::this_cluster().num_blocks());
}

// The k-split sum inside the cluster (a launch whose clusters are a row
// tile's P.splits CTAs, cluster rank = blockIdx.z): each CTA leaves its
// 128 rows x T tokens of partial sums in its own shared memory, and CTA z
// adds the z-th 1/splits of the tile's outputs over all the cluster's
// shared memories (distributed shared memory), in split order, then bias
// and residual: MmaSumSplits' additions in its order, so the same bits,
// with no partials through global memory and no second launch.
//   y[t, r] = ((p_0[t, r] + p_1[t, r]) + ... + p_{S-1}[t, r]) (+ bias[r]) (+ residual[t, r])
// Why: the sum kernels were 112 of a 16-sequence 7B step's 425 launches
// (docs/PERF.md, "A 16-sequence step, kernel by kernel"); one CTA adding a
// whole tile lost (its chain of L2 round trips, "The k-split sums in the
// row tile's last CTA"): here every CTA of the tile adds a share.
template <class W, int NT>
__device__ __forceinline__ void ClusterSum(const MatVecArgs& a, const MatVecPart& P, int row0,
                                           int tok0, int z, int warp, int g, int t,
                                           const float (&acc)[2][NT][4], uint8_t* smem) {
  constexpr int T = 8 * NT;
  // red[token][row], rows padded to 132 floats: thread (g, t)'s tokens 2t,
  // 2t + 1 and rows g.. land on distinct banks (132 = 4 mod 32).
  constexpr int kPitch = kMmaF16CtaRows + 4;
  static_assert(T * kPitch * 4 <= 2 * static_cast<int>(sizeof(Stage<W, T>)),
                "the partial tile fits in the stages' shared memory");
  float* red = reinterpret_cast<float*>(smem);
  CpAsyncWait<0>();  // no copy still landing in the stages
  __syncthreads();   // every warp done reading them
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        red[(8 * n + 2 * t + (e & 1)) * kPitch + TileRow(warp, i, g, e >> 1)] = acc[i][n][e];
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();  // every split's partials written and visible cluster-wide
  const int splits = P.splits, n_tok = a.n_tokens - tok0 < T ? a.n_tokens - tok0 : T;
  const int n_out = n_tok * kMmaF16CtaRows;
  const int lo = n_out * z / splits, hi = n_out * (z + 1) / splits;
  for (int o = lo + static_cast<int>(threadIdx.x); o < hi; o += kThreads) {
    const int tok = o / kMmaF16CtaRows, r = o % kMmaF16CtaRows, row = row0 + r;
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
    const int64_t off = static_cast<int64_t>(tok0 + tok) * P.n_rows + row;
    if (P.bias != nullptr) v += P.bias[row];
    if (P.residual != nullptr) v += P.residual[off];  // may alias y: read before write
    P.y[off] = v;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

__device__ __forceinline__ MatVecPart PartAt(const MatVecArgs& a, int m) {
  return m == 0 ? a.part[0] : m == 1 ? a.part[1] : a.part[2];
}

// grid (token tiles, row blocks of kMmaF16CtaRows over all parts, max
// splits), 4 warps, kStages stages of dynamic shared memory. CTA (x, y, z)
// takes tokens T x .. T x + T - 1 (the f16 copy's tile x: F16Index), its
// part's rows 128 (y - row_block0) .. +127 and the W::kCols-column stages
// [ns z / splits, ns (z + 1) / splits) (none for some splits of a short
// row: their partials are zeros). More than one token tile (the wide
// launch) only with splits 1 or summed in clusters. The tiles of a row
// block are consecutive CTAs, so they run side by side and the row block's
// weights come from HBM about once, the other tiles' reads from L2.
template <class W, int NT, int kCtas, bool kCluster>
__device__ __forceinline__ void MatVecMmaF16Body(const MatVecArgs& a) {
  constexpr int T = 8 * NT, kS = StagesFor<W, NT, kCtas>();
  static_assert(kS >= 2, "a stage in flight while one is multiplied");
  extern __shared__ __align__(16) uint8_t smem[];
  Stage<W, T>* stage = reinterpret_cast<Stage<W, T>*>(smem);
  const int m = (a.n_parts > 1 && static_cast<int>(blockIdx.y) >= a.part[1].row_block0) +
                (a.n_parts > 2 && static_cast<int>(blockIdx.y) >= a.part[2].row_block0);
  const MatVecPart P = PartAt(a, m);
  const int z = static_cast<int>(blockIdx.z);
  if (z >= P.splits) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = (static_cast<int>(blockIdx.y) - P.row_block0) * kMmaF16CtaRows;
  const int ns = a.n_cols / W::kCols, nbe = a.n_cols / 256;
  const int ks0 = ns * z / P.splits, n_it = ns * (z + 1) / P.splits - ks0;
  const int tok0 = T * static_cast<int>(blockIdx.x);  // the token tile's first token
  const __half* xh = a.xh + static_cast<int64_t>(tok0) * a.n_cols;
  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.f;
  // The first stages' weights before the wait (they never change), then
  // their activations, one commit group a stage (the weights ride in group 0).
  const WeightCopies<W> copies(P, nbe, row0);
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < n_it) copies.Issue(P, ks0 + s, SmemAddr(&stage[s]));
  }
  GridDependencyWait();
  GridLaunchDependents();
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < n_it) StageActivations(xh, ks0 + s, stage[s]);
    CpAsyncCommit();
  }
  for (int it = 0; it < n_it; ++it) {
    CpAsyncWait<kS - 2>();    // stage `it` landed (this thread's copies),
    FenceProxyAsyncShared();  // visible to the wgmmas' reads ...
    __syncthreads();          // ... in every thread; stage it - 1 is consumed
    const int nx = it + kS - 1;
    if (nx < n_it) {
      copies.Issue(P, ks0 + nx, SmemAddr(&stage[nx % kS]));
      StageActivations(xh, ks0 + nx, stage[nx % kS]);
    }
    CpAsyncCommit();
    const int ks = ks0 + it;
#pragma unroll
    for (int hh = 0; hh < W::kCols / 128; ++hh) {  // the stage's halves of a block
      const int h = W::kCols == 256 ? hh : ks & 1, kb = W::kCols == 256 ? ks : ks >> 1;
      W::template Half<NT>(stage[it % kS], h, kb, warp, g, t, acc);
    }
    // The stage's products done before the next barrier lets it be
    // refilled (and before the loop's end, where the compiler may move the
    // accumulators: ptxas serializes every wgmma if a group is in flight there).
    WgmmaWait<0>();
  }
  // Thread (g, t) holds rows TileRow(warp, i, g, 0 / 1) x tokens 8n + 2t, + 1.
  if constexpr (kCluster) {
    if (P.splits > 1 && ClusterCtas() == P.splits) {
      ClusterSum<W, NT>(a, P, row0, tok0, z, warp, g, t, acc, smem);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = tok0 + 8 * n + 2 * t + (e & 1);
        const int row = row0 + TileRow(warp, i, g, e >> 1);
        if (tok >= a.n_tokens || row >= P.n_rows) continue;
        const int64_t o = static_cast<int64_t>(tok) * P.n_rows + row;
        if (P.splits > 1) {
          P.partial[static_cast<int64_t>(z) * a.n_tokens * P.n_rows + o] = acc[i][n][e];
          continue;
        }
        float v = acc[i][n][e];
        if (P.bias != nullptr) v += P.bias[row];
        if (P.residual != nullptr) v += P.residual[o];  // may alias y: read before write
        P.y[o] = v;
      }
    }
  }
}

// The kernels: two CTAs a SM with the launch bounds the form was tuned
// with (no minimum), more with that minimum (which caps the registers).
// kCluster: the k-split sum inside the cluster (ClusterSum), compiled only
// into the kernels launched as clusters. Why: compiled into every kernel
// (a branch on the cluster's size) it cost the 64-token q4_K kernel 4
// registers and the 64-sequence step 0.6% with clusters off (7B, H100:
// 10,265 -> 10,208 t/s); without it the kernels have their former
// register counts again (ptxas).
template <class W, int NT, bool kCluster>
__global__ void __launch_bounds__(kThreads) MatVecMmaF16Kernel(const MatVecArgs a) {
  MatVecMmaF16Body<W, NT, 2, kCluster>(a);
}
template <class W, int NT, int kCtas, bool kCluster>
__global__ void __launch_bounds__(kThreads, kCtas) MatVecMmaF16KernelCtas(const MatVecArgs a) {
  MatVecMmaF16Body<W, NT, kCtas, kCluster>(a);
}

template <auto kKernel>
absl::Status LaunchOne(const MatVecArgs& args, int64_t grid_y, int splits, int cluster_z, int smem,
                       bool pdl, cudaStream_t stream) {
  DPL_RETURN_IF_ERROR((OptInSharedMemory<kKernel>(smem)));
  const unsigned tiles = static_cast<unsigned>((args.n_tokens + kF16TileTokens - 1) / kF16TileTokens);
  return LaunchClusterKernel(kKernel, dim3(tiles, static_cast<unsigned>(grid_y), splits),
                             dim3(kThreads), dim3(1, 1, cluster_z), smem, stream, pdl, args);
}

template <class W, int NT, int kCtas = 2>
absl::Status Launch(const MatVecArgs& args, int64_t grid_y, int splits, bool pdl,
                    cudaStream_t stream, bool cluster_sum) {
  static_assert(W::kCols / 8 * 8 * NT % kThreads == 0, "a stage's activation copies split evenly");
  if (std::min(F16TokenSlots(args.n_tokens), kF16TileTokens) != 8 * NT) {
    return absl::InternalError(absl::StrCat("matvec f16 mma: ", args.n_tokens, " tokens in a ",
                                            8 * NT, "-token tile"));
  }
  constexpr int kSmem = StagesFor<W, NT, kCtas>() * static_cast<int>(sizeof(Stage<W, 8 * NT>));
  if constexpr (kCtas == 2) {
    if (cluster_sum) {
      return LaunchOne<MatVecMmaF16Kernel<W, NT, true>>(args, grid_y, splits, splits, kSmem, pdl, stream);
    }
    return LaunchOne<MatVecMmaF16Kernel<W, NT, false>>(args, grid_y, splits, 1, kSmem, pdl, stream);
  } else {
    if (cluster_sum) {
      return LaunchOne<MatVecMmaF16KernelCtas<W, NT, kCtas, true>>(args, grid_y, splits, splits, kSmem,
                                                                    pdl, stream);
    }
    return LaunchOne<MatVecMmaF16KernelCtas<W, NT, kCtas, false>>(args, grid_y, splits, 1, kSmem, pdl,
                                                                   stream);
  }
}

// Whole-block stages where two CTAs a SM still fit them: every token count
// for q4_K, up to 32 tokens for q6_K (its 224-byte rows and 64 tokens'
// whole-block activations would leave one CTA a SM), half blocks beyond.
// Why whole blocks at 64 tokens too (H100, 7B, wgmma form): gate/up 52.8 ->
// 48.0 us, q4_K down 39.1 -> 35.0; the 64-sequence step 9,811 -> 10,268 t/s.
// Up to 16 tokens, small_ctas (DecodeTuning::mma_f16_small_ctas_per_sm)
// may ask for more CTAs a SM: 3 (whole-block stages, two of them) or 4
// (half-block stages, registers capped at 128 by the launch bounds). Why
// try: ncu of 7B ffn_down q4_K at 16 tokens (docs/PERF.md, "Where a
// mid-size f16-form product waits"): 2 CTAs a SM, 8 warps, 4.4 cycles
// between a warp's instructions, DRAM 38% busy.
template <template <int> class W>
absl::Status LaunchFor(const MatVecArgs& args, int64_t grid_y, int splits, bool pdl,
                       cudaStream_t stream, const MmaF16Options& o) {
  const bool c = o.cluster_sum;
  // Three CTAs a SM where two whole-block stages fit that share (q4_K, q6_K;
  // not q8_0's 288-byte rows): otherwise the two-CTA launch below.
  if constexpr (StagesFor<W<256>, 2, 3>() >= 2) {
    if (args.n_tokens <= 16 && o.ctas_per_sm == 3) {
      if (args.n_tokens <= 8) return Launch<W<256>, 1, 3>(args, grid_y, splits, pdl, stream, c);
      return Launch<W<256>, 2, 3>(args, grid_y, splits, pdl, stream, c);
    }
  }
  if (args.n_tokens <= 16 && o.ctas_per_sm == 4) {
    if (args.n_tokens <= 8) return Launch<W<128>, 1, 4>(args, grid_y, splits, pdl, stream, c);
    return Launch<W<128>, 2, 4>(args, grid_y, splits, pdl, stream, c);
  }
  if (args.n_tokens <= 8) return Launch<W<256>, 1>(args, grid_y, splits, pdl, stream, c);
  if (args.n_tokens <= 16) return Launch<W<256>, 2>(args, grid_y, splits, pdl, stream, c);
  if (args.n_tokens <= 32) return Launch<W<256>, 4>(args, grid_y, splits, pdl, stream, c);
  if constexpr (sizeof(Stage<W<256>, 64>) * 2 <= 110 * 1024) {
    return Launch<W<256>, 8>(args, grid_y, splits, pdl, stream, c);
  } else {
    return Launch<W<128>, 8>(args, grid_y, splits, pdl, stream, c);
  }
}

}  // namespace

absl::Status LaunchMatVecMmaF16(MatVecKernel kernel, const MatVecArgs& args, int64_t grid_y,
                                bool pdl, cudaStream_t stream, const MmaF16Options& options) {
  if (kernel != MatVecKernel::kQ4K && kernel != MatVecKernel::kQ5K && kernel != MatVecKernel::kQ6KDpl &&
      kernel != MatVecKernel::kQ8_0Dpl) {
    return absl::InvalidArgumentError(absl::StrCat("matvec f16 mma: kernel ",
                                                   static_cast<int>(kernel),
                                                   " has no f16 form (q4_K, q5_K, q6_K dpl, q8_0 dpl)"));
  }
  if (args.n_tokens < 1 || args.n_cols % 256 != 0 || args.xh == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("matvec f16 mma: ", args.n_tokens, " tokens, ",
                                                   args.n_cols, " columns or no f16 activations"));
  }
  int splits = 1;
  for (int i = 0; i < args.n_parts; ++i) {
    const MatVecPart& p = args.part[i];
    if (p.splits < 1 || p.splits > args.n_cols / kMinStageCols ||
        (p.splits > 1 && p.partial == nullptr && args.n_tokens <= kMmaMaxTokens) || p.row_stride % 16 != 0 ||
        int64_t{p.n_rows} * p.row_stride >= kMmaF16MaxMatrixBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "matvec f16 mma: part ", i, " splits k ", p.splits, " ways (1..", args.n_cols / kMinStageCols,
          ", partials needed for more than 1 up to 64 tokens), row stride ", p.row_stride,
          " (16-byte multiple), ", p.n_rows, " rows (under 4 GiB in all)"));
    }
    splits = std::max(splits, p.splits);
  }
  MmaF16Options o = options;
  // Clusters only where every part splits k alike (a cluster is one row
  // tile's splits), 2 to 8 ways (the portable cluster size).
  for (int i = 0; i < args.n_parts; ++i) o.cluster_sum &= args.part[i].splits == splits;
  o.cluster_sum &= splits > 1 && splits <= 8;
  // The wide launch's splits add up in clusters only (its partials would be
  // a whole pass's).
  if (args.n_tokens > kMmaMaxTokens && splits > 1 && !o.cluster_sum) {
    return absl::InvalidArgumentError(absl::StrCat(
        "matvec f16 mma: ", args.n_tokens, " tokens (the wide launch) with k split ", splits,
        " ways: only where every part splits alike, summed in clusters"));
  }
  if (kernel == MatVecKernel::kQ4K) {
    DPL_RETURN_IF_ERROR(LaunchFor<Q4KF16>(args, grid_y, splits, pdl, stream, o));
  } else if (kernel == MatVecKernel::kQ5K) {
    DPL_RETURN_IF_ERROR(LaunchFor<Q5KF16>(args, grid_y, splits, pdl, stream, o));
  } else if (kernel == MatVecKernel::kQ6KDpl) {
    DPL_RETURN_IF_ERROR(LaunchFor<Q6KF16>(args, grid_y, splits, pdl, stream, o));
  } else {
    DPL_RETURN_IF_ERROR(LaunchFor<Q8_0F16>(args, grid_y, splits, pdl, stream, o));
  }
  if (o.cluster_sum) return absl::OkStatus();
  return LaunchMmaSumSplits(args, pdl, stream);
}

}  // namespace dpl::kernels
