#include "formats/model_file.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
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
  absl::StatusOr<Container> c = absl::UnknownError("not read");
  DPL_RETURN_IF_ERROR(file.SafeRead([&] {
    c = ContainerOf(file.data(), file.size());
    return absl::OkStatus();
  }));
  DPL_RETURN_IF_ERROR(dpl::Annotate(dpl::StatusOf(c), file.path()));
  return c;
}

}  // namespace

absl::StatusOr<Container> DetectContainer(const std::string& path) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<MappedFile> m, MappedFile::Open(path));
  return ContainerOfFile(*m);
}

const TensorView* ModelFile::Find(absl::string_view name) const {
  return FindIndexed(tensors_, names_, name);
}

absl::StatusOr<const TensorView*> ModelFile::Require(absl::string_view name) const {
  const TensorView* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", name, "' is missing"));
  }
  return t;
}

absl::Status ModelFile::SafeRead(const std::function<absl::Status()>& fn) const {
  return SafeReadOf(mapping_.get(), fn);
}

namespace {

// OK when `bytes` of host memory can be had at all: within the address-space
// limit (ulimit -v) and the machine's physical memory.
absl::Status CheckMemoryFor(uint64_t bytes, absl::string_view what) {
  struct rlimit rl;
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && bytes > rl.rlim_cur) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes,
                                                     " bytes; the address-space limit is ",
                                                     rl.rlim_cur));
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && bytes > static_cast<uint64_t>(pages) * page) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes, " bytes; this machine has ",
                                                     static_cast<uint64_t>(pages) * page));
  }
  return absl::OkStatus();
}

// The compressed data region of `dpl`, inflated in parallel into memory
// allocated for exactly data_bytes (checked first).
absl::StatusOr<std::shared_ptr<uint8_t[]>> Inflate(const DplFile& dpl) {
  const uint64_t bytes = dpl.header().data_bytes;
  DPL_RETURN_IF_ERROR(CheckMemoryFor(bytes, "inflating the compressed data region"));
  std::shared_ptr<uint8_t[]> region(new (std::nothrow) uint8_t[std::max<uint64_t>(bytes, 1)]);
  if (region == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("inflating the compressed data region: cannot allocate ", bytes, " bytes"));
  }
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  DPL_RETURN_IF_ERROR(dpl.DecompressAll(region.get(), threads));
  return region;
}

}  // namespace

// Builds ModelFile views from either container (friend of ModelFile).
class ModelFileBuilder {
 public:
  static std::shared_ptr<ModelFile> FromGguf(std::shared_ptr<GgufFile> gguf, const std::string& path) {
    std::shared_ptr<ModelFile> m = Start(Container::kGguf, path, gguf->metadata(), gguf->mapping());
    for (const GgufTensorInfo& t : gguf->tensors()) {
      m->tensors_.push_back(View(t, t.name, t.offset, gguf->TensorData(t)));
    }
    Index(*m);
    m->owner_ = std::move(gguf);
    return m;
  }

  static absl::StatusOr<std::shared_ptr<ModelFile>> FromDpl(std::shared_ptr<DplFile> dpl,
                                                            const std::string& path, bool inflate) {
    std::shared_ptr<ModelFile> m = Start(Container::kDpl, path, dpl->metadata(), dpl->mapping());
    const uint8_t* region = dpl->data_region();
    std::shared_ptr<uint8_t[]> inflated;
    if (region == nullptr && inflate) {
      absl::StatusOr<std::shared_ptr<uint8_t[]>> r = Inflate(*dpl);
      DPL_RETURN_IF_ERROR(dpl::Annotate(r.status(), path));
      inflated = *std::move(r);
      region = inflated.get();
    }
    for (const DplTensorEntry& t : dpl->tensors()) {
      m->tensors_.push_back(View(t, t.name, t.offset, region == nullptr ? nullptr : region + t.offset));
    }
    Index(*m);
    m->dpl_ = dpl;
    struct Owner {
      std::shared_ptr<DplFile> file;
      std::shared_ptr<uint8_t[]> inflated;
    };
    m->owner_ = std::make_shared<Owner>(Owner{std::move(dpl), std::move(inflated)});
    return m;
  }

 private:
  static std::shared_ptr<ModelFile> Start(Container container, const std::string& path,
                                          const Metadata& metadata,
                                          std::shared_ptr<const MappedFile> mapping) {
    auto m = std::make_shared<ModelFile>();
    m->container_ = container;
    m->path_ = path;
    m->metadata_ = &metadata;  // the container's: owner_ keeps it
    m->mapping_ = std::move(mapping);
    return m;
  }

  // The name index, once every view is in place (the readers refused
  // duplicate names).
  static void Index(ModelFile& m) {
    m.names_.reserve(m.tensors_.size());
    for (size_t i = 0; i < m.tensors_.size(); ++i) m.names_.try_emplace(m.tensors_[i].name, i);
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
