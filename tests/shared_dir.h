// Locates ../shared (llama.cpp's oracle models and vocab test vectors) from a
// test. Bazel runs tests inside a runfiles tree of symlinks; the symlink of
// tests/shared_anchor.txt points back into the checkout, whose sibling is
// shared/. DPL_SHARED_DIR overrides the search.
#pragma once

#include <string>

namespace dpl::testing {

// Absolute path of the shared folder, e.g. "/work/shared". Aborts the test
// binary with a message if it cannot be found (a test without its data must
// fail loudly, never pass vacuously).
std::string SharedDir();

// A scratch directory for the test's output files (TEST_TMPDIR under Bazel).
std::string TempDir();

}  // namespace dpl::testing
