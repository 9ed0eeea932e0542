#include "runtime/kv/seq_tables.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dpl::kv {

SeqTables::SeqTables(int n_seq, int block_size, int num_blocks, int max_blocks)
    : block_size_(block_size),
      num_blocks_(num_blocks),
      max_blocks_(max_blocks),
      tables_(static_cast<size_t>(n_seq)),
      rows_in_(static_cast<size_t>(n_seq)),
      changed_(static_cast<size_t>(n_seq), false) {}

absl::StatusOr<std::vector<BlockCopy>> SeqTables::Set(int seq, absl::Span<const int> blocks, int64_t n_past) {
  if (blocks.size() > static_cast<size_t>(max_blocks_)) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, ": a block table of ", blocks.size(),
                                                   " blocks; at most ", max_blocks_));
  }
  for (int b : blocks) {
    if (b < 0 || b >= num_blocks_) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", seq, ": block ", b, " is outside the pool [0, ", num_blocks_, ")"));
    }
  }
  const std::vector<int> held = Held(seq);
  const size_t n_held = static_cast<size_t>((n_past + block_size_ - 1) / block_size_);
  if (n_held > held.size()) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": ", n_past,
                                                      " positions but rows for only ", held.size(), " blocks"));
  }
  if (blocks.size() < n_held) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": a table of ", blocks.size(),
                                                      " blocks cannot hold its ", n_past, " positions"));
  }
  std::vector<BlockCopy> copies;
  for (size_t i = 0; i < n_held; ++i) {
    if (blocks[i] == held[i]) continue;
    // A destination must not be a block whose rows a later copy still reads.
    if (std::find(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(n_held), blocks[i]) !=
        held.begin() + static_cast<std::ptrdiff_t>(n_held)) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": block ", blocks[i],
                                                        " would receive rows while it holds others of the sequence"));
    }
    const int64_t rows = std::min<int64_t>(block_size_, n_past - static_cast<int64_t>(i) * block_size_);
    copies.push_back({held[i], blocks[i], static_cast<int>(rows)});
  }
  tables_[static_cast<size_t>(seq)].assign(blocks.begin(), blocks.end());
  rows_in_[static_cast<size_t>(seq)].assign(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(n_held));
  changed_[static_cast<size_t>(seq)] = true;
  return copies;
}

std::vector<int> SeqTables::Held(int seq) const {
  std::vector<int> held = rows_in_[static_cast<size_t>(seq)];
  const std::vector<int>& table = tables_[static_cast<size_t>(seq)];
  for (size_t i = held.size(); i < table.size(); ++i) held.push_back(table[i]);
  return held;
}

void SeqTables::Share(int dst, int src, int64_t n) {
  const std::vector<int> from = Held(src);
  const size_t k = std::min(from.size(), static_cast<size_t>((n + block_size_ - 1) / block_size_));
  rows_in_[static_cast<size_t>(dst)].assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(k));
}

void SeqTables::Keep(int seq, int64_t n) {
  std::vector<int> held = Held(seq);
  held.resize(std::min(held.size(), static_cast<size_t>((n + block_size_ - 1) / block_size_)));
  rows_in_[static_cast<size_t>(seq)] = std::move(held);
}

absl::Status SeqTables::Adopt(int seq, int64_t n) {
  const std::vector<int>& table = tables_[static_cast<size_t>(seq)];
  if (n < 0 || n > static_cast<int64_t>(table.size()) * block_size_) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": cannot adopt ", n,
                                                      " positions with a block table of ", table.size(),
                                                      " blocks of ", block_size_));
  }
  const size_t k = static_cast<size_t>((n + block_size_ - 1) / block_size_);
  rows_in_[static_cast<size_t>(seq)].assign(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(k));
  return absl::OkStatus();
}

absl::Status SeqTables::CheckRun(int seq, int64_t positions) const {
  const std::vector<int>& table = tables_[static_cast<size_t>(seq)];
  const std::vector<int>& held = rows_in_[static_cast<size_t>(seq)];
  if (static_cast<int64_t>(table.size()) * block_size_ < positions) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": its block table reaches ",
                                                      table.size() * static_cast<size_t>(block_size_),
                                                      " positions, the pass needs ", positions));
  }
  if (held.size() > table.size() || !std::equal(held.begin(), held.end(), table.begin())) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, ": its rows are in another sequence's blocks (no block table set since the copy)"));
  }
  return absl::OkStatus();
}

std::vector<int> SeqTables::TakeChanged() {
  std::vector<int> out;
  for (size_t s = 0; s < changed_.size(); ++s) {
    if (changed_[s]) out.push_back(static_cast<int>(s));
    changed_[s] = false;
  }
  return out;
}

}  // namespace dpl::kv
