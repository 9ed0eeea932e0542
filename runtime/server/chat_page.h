// The chat page dpl-server serves at GET / (chat_page.html: one
// self-contained file, compiled into the binary).
#pragma once

#include "absl/strings/string_view.h"

namespace dpl::server {

absl::string_view ChatPage();

}  // namespace dpl::server
