// The paged KV cache's bookkeeping (issue 30), no CUDA: one pool of
// num_blocks blocks of block_size positions that sequences take as they grow
// (vLLM's PagedAttention block manager, llama-server's unified KV), and the
// prefix cache on top of it. A full block that has been written can be
// cached under the hash of every token up to its end; when its sequences
// release it, it stays cached (reference count 0, evictable, least recently
// released first), and a later prompt that starts with the same tokens takes
// it back instead of recomputing it (vLLM's automatic prefix caching, SGLang's
// RadixAttention).
//
// A cached block is matched exactly, not by hash alone: it keeps its tokens
// and its parent block, and MatchPrefix compares both.
#pragma once

#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dpl::kv {

class BlockPool {
 public:
  // Errors for num_blocks < 1 or block_size < 1.
  static absl::StatusOr<BlockPool> Create(int num_blocks, int block_size);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  // Blocks Allocate can hand out now: never used or freed, plus cached ones
  // with no users (evicted on demand).
  int num_available() const { return static_cast<int>(free_.size() + evictable_.size()); }
  // Full blocks held by the prefix cache (in use or not).
  int num_cached() const { return static_cast<int>(by_hash_.size()); }

  // A block for one sequence to write, reference count 1: a free block
  // first, else the least recently released cached block (dropped from the
  // cache). ResourceExhausted when every block is in use: the caller waits
  // or preempts a sequence.
  absl::StatusOr<int> Allocate();

  // One more user of a block in use (a prefix shared by parallel samples);
  // FailedPrecondition for a block without users.
  absl::Status Ref(int block);

  // Drops one reference to each block (a sequence's blocks in order). A
  // block left without users stays cached when it was cached, entering the
  // eviction order last, the list's last block first (a tail goes before
  // the prefix it extends); else it is free again. FailedPrecondition (and nothing changed)
  // for an id out of range or a block without users.
  absl::Status Release(absl::Span<const int> blocks);

  // Registers `block` (in use, every one of its block_size positions
  // written with `tokens`) as the continuation of `parent` (a cached block,
  // or -1 for a sequence's first block). A block already cached, a parent
  // that is not cached, or a prefix some other block already caches leave
  // the cache as it was (the caller's block stays private). Returns whether
  // the block is now cached.
  bool Cache(int block, int parent, absl::Span<const int32_t> tokens);

  // The longest chain of cached blocks holding tokens[0 .. n block_size),
  // n <= max_blocks, each taken with one more reference (a block with no
  // users leaves the eviction order). Pair with Release.
  std::vector<int> MatchPrefix(absl::Span<const int32_t> tokens, int max_blocks);
  // The chain MatchPrefix would take now, taken by no one: a scheduler
  // weighs it against its other starts (and the blocks it would need)
  // before it commits.
  std::vector<int> FindPrefix(absl::Span<const int32_t> tokens, int max_blocks) const;
  // The cached block that continues `parent` (a cached block, or -1 for a
  // sequence's first) with `tokens`, or -1. A sequence whose block was not
  // cached because another block already caches the same tokens (two
  // requests ran one prompt at once) continues its chain from that block.
  int CachedChild(int parent, absl::Span<const int32_t> tokens) const;

  int RefCount(int block) const { return blocks_[static_cast<size_t>(block)].refs; }
  bool IsCached(int block) const { return blocks_[static_cast<size_t>(block)].cached; }

 private:
  struct Block {
    int refs = 0;
    bool cached = false;
    int parent = -1;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;                 // while cached
    std::list<int>::iterator evict_pos;          // while cached with refs == 0
  };

  BlockPool(int num_blocks, int block_size);
  static uint64_t HashOf(uint64_t parent_hash, absl::Span<const int32_t> tokens);
  void Uncache(int block);

  int block_size_;
  std::vector<Block> blocks_;
  std::vector<int> free_;      // never used or freed, taken from the back
  std::list<int> evictable_;   // cached, no users: least recently released first
  absl::flat_hash_map<uint64_t, int> by_hash_;
};

}  // namespace dpl::kv
