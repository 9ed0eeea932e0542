#include "runtime/server/chat_page.h"

namespace dpl::server {

absl::string_view ChatPage() {
  static constexpr char kPage[] =
#include "runtime/server/chat_page.inc"
      ;
  return absl::string_view(kPage, sizeof(kPage) - 1);
}

}  // namespace dpl::server
