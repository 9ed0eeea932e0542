// One read-only view of a model file, GGUF or .dpl, chosen by its magic:
// metadata plus a table of tensors with their layout and bytes. This is what
// the CPU reference, the tokenizer and the runtime read; they never care
// which container the model came in.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/byte_reader.h"
#include "formats/dpl_file.h"
#include "formats/ggml_types.h"
#include "formats/mapped_file.h"
#include "formats/metadata.h"
#include "formats/tensor_layout.h"

namespace dpl::formats {

// The two containers a model comes in, told apart by their first bytes.
enum class Container {
  kGguf,  // magic "GGUF"
  kDpl,   // magic "DPLMODEL"
};

absl::string_view ContainerName(Container container);  // "gguf", "dpl"

// The container whose magic starts `data`; InvalidArgument ("not a model
// file ...") when it is neither.
absl::StatusOr<Container> ContainerOf(const uint8_t* data, uint64_t size);
// The same for the file at `path`, from its magic alone (nothing is parsed);
// errors name the path. For callers that accept only one container and want
// to say so before parsing.
absl::StatusOr<Container> DetectContainer(const std::string& path);

struct TensorView : TensorGeometry {
  std::string name;
  uint64_t data_offset = 0;       // offset inside the file's data region
  const uint8_t* data = nullptr;  // (n_rows, row_stride) bytes; null: see OpenIndex
};

class ModelFile {
  // Constructed by ModelFile::Open only (public for make_shared).

 public:
  // Opens a GGUF or .dpl file (detected by magic) and validates it fully.
  // A compressed .dpl is inflated into host memory so every view has data;
  // when the region cannot fit (the address-space limit, the machine's
  // memory, or the allocation fails) that is a ResourceExhausted error
  // naming the bytes needed, before anything is allocated.
  static absl::StatusOr<std::shared_ptr<ModelFile>> Open(const std::string& path);
  // Same validation, but the tensor views of a compressed .dpl have
  // data == nullptr: nothing is inflated or allocated for the data region,
  // whatever size the file declares. For callers that need only the metadata
  // and the tensor table (the tokenizer, dpl-inspect, the CUDA loader).
  static absl::StatusOr<std::shared_ptr<ModelFile>> OpenIndex(const std::string& path);

  Container container() const { return container_; }
  const std::string& path() const { return path_; }
  const Metadata& metadata() const { return *metadata_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // The parsed .dpl container under this view (its header, frames and
  // reads: what the CUDA loader copies from), or null for a GGUF.
  const std::shared_ptr<const DplFile>& dpl_file() const { return dpl_; }
  const TensorView* Find(absl::string_view name) const;  // O(1)
  // Same as Find, but an error naming the tensor when it is absent.
  absl::StatusOr<const TensorView*> Require(absl::string_view name) const;
  // Runs fn, which reads tensor data pointing into the mapped file, and
  // turns a truncation of the file meanwhile into an error naming it
  // (MappedFile::SafeRead).
  absl::Status SafeRead(const std::function<absl::Status()>& fn) const;

 private:
  friend class ModelFileBuilder;
  std::shared_ptr<const void> owner_;
  std::shared_ptr<const MappedFile> mapping_;
  std::shared_ptr<const DplFile> dpl_;  // .dpl only
  Container container_ = Container::kGguf;
  std::string path_;
  const Metadata* metadata_ = nullptr;  // the container's, kept alive by owner_
  std::vector<TensorView> tensors_;
  NameIndex names_;
};

}  // namespace dpl::formats
