#include "tests/shared_dir.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace dpl::testing {
namespace fs = std::filesystem;

std::string SharedDir() {
  if (const char* env = std::getenv("DPL_SHARED_DIR"); env && *env) return env;
  std::error_code ec;
  const fs::path anchor = fs::canonical("tests/shared_anchor.txt", ec);
  if (!ec) {
    // <repo>/tests/shared_anchor.txt -> <repo>/../shared
    const fs::path candidate = anchor.parent_path().parent_path().parent_path() / "shared";
    if (fs::is_directory(candidate / "oracle", ec)) return candidate.string();
  }
  // Fallback: walk up from the working directory.
  for (fs::path dir = fs::current_path(ec); !dir.empty(); dir = dir.parent_path()) {
    if (fs::is_directory(dir / "shared" / "oracle", ec)) return (dir / "shared").string();
    if (dir == dir.parent_path()) break;
  }
  std::fprintf(stderr,
               "FATAL: cannot find the shared/ test data folder (set DPL_SHARED_DIR)\n");
  std::abort();
}

std::string TempDir() {
  if (const char* env = std::getenv("TEST_TMPDIR"); env && *env) return env;
  return fs::temp_directory_path().string();
}

}  // namespace dpl::testing
