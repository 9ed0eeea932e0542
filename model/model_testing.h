// Hostile model files for tests: a copy of a GGUF with its metadata and
// tensor list edited, written next to the test's other output.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "formats/gguf.h"
#include "formats/metadata.h"

namespace dpl::model::testing {

// One tensor of the copy: its name, shape and type, and the tensor of the
// source whose bytes it starts with ("" or a missing name: zeros).
struct TensorEdit {
  formats::GgufTensorSpec spec;
  std::string source;
};
using VariantEdit = std::function<void(formats::Metadata&, std::vector<TensorEdit>&)>;

// Writes the GGUF `src` to `dst` after `edit` changed its metadata and its
// tensors (in file order, each initially a copy of itself).
absl::Status WriteVariant(const std::string& src, const std::string& dst, const VariantEdit& edit);

// The tensor called `name`, or null.
TensorEdit* FindEdit(std::vector<TensorEdit>& tensors, absl::string_view name);
// Drops the tensor called `name`, if there is one.
void EraseEdit(std::vector<TensorEdit>& tensors, absl::string_view name);

}  // namespace dpl::model::testing
