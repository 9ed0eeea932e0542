#include "formats/model_file.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "formats/dpl_file.h"
#include "formats/gguf.h"
#include "formats/mapped_file.h"

namespace dpl::formats {

absl::string_view TensorLayoutName(TensorLayout layout) {
  switch (layout) {
    case TensorLayout::kRaw: return "raw";
    case TensorLayout::kDplQ6K: return "dpl_q6k";
  }
  return "unknown";
}

const TensorView* ModelFile::Find(absl::string_view name) const {
  for (const TensorView& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<const TensorView*> ModelFile::Require(absl::string_view name) const {
  const TensorView* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", name, "' is missing"));
  }
  return t;
}

}  // namespace dpl::formats

namespace dpl::formats {

// Builds ModelFile views from either container (friend of ModelFile).
class ModelFileBuilder {
 public:
  static std::shared_ptr<ModelFile> FromGguf(std::shared_ptr<GgufFile> gguf, const std::string& path) {
    auto m = std::make_shared<ModelFile>();
    m->container_ = "gguf";
    m->path_ = path;
    m->metadata_ = gguf->metadata();
    m->tensors_.reserve(gguf->tensors().size());
    for (const GgufTensorInfo& t : gguf->tensors()) {
      TensorView v;
      v.name = t.name;
      v.type = t.type;
      v.layout = TensorLayout::kRaw;
      v.n_dims = t.n_dims;
      v.ne = t.ne;
      v.n_rows = t.n_rows;
      v.row_stride = t.row_bytes;
      v.n_bytes = t.n_bytes;
      v.data_offset = t.offset;
      v.data = gguf->TensorData(t);
      m->tensors_.push_back(std::move(v));
    }
    m->owner_ = std::move(gguf);
    return m;
  }

  static absl::StatusOr<std::shared_ptr<ModelFile>> FromDpl(std::shared_ptr<DplFile> dpl,
                                                            const std::string& path, bool inflate) {
    auto m = std::make_shared<ModelFile>();
    m->container_ = "dpl";
    m->path_ = path;
    m->metadata_ = dpl->metadata();
    const uint8_t* region = dpl->data_region();
    std::shared_ptr<std::vector<uint8_t>> decompressed;
    if (region == nullptr && inflate) {
      // Compressed shipping form: inflate the data region once, in parallel.
      decompressed = std::make_shared<std::vector<uint8_t>>(dpl->header().data_bytes);
      const int threads = std::max(1u, std::thread::hardware_concurrency());
      absl::Status s = dpl->DecompressAll(decompressed->data(), threads);
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
      region = decompressed->data();
    }
    for (const DplTensorEntry& t : dpl->tensors()) {
      TensorView v;
      v.name = t.name;
      v.type = t.type;
      v.layout = t.layout;
      v.n_dims = t.n_dims;
      v.ne = t.ne;
      v.n_rows = t.n_rows;
      v.row_stride = t.row_stride;
      v.n_bytes = t.n_bytes;
      v.data_offset = t.offset;
      v.data = region == nullptr ? nullptr : region + t.offset;
      m->tensors_.push_back(std::move(v));
    }
    struct Owner {
      std::shared_ptr<DplFile> file;
      std::shared_ptr<std::vector<uint8_t>> decompressed;
    };
    m->owner_ = std::make_shared<Owner>(Owner{std::move(dpl), std::move(decompressed)});
    return m;
  }
};

namespace {

absl::StatusOr<std::shared_ptr<ModelFile>> OpenModel(const std::string& path, bool inflate) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  const std::shared_ptr<MappedFile> m = *mapped;
  if (m->size() >= 4 && std::memcmp(m->data(), "GGUF", 4) == 0) {
    auto gguf = GgufFile::Parse(m->data(), m->size(), m);
    if (!gguf.ok()) {
      return absl::Status(gguf.status().code(), absl::StrCat(path, ": ", gguf.status().message()));
    }
    return ModelFileBuilder::FromGguf(std::make_shared<GgufFile>(std::move(*gguf)), path);
  }
  if (m->size() >= 8 && std::memcmp(m->data(), kDplMagic, 8) == 0) {
    auto dpl = DplFile::Parse(m->data(), m->size(), m);
    if (!dpl.ok()) {
      return absl::Status(dpl.status().code(), absl::StrCat(path, ": ", dpl.status().message()));
    }
    return ModelFileBuilder::FromDpl(std::make_shared<DplFile>(std::move(*dpl)), path, inflate);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": not a model file (neither GGUF nor .dpl magic at offset 0)"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<ModelFile>> ModelFile::Open(const std::string& path) {
  return OpenModel(path, /*inflate=*/true);
}

absl::StatusOr<std::shared_ptr<ModelFile>> ModelFile::OpenIndex(const std::string& path) {
  return OpenModel(path, /*inflate=*/false);
}

}  // namespace dpl::formats
