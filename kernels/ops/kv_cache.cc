#include "kernels/ops/kv_cache.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace dpl::kernels {

absl::StatusOr<KvCacheLayout> MakeKvCacheLayout(int n_layer, int n_kv_head, int n_ctx,
                                                int head_dim, int n_seq) {
  if (n_layer <= 0 || n_kv_head <= 0 || n_ctx <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      n_seq <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache layout: need positive n_layer, n_kv_head, n_ctx, n_seq and an even "
                     "head_dim; got n_layer=",
                     n_layer, " n_kv_head=", n_kv_head, " n_ctx=", n_ctx, " head_dim=", head_dim,
                     " n_seq=", n_seq));
  }
  return KvCacheLayout{n_layer, n_kv_head, n_ctx, head_dim, n_seq};
}

absl::StatusOr<KvCacheLayout> MakePagedKvCacheLayout(int n_layer, int n_kv_head, int head_dim, int n_seq,
                                                     int block, int n_blocks, int64_t n_ctx) {
  if (block < 16 || block > 1024 || (block & (block - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged KV cache: the block must be a power of two from 16 to 1024 positions, got ", block));
  }
  if (n_blocks <= 0 || n_ctx <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("paged KV cache: need positive n_blocks and n_ctx; got n_blocks=",
                                                   n_blocks, " n_ctx=", n_ctx));
  }
  const int64_t table = std::min<int64_t>((n_ctx + block - 1) / block, n_blocks);
  DPL_ASSIGN_OR_RETURN(KvCacheLayout layout,
                       MakeKvCacheLayout(n_layer, n_kv_head, static_cast<int>(table * block), head_dim, n_seq));
  while ((1 << layout.block_shift) < block) ++layout.block_shift;
  layout.n_blocks = n_blocks;
  return layout;
}

absl::Status CheckKvPages(const KvPages& pages, int64_t n_ctx, absl::string_view who) {
  if (!pages.paged()) return absl::OkStatus();
  if (pages.block_shift < 4 || pages.block_shift > 10) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": pages.block_shift ", pages.block_shift,
                                                   " (blocks of 16 to 1024 positions: 4..10)"));
  }
  if (pages.max_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": pages.max_blocks ", pages.max_blocks, " <= 0"));
  }
  const int64_t reach = static_cast<int64_t>(pages.max_blocks) << pages.block_shift;
  if (n_ctx > reach) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": n_ctx ", n_ctx, " is more than a block table reaches (",
                                                   reach, ": pages.max_blocks ", pages.max_blocks,
                                                   " << block_shift ", pages.block_shift, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> RopeInvFreq(double base, int n_rot, double freq_scale) {
  if (n_rot <= 0 || n_rot % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RoPE table: n_rot must be positive and even, got ", n_rot));
  }
  if (!(base > 0) || !(freq_scale > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE table: freq_base and freq_scale must be positive, got ", base, ", ", freq_scale));
  }
  std::vector<double> inv(n_rot / 2);
  for (int i = 0; i < n_rot / 2; ++i) {
    inv[i] = freq_scale * std::pow(base, -2.0 * i / n_rot);
  }
  return inv;
}

}  // namespace dpl::kernels
