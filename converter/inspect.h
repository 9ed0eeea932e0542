// dpl-inspect: a readable (or JSON) account of a GGUF or .dpl file: header
// (a .dpl's format version too), metadata (long arrays summarized), tensor
// table, bytes per type and layout, and the planes of every type the file
// stores in the dpl layout.
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace dpl::converter {

struct InspectOptions {
  bool json = false;
  bool verify_checksums = false;  // .dpl only: recompute every tensor's XXH3
  size_t max_array_elems = 8;     // array elements shown before "..."
};

// Writes the report for the file at `path` to `out`. Errors (unreadable or
// invalid file, checksum mismatch, checksums asked of a GGUF) name the file.
absl::Status Inspect(const std::string& path, const InspectOptions& options, std::ostream& out);

}  // namespace dpl::converter
