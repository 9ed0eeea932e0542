#include "model/model_testing.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace dpl::model::testing {

absl::Status WriteVariant(const std::string& src, const std::string& dst, const VariantEdit& edit) {
  DPL_ASSIGN_OR_RETURN(const formats::GgufFile file, formats::GgufFile::Open(src));
  formats::Metadata meta = file.metadata();
  std::vector<TensorEdit> tensors;
  for (const formats::GgufTensorInfo& t : file.tensors()) {
    tensors.push_back(
        {{t.name, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), t.type}, t.name});
  }
  edit(meta, tensors);
  std::vector<formats::GgufTensorSpec> specs;
  for (const TensorEdit& t : tensors) specs.push_back(t.spec);
  DPL_ASSIGN_OR_RETURN(const formats::GgufHeader header, formats::BuildGgufHeader(meta, specs));
  std::string data(header.data_bytes, '\0');
  for (size_t i = 0; i < tensors.size(); ++i) {
    const formats::GgufTensorInfo* s = file.FindTensor(tensors[i].source);
    if (s == nullptr) continue;
    std::memcpy(&data[header.offsets[i]], file.TensorData(*s),
                std::min<uint64_t>(s->n_bytes, header.sizes[i]));
  }
  std::ofstream out(dst, std::ios::binary);
  out << header.bytes << data;
  if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", dst));
  return absl::OkStatus();
}

TensorEdit* FindEdit(std::vector<TensorEdit>& tensors, absl::string_view name) {
  for (TensorEdit& t : tensors) {
    if (t.spec.name == name) return &t;
  }
  return nullptr;
}

void EraseEdit(std::vector<TensorEdit>& tensors, absl::string_view name) {
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [name](const TensorEdit& t) { return t.spec.name == name; }),
                tensors.end());
}

}  // namespace dpl::model::testing
