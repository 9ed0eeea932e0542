// On-device token sampling from the lm-head logits, graph-capturable: the
// random-number counter, the repetition-penalty ring and the chosen token all
// live in device memory, so replaying one captured graph samples step after
// step, and the same seed replays the same tokens.
//
// Chain (llama.cpp's default order, as the CPU sampler in runtime/generate):
//   [logit bias] -> repetition penalty -> [allowed-token mask] -> top-k -> top-p -> min-p -> temperature -> draw
//   - logit bias (SampleBatch::bias): l += bias for each listed token (written into `logits`)
//   - penalty: each distinct token of the last repeat_last_n (ring) once:
//     logit > 0 ? logit / penalty : logit * penalty (written into `logits`)
//   - temperature <= 0: greedy, argmax of the penalized logits, ties -> lowest id
//   - top-k: the k largest (ties -> lower id first); k <= 0 or >= n_vocab: off
//   - top-p: softmax over the kept logits (no temperature), the shortest
//     prefix whose mass reaches top_p (>= 1: off)
//   - min-p: keep logit >= max_logit + log(min_p) (<= 0: off)
//   - then the sorted tail of -inf logits (bans, masks) is cut, one kept at least
//   - draw: u = UniformFromCounter(seed, step) * sum_i exp(l_i/T - l_0/T),
//     first i with cumulative weight > u; step += 1 afterwards.
//
// How top-k/top-p run on 152k logits (kernels/sampling/depth_bins.h): a max
// pass, a histogram of each logit's depth below the max (1537 bins, finest
// at the top; counts, and softmax masses for top-p alone; privatized in
// shared memory), a one-block cutoff search giving the deepest bin that can
// hold a survivor of top-k, top-p and min-p, a compaction of the logits in
// bins <= cutoff, and an exact bitonic sort of those candidates in one
// block, on which the chain runs exactly. Limit: at most
// kSamplingMaxCandidates (2048) candidates; when the cutoff bins hold more
// (top_k > ~1800, top-k off with a flat distribution, every filter off on a
// large vocabulary), the cutoff rises to the deepest bins that fit and
// state.truncations counts it (the tail beyond them is dropped).
//
// Launches (the same kernels serve one row and a batch): Prepare (zeroes the
// row's workspace header and histogram, adds the biases, applies the
// penalty), Max (argmax, applies the mask), Hist, Cutoff, Collect, Final
// (greedy: writes the argmax). Every kernel runs grid.y = row (or grid.x =
// row for the one-block kernels) and reads its row's params on the device.
//
// Batched (SampleTokens): one call samples B rows, row r for sequence
// slots[r], each with its own params, SamplerState and ring, all in device
// memory: the launch sequence is the same six kernels whatever the params say,
// so one captured graph serves every step and a slot's params change by a
// device write, not a re-capture. A greedy row's blocks return at the top of
// Hist, Cutoff and Collect (it pays the max pass only). Row r's token, state,
// ring and penalized logits are bit-identical to SampleToken with
// params[slots[r]] on that row (the grid differs; the results do not depend
// on it: Z_all is summed over fixed parts, see kPartElems in sampling.cu). Params are used defensively on the
// device: repeat_last_n is clamped to [0, ring_stride], repeat_penalty <= 0 or
// NaN is off, temperature NaN is greedy, top_p / min_p NaN are off.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/sampling/depth_bins.h"  // kSamplingMaxCandidates, the cutoff rule
#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {

// Device-resident sampler state (the caller zeroes it, then uploads the
// prompt's ring head/count, see MakeRecentRing).
struct SamplerState {
  unsigned long long step;         // draws so far (the RNG counter)
  int32_t ring_head;
  int32_t ring_count;
  unsigned int truncations;        // candidate sets cut to kSamplingMaxCandidates
  unsigned int pad;
};

// Bytes of scratch SampleToken (batch 1) or SampleTokens needs for `batch`
// rows: a 256-byte multiple, independent of n_vocab (about 92 KiB a row).
uint64_t SamplingWorkspaceBytes(int batch = 1);

// Samples one token and writes it to *d_token_out; pushes it into the ring.
// No logit bias on this path (dpl-run's single sequence takes none).
//   logits:    (n_vocab) floats; penalized entries are rewritten in place
//   d_ring:    (params.repeat_last_n) ints (may be null when repeat_last_n <= 0)
//   state:     one SamplerState in device memory
//   workspace: SamplingWorkspaceBytes() bytes, 256-byte aligned
absl::Status SampleToken(const SamplingParams& params, float* logits, int n_vocab, int* d_ring,
                         SamplerState* state, void* workspace, int* d_token_out,
                         cudaStream_t stream);

// One batched sampling call; every pointer is device memory.
struct SampleBatch {
  const SamplingParams* params = nullptr;  // (n_seqs) per-sequence params, read on the device
  int n_seqs = 0;                          // sequences (slots) params/states/rings are indexed by
  // (batch) row r samples for sequence slots[r]; a slot < 0 or >= n_seqs marks
  // a padding row (nothing written). The other slots of one call must be
  // distinct (two rows of one sequence would race on its state and ring).
  const int* slots = nullptr;
  int batch = 0;                           // rows, 1..65535
  float* logits = nullptr;                 // (batch, n_vocab); penalized entries rewritten in place
  int n_vocab = 0;
  // (n_seqs, ring_stride) penalty rings: sequence s uses rings + s * ring_stride
  // and min(params[s].repeat_last_n, ring_stride) slots; null when ring_stride is 0
  int* rings = nullptr;
  int ring_stride = 0;
  SamplerState* states = nullptr;          // (n_seqs)
  void* workspace = nullptr;               // SamplingWorkspaceBytes(batch) bytes, 256-byte aligned
  int* tokens_out = nullptr;               // (batch) row r's token (padding rows: untouched)
  // Allowed-token masks (structured output; both null: none). Sequence s
  // with allowed_on[s] != 0 draws only tokens whose bit is set in its mask,
  // allowed + s * AllowedWords(n_vocab) (token i: bit i % 32 of word i / 32),
  // as the CPU sampler's SampleAllowed: the masked logits become -inf
  // (rewritten in place) after the penalties, before top-k. Device memory,
  // written between steps (a captured graph reads the new masks); a mask
  // must allow at least one token.
  const uint32_t* allowed = nullptr;  // (n_seqs, AllowedWords(n_vocab))
  const int* allowed_on = nullptr;    // (n_seqs)
  // Logit biases (OpenAI's logit_bias; both null: none). Sequence s adds
  // bias[s * kMaxLogitBias + i].bias to the logit of its token for i <
  // n_bias[s] (clamped to [0, kMaxLogitBias]), first, before the penalties
  // (rewritten in place), as the CPU sampler does. A sequence's tokens must
  // be distinct (one thread adds each entry: two of one token would race;
  // CheckLogitBias); one outside [0, n_vocab) is skipped. Device memory,
  // written between steps, as the masks.
  const LogitBias* bias = nullptr;  // (n_seqs, kMaxLogitBias)
  const int* n_bias = nullptr;      // (n_seqs) entries in use
};

// 32-bit words of a mask over n_vocab tokens.
constexpr int AllowedWords(int n_vocab) { return (n_vocab + 31) / 32; }

// Samples every row of `b` (six launches, graph-capturable; see the top).
// Host checks are of pointers and sizes only: the params are not read here.
absl::Status SampleTokens(const SampleBatch& b, cudaStream_t stream);

}  // namespace dpl::kernels
