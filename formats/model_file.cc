#include "formats/model_file.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/dpl_file.h"
#include "formats/gguf.h"
#include "formats/mapped_file.h"

namespace dpl::formats {

absl::string_view ContainerName(Container container) {
  switch (container) {
    case Container::kGguf: return "gguf";
    case Container::kDpl: return "dpl";
  }
  return "unknown";
}

absl::StatusOr<Container> ContainerOf(const uint8_t* data, uint64_t size) {
  if (size >= 4 && std::memcmp(data, "GGUF", 4) == 0) return Container::kGguf;
  if (size >= 8 && std::memcmp(data, kDplMagic, 8) == 0) return Container::kDpl;
  return absl::InvalidArgumentError(
      "not a model file (neither GGUF nor .dpl magic at offset 0)");
}

namespace {

// ContainerOf a mapped file; errors are prefixed with its path.
absl::StatusOr<Container> ContainerOfFile(const MappedFile& file) {
  absl::StatusOr<Container> c = ContainerOf(file.data(), file.size());
  DPL_RETURN_IF_ERROR(dpl::Annotate(dpl::StatusOf(c), file.path()));
  return c;
}

}  // namespace

absl::StatusOr<Container> DetectContainer(const std::string& path) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<MappedFile> m, MappedFile::Open(path));
  return ContainerOfFile(*m);
}

const TensorView* ModelFile::Find(absl::string_view name) const {
  return FindNamed(tensors_, name);
}

absl::StatusOr<const TensorView*> ModelFile::Require(absl::string_view name) const {
  const TensorView* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", name, "' is missing"));
  }
  return t;
}

// Builds ModelFile views from either container (friend of ModelFile).
class ModelFileBuilder {
 public:
  static std::shared_ptr<ModelFile> FromGguf(std::shared_ptr<GgufFile> gguf, const std::string& path) {
    std::shared_ptr<ModelFile> m = Start(Container::kGguf, path, gguf->metadata());
    for (const GgufTensorInfo& t : gguf->tensors()) {
      m->tensors_.push_back(View(t, t.name, t.offset, gguf->TensorData(t)));
    }
    m->owner_ = std::move(gguf);
    return m;
  }

  static absl::StatusOr<std::shared_ptr<ModelFile>> FromDpl(std::shared_ptr<DplFile> dpl,
                                                            const std::string& path, bool inflate) {
    std::shared_ptr<ModelFile> m = Start(Container::kDpl, path, dpl->metadata());
    const uint8_t* region = dpl->data_region();
    std::shared_ptr<std::vector<uint8_t>> decompressed;
    if (region == nullptr && inflate) {
      // Compressed shipping form: inflate the data region once, in parallel.
      decompressed = std::make_shared<std::vector<uint8_t>>(dpl->header().data_bytes);
      const int threads = std::max(1u, std::thread::hardware_concurrency());
      DPL_RETURN_IF_ERROR(dpl::Annotate(dpl->DecompressAll(decompressed->data(), threads), path));
      region = decompressed->data();
    }
    for (const DplTensorEntry& t : dpl->tensors()) {
      m->tensors_.push_back(View(t, t.name, t.offset, region == nullptr ? nullptr : region + t.offset));
    }
    struct Owner {
      std::shared_ptr<DplFile> file;
      std::shared_ptr<std::vector<uint8_t>> decompressed;
    };
    m->owner_ = std::make_shared<Owner>(Owner{std::move(dpl), std::move(decompressed)});
    return m;
  }

 private:
  static std::shared_ptr<ModelFile> Start(Container container, const std::string& path,
                                          const Metadata& metadata) {
    auto m = std::make_shared<ModelFile>();
    m->container_ = container;
    m->path_ = path;
    m->metadata_ = metadata;
    return m;
  }

  static TensorView View(const TensorGeometry& geometry, const std::string& name,
                         uint64_t data_offset, const uint8_t* data) {
    TensorView v;
    v.geometry() = geometry;
    v.name = name;
    v.data_offset = data_offset;
    v.data = data;
    return v;
  }
};

namespace {

absl::StatusOr<std::shared_ptr<ModelFile>> OpenModel(const std::string& path, bool inflate) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<MappedFile> m, MappedFile::Open(path));
  DPL_ASSIGN_OR_RETURN(const Container container, ContainerOfFile(*m));
  switch (container) {
    case Container::kGguf: {
      DPL_ASSIGN_OR_RETURN(GgufFile gguf, ParseMapped<GgufFile>(m));
      return ModelFileBuilder::FromGguf(std::make_shared<GgufFile>(std::move(gguf)), path);
    }
    case Container::kDpl: {
      DPL_ASSIGN_OR_RETURN(DplFile dpl, ParseMapped<DplFile>(m));
      return ModelFileBuilder::FromDpl(std::make_shared<DplFile>(std::move(dpl)), path, inflate);
    }
  }
  return absl::InternalError("unreachable container");
}

}  // namespace

absl::StatusOr<std::shared_ptr<ModelFile>> ModelFile::Open(const std::string& path) {
  return OpenModel(path, /*inflate=*/true);
}

absl::StatusOr<std::shared_ptr<ModelFile>> ModelFile::OpenIndex(const std::string& path) {
  return OpenModel(path, /*inflate=*/false);
}

}  // namespace dpl::formats
