#include "kernels/sampling/sampling_util.h"

namespace dpl::kernels {

RecentRing MakeRecentRing(absl::Span<const int32_t> history, int32_t repeat_last_n) {
  RecentRing ring;
  if (repeat_last_n <= 0) return ring;
  ring.tokens.assign(repeat_last_n, -1);
  for (int32_t t : history) {
    ring.tokens[ring.head] = t;
    ring.head = (ring.head + 1) % repeat_last_n;
    if (ring.count < repeat_last_n) ++ring.count;
  }
  return ring;
}

}  // namespace dpl::kernels
