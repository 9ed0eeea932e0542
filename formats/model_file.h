// One read-only view of a model file, GGUF or .dpl, chosen by its magic:
// metadata plus a table of tensors with their layout and bytes. This is what
// the CPU reference, the tokenizer and the runtime read; they never care
// which container the model came in.
#pragma once

#include "absl/strings/string_view.h"
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include <vector>

#include "absl/status/statusor.h"
#include "formats/ggml_types.h"
#include "formats/metadata.h"

namespace dpl::formats {

// How a tensor's rows are arranged in the file.
enum class TensorLayout : uint32_t {
  // GGUF's own bytes: each row is ne[0]/block_elems consecutive blocks.
  kRaw = 0,
  // q6_K rows in the dense split-plane layout: per row
  // [ql: nbe*128][qh: nbe*64][sc: nbe*16][d: nbe*2], stride (nbe*210+15)&~15.
  // Why: no dead padding per block and 16-byte aligned rows, so decode
  // kernels stream only content bytes with aligned 16-byte loads.
  kDplQ6K = 1,
};

absl::string_view TensorLayoutName(TensorLayout layout);  // "raw", "dpl_q6k"

struct TensorView {
  std::string name;
  GgmlType type = GgmlType::kF32;
  TensorLayout layout = TensorLayout::kRaw;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne = {1, 1, 1, 1};  // ne[0] = row length (elements)
  uint64_t n_rows = 0;       // ne[1] * ne[2] * ne[3]
  uint64_t row_stride = 0;   // bytes from one row to the next
  uint64_t n_bytes = 0;      // n_rows * row_stride
  uint64_t data_offset = 0;  // offset inside the file's data region
  const uint8_t* data = nullptr;  // (n_rows, row_stride) bytes; null: see OpenIndex
};

class ModelFile {
  // Constructed by ModelFile::Open only (public for make_shared).

 public:
  // Opens a GGUF or .dpl file (detected by magic) and validates it fully.
  // A compressed .dpl is inflated into host memory so every view has data.
  static absl::StatusOr<std::shared_ptr<ModelFile>> Open(const std::string& path);
  // Same validation, but the tensor views of a compressed .dpl have
  // data == nullptr (nothing is inflated): for callers that need only the
  // metadata and the tensor table, such as the CUDA loader.
  static absl::StatusOr<std::shared_ptr<ModelFile>> OpenIndex(const std::string& path);

  absl::string_view container() const { return container_; }  // "gguf" or "dpl"
  const std::string& path() const { return path_; }
  const Metadata& metadata() const { return metadata_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* Find(absl::string_view name) const;
  // Same as Find, but an error naming the tensor when it is absent.
  absl::StatusOr<const TensorView*> Require(absl::string_view name) const;

 private:
  friend class ModelFileBuilder;
  std::shared_ptr<const void> owner_;
  std::string container_;
  std::string path_;
  Metadata metadata_;
  std::vector<TensorView> tensors_;
};

}  // namespace dpl::formats
