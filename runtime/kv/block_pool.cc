#include "runtime/kv/block_pool.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dpl::kv {

absl::StatusOr<BlockPool> BlockPool::Create(int num_blocks, int block_size) {
  if (num_blocks < 1 || block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV block pool: ", num_blocks, " blocks of ",
                                                   block_size, " positions (need >= 1 each)"));
  }
  return BlockPool(num_blocks, block_size);
}

BlockPool::BlockPool(int num_blocks, int block_size)
    : block_size_(block_size), blocks_(static_cast<size_t>(num_blocks)) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // block 0 first
}

uint64_t BlockPool::HashOf(uint64_t parent_hash, absl::Span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size() * sizeof(int32_t), parent_hash);
}

void BlockPool::Uncache(int block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  by_hash_.erase(b.hash);
  b.cached = false;
  b.parent = -1;
  b.tokens.clear();
}

absl::StatusOr<int> BlockPool::Allocate() {
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (!evictable_.empty()) {
    id = evictable_.front();
    evictable_.pop_front();
    Uncache(id);
  } else {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV block pool: all ", blocks_.size(), " blocks of ", block_size_,
                     " positions are in use"));
  }
  blocks_[static_cast<size_t>(id)].refs = 1;
  return id;
}

absl::Status BlockPool::Ref(int block) {
  if (block < 0 || block >= num_blocks() || blocks_[static_cast<size_t>(block)].refs < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV block pool: Ref of block ", block, ", which is not in use"));
  }
  ++blocks_[static_cast<size_t>(block)].refs;
  return absl::OkStatus();
}

absl::Status BlockPool::Release(absl::Span<const int> blocks) {
  // Check everything first: a bad list changes nothing. A block listed k
  // times needs k references.
  absl::flat_hash_map<int, int> count;
  for (int id : blocks) {
    if (id < 0 || id >= num_blocks()) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV block pool: Release of block ", id, " (pool of ", num_blocks(), ")"));
    }
    if (++count[id] > blocks_[static_cast<size_t>(id)].refs) {
      return absl::FailedPreconditionError(absl::StrCat(
          "KV block pool: Release of block ", id, " beyond its ",
          blocks_[static_cast<size_t>(id)].refs, " reference(s)"));
    }
  }
  // Last block first: a sequence's tail is evicted before its prefix, which
  // more prompts share.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int id = *it;
    Block& b = blocks_[static_cast<size_t>(id)];
    if (--b.refs > 0) continue;
    if (b.cached) {
      b.evict_pos = evictable_.insert(evictable_.end(), id);
    } else {
      free_.push_back(id);
    }
  }
  return absl::OkStatus();
}

bool BlockPool::Cache(int block, int parent, absl::Span<const int32_t> tokens) {
  if (block < 0 || block >= num_blocks() || parent < -1 || parent >= num_blocks() ||
      static_cast<int>(tokens.size()) != block_size_) {
    return false;
  }
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.refs < 1 || b.cached) return false;
  if (parent >= 0 && !blocks_[static_cast<size_t>(parent)].cached) return false;
  const uint64_t hash = HashOf(parent >= 0 ? blocks_[static_cast<size_t>(parent)].hash : 0, tokens);
  if (!by_hash_.emplace(hash, block).second) return false;
  b.cached = true;
  b.parent = parent;
  b.hash = hash;
  b.tokens.assign(tokens.begin(), tokens.end());
  return true;
}

int BlockPool::CachedChild(int parent, absl::Span<const int32_t> tokens) const {
  if (parent < -1 || parent >= num_blocks() || static_cast<int>(tokens.size()) != block_size_) return -1;
  if (parent >= 0 && !blocks_[static_cast<size_t>(parent)].cached) return -1;
  const auto it = by_hash_.find(HashOf(parent >= 0 ? blocks_[static_cast<size_t>(parent)].hash : 0, tokens));
  if (it == by_hash_.end()) return -1;
  const Block& b = blocks_[static_cast<size_t>(it->second)];
  // Exact: the same parent block and the same tokens, not only the hash.
  if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin())) return -1;
  return it->second;
}

std::vector<int> BlockPool::FindPrefix(absl::Span<const int32_t> tokens, int max_blocks) const {
  std::vector<int> chain;
  const int n = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / block_size_);
  const size_t bs = static_cast<size_t>(block_size_);
  for (int i = 0, parent = -1; i < n; ++i) {
    parent = CachedChild(parent, tokens.subspan(static_cast<size_t>(i) * bs, bs));
    if (parent < 0) break;
    chain.push_back(parent);
  }
  return chain;
}

std::vector<int> BlockPool::MatchPrefix(absl::Span<const int32_t> tokens, int max_blocks) {
  std::vector<int> chain = FindPrefix(tokens, max_blocks);
  for (int id : chain) {
    Block& b = blocks_[static_cast<size_t>(id)];
    if (b.refs++ == 0) evictable_.erase(b.evict_pos);
  }
  return chain;
}

}  // namespace dpl::kv
