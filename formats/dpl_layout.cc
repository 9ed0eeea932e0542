#include "formats/dpl_layout.h"

#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace dpl::formats {

absl::Status CheckDplType(GgmlType type) {
  if (HasDplPlanes(type)) return absl::OkStatus();
  std::vector<absl::string_view> defined;
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<GgmlTypeTraits> tr = FindGgmlType(id);
    if (tr && HasDplPlanes(tr->type)) defined.push_back(tr->name);
  }
  return absl::InvalidArgumentError(absl::StrCat("type ", TraitsOf(type).name,
                                                 " has no dpl layout (it is defined for ",
                                                 absl::StrJoin(defined, ", "), ")"));
}

uint64_t DplRowStride(GgmlType type, uint64_t nbe) {
  return LayoutRowStride(TensorLayout::kDpl, nbe, TraitsOf(type).block_bytes);
}

absl::Status RowToDpl(GgmlType type, const uint8_t* raw_row, uint64_t nbe, uint8_t* dpl_row) {
  DPL_RETURN_IF_ERROR(CheckDplType(type));
  const DplPlaneSpec spec = DplPlanesOf(type);
  const uint32_t block_bytes = TraitsOf(type).block_bytes;
  for (uint32_t p = 0; p < spec.n; ++p) {
    const BlockField& f = spec.f[p];
    uint8_t* plane = dpl_row + DplPlaneOffset(spec, p, nbe);  // (nbe, f.bytes)
    for (uint64_t i = 0; i < nbe; ++i) {
      std::memcpy(plane + i * f.bytes, raw_row + i * block_bytes + f.offset, f.bytes);
    }
  }
  const uint64_t content = DplPlaneOffset(spec, spec.n, nbe);
  std::memset(dpl_row + content, 0, DplRowStride(type, nbe) - content);
  return absl::OkStatus();
}

absl::Status DplRowToRaw(GgmlType type, const uint8_t* dpl_row, uint64_t nbe, uint8_t* raw_row) {
  DPL_RETURN_IF_ERROR(CheckDplType(type));
  const DplPlaneSpec spec = DplPlanesOf(type);
  const uint32_t block_bytes = TraitsOf(type).block_bytes;
  for (uint32_t p = 0; p < spec.n; ++p) {
    const BlockField& f = spec.f[p];
    const uint8_t* plane = dpl_row + DplPlaneOffset(spec, p, nbe);  // (nbe, f.bytes)
    for (uint64_t i = 0; i < nbe; ++i) {
      std::memcpy(raw_row + i * block_bytes + f.offset, plane + i * f.bytes, f.bytes);
    }
  }
  return absl::OkStatus();
}

std::string DplPlanesString(GgmlType type) {
  const DplPlaneSpec spec = DplPlanesOf(type);
  std::vector<std::string> planes;
  for (uint32_t p = 0; p < spec.n; ++p) {
    planes.push_back(absl::StrCat(spec.f[p].name, "[", spec.f[p].bytes, "]"));
  }
  return absl::StrJoin(planes, " | ");
}

}  // namespace dpl::formats
