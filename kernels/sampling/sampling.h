// On-device token sampling from the lm-head logits, graph-capturable: the
// random-number counter, the repetition-penalty ring and the chosen token all
// live in device memory, so replaying one captured graph samples step after
// step, and the same seed replays the same tokens.
//
// Chain (llama.cpp's default order, as the CPU sampler in runtime/generate):
//   repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw
//   - penalty: each distinct token of the last repeat_last_n (ring) once:
//     logit > 0 ? logit / penalty : logit * penalty (written into `logits`)
//   - temperature <= 0: greedy, argmax of the penalized logits, ties -> lowest id
//   - top-k: the k largest (ties -> lower id first); k <= 0 or >= n_vocab: off
//   - top-p: softmax over the kept logits (no temperature), the shortest
//     prefix whose mass reaches top_p (>= 1: off)
//   - min-p: keep logit >= max_logit + log(min_p) (<= 0: off)
//   - draw: u = UniformFromCounter(seed, step) * sum_i exp(l_i/T - l_0/T),
//     first i with cumulative weight > u; step += 1 afterwards.
//
// How top-k/top-p run on 152k logits: a max pass, a 65536-bin histogram of
// the top 16 bits of the ordered logit key (counts and softmax mass), a
// one-block cutoff search giving the lowest bin that can hold a survivor of
// top-k and top-p, a compaction of the logits in bins >= cutoff, and an exact
// bitonic sort of those candidates in one block, on which the chain runs
// exactly. Limit: at most kSamplingMaxCandidates (2048) candidates; when the
// cutoff bins hold more (top_k > 2048, or top-k off with a flat
// distribution), the cutoff rises to the highest-valued bins that fit and
// state.truncations counts it (the tail beyond them is dropped).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {

inline constexpr int kSamplingMaxCandidates = 2048;


// Device-resident sampler state (the caller zeroes it, then uploads the
// prompt's ring head/count, see MakeRecentRing).
struct SamplerState {
  unsigned long long step;         // draws so far (the RNG counter)
  int32_t ring_head;
  int32_t ring_count;
  unsigned int truncations;        // candidate sets cut to kSamplingMaxCandidates
  unsigned int pad;
};

// Bytes of scratch SampleToken needs (independent of n_vocab).
uint64_t SamplingWorkspaceBytes();

// Samples one token and writes it to *d_token_out; pushes it into the ring.
//   logits:    (n_vocab) floats; penalized entries are rewritten in place
//   d_ring:    (params.repeat_last_n) ints (may be null when repeat_last_n <= 0)
//   state:     one SamplerState in device memory
//   workspace: SamplingWorkspaceBytes() bytes, 256-byte aligned
absl::Status SampleToken(const SamplingParams& params, float* logits, int n_vocab, int* d_ring,
                         SamplerState* state, void* workspace, int* d_token_out,
                         cudaStream_t stream);

}  // namespace dpl::kernels
