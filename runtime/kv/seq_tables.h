// The block tables of an engine that pages its KV cache (issue 30), no
// CUDA: for each sequence, the pool blocks that its scheduler handed it
// (BatchEngine::SetBlockTable) and the blocks that hold its rows now.
//
// The two differ after a copied start: CopyPrefix makes sequence dst's first
// n positions sequence src's, and the scheduler then gives dst src's full
// blocks (shared, never written again) plus blocks of its own, one of which
// must receive the rows of src's partial last block; or after a kept start
// whose partial last block was shared (copy on write). Set() compares the
// new table with where the rows are and returns the block copies that
// bring them over; the engine enqueues them before anything reads the
// table. Until then a sequence whose rows live elsewhere cannot run
// (CheckRun). A start adopted from the prefix cache (Adopt) needs no copy:
// its rows are in the blocks its new table starts with.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dpl::kv {

// Rows [0, rows) of every kv head, layer, K and V of block src go to block
// dst.
struct BlockCopy {
  int src = 0;
  int dst = 0;
  int rows = 0;
};

class SeqTables {
 public:
  // n_seq tables of at most max_blocks entries each, block ids below
  // num_blocks, block_size positions a block.
  SeqTables(int n_seq, int block_size, int num_blocks, int max_blocks);

  int block_size() const { return block_size_; }
  int max_blocks() const { return max_blocks_; }

  // The sequence's positions now live in `blocks` (block i: positions
  // [i * block_size, (i + 1) * block_size)), of which the first n_past hold
  // rows. Returns the copies that move the rows of each block that changed
  // (ascending), to run before any pass reads the table. Errors (nothing
  // changes): an id outside [0, num_blocks), more than max_blocks entries,
  // a table too short for n_past rows, a block that receives rows while it
  // holds other rows of the sequence.
  absl::StatusOr<std::vector<BlockCopy>> Set(int seq, absl::Span<const int> blocks, int64_t n_past);

  // Sequence dst's first n positions are src's rows (CopyPrefix): they stay
  // in src's blocks until Set gives dst its own table.
  void Share(int dst, int src, int64_t n);
  // The sequence keeps its first n positions' rows (KeepPrefix, Release: 0).
  void Keep(int seq, int64_t n);
  // The sequence's first n positions are the rows its table's blocks
  // already hold (a start adopted from the scheduler's prefix cache: blocks
  // that another sequence wrote, possibly long finished); whatever rows it
  // held before are dropped. Set the table first. FailedPrecondition (and
  // nothing changes) when its table does not reach n positions.
  absl::Status Adopt(int seq, int64_t n);

  // OK when a pass may run the sequence up to `positions` (exclusive): its
  // table reaches them and its rows are in its own table. FailedPrecondition
  // naming what is missing otherwise.
  absl::Status CheckRun(int seq, int64_t positions) const;

  absl::Span<const int> table(int seq) const { return tables_[static_cast<size_t>(seq)]; }
  // Sequences whose table changed since the last call, each once, ascending.
  std::vector<int> TakeChanged();

 private:
  // The blocks that hold (or, past its rows, will hold) the sequence's
  // positions: rows_in_, then its table's later blocks (a pass writes
  // through the table once rows_in_ is the table's start: CheckRun).
  std::vector<int> Held(int seq) const;

  int block_size_;
  int num_blocks_;
  int max_blocks_;
  std::vector<std::vector<int>> tables_;  // (n_seq) the scheduler's tables
  // (n_seq) where each sequence's rows are when that is not its table's
  // start (after Share, Keep); its table's blocks take over past its end.
  std::vector<std::vector<int>> rows_in_;
  std::vector<bool> changed_;
};

}  // namespace dpl::kv
