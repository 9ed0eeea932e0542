// Per-step bookkeeping kernels of the captured decode graphs: tokens and
// positions live in device memory and the graph moves them on itself, so
// replaying the same graph walks through the context with no host write in
// between.
//
// A batched step has `batch` rows, row r decoding sequence row_seq[r] (a
// server slot; < 0: a padding row, so one graph per batch size serves any
// number of active sequences up to it). Per sequence s the device keeps the
// token the next step feeds (seq_token[s]: the last sampled one) and its
// position (seq_pos[s]); the host writes only row_seq between steps.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace dpl::kernels {

// For r < batch, with s = row_seq[r]:
//   tokens[r] = s >= 0 ? seq_token[s] : 0,  positions[r] = s >= 0 ? seq_pos[s] : -1
// (position -1: RoPE writes no cache row, attention reads key 0: a padding
// row costs compute, never state).
//   row_seq: (batch); seq_token, seq_pos: (n_seq); tokens, positions: (batch)
absl::Status GatherStepRows(const int* row_seq, const int* seq_token, const int* seq_pos, int batch,
                            int* tokens, int* positions, cudaStream_t stream);

// After a step, for r < batch with s = row_seq[r] >= 0:
//   seq_pos[s] += 1;  seq_token[s] = sampled[r]  (when sampled is not null)
// Rows name distinct sequences (the caller's contract), so no two rows
// write one entry.
absl::Status FinishStepRows(const int* row_seq, int batch, const int* sampled, int* seq_token,
                            int* seq_pos, cudaStream_t stream);

}  // namespace dpl::kernels
