// Hostile model files, built in memory field by field: the GGUF and .dpl
// image builders the reader tests corrupt (RawGguf, DplSpec), and the
// crafted files of issue 11 (each with its clean twin) that the table-driven
// test runs under memory and time bounds and tools/fuzz.sh writes as seeds
// (formats/fuzz:write_seeds). Test-only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/dpl_file.h"
#include "formats/gguf.h"
#include "formats/metadata.h"

namespace dpl::formats::hostile {

// A GGUF image assembled field by field, so a test can corrupt any one field.
struct RawTensor {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
  uint32_t n_dims_override = 0;  // 0: ne.size()
};

struct RawGguf {
  uint32_t magic = kGgufMagic;
  uint32_t version = 3;
  uint64_t n_tensors_override = UINT64_MAX;  // UINT64_MAX: tensors.size()
  uint64_t n_kv_override = UINT64_MAX;
  std::string kv_bytes;  // already-encoded key/value pairs
  uint64_t n_kv = 0;
  std::vector<RawTensor> tensors;
  uint64_t alignment = 32;
  uint64_t data_bytes = 0;  // data section size to append
  int64_t truncate_to = -1;

  void AddString(const std::string& key, const std::string& value);
  void AddU32(const std::string& key, uint32_t v);
  void AddRaw(const std::string& encoded);  // a pair encoded by the test
  std::string Build() const;
};

// A small valid GGUF: two f32 tensors and one q4_K tensor.
RawGguf ValidGguf();

// Little-endian encodings for hand-made pairs.
std::string U64(uint64_t v);
std::string U32(uint32_t v);
std::string EncodedPair(const std::string& key, uint32_t type, const std::string& payload);

// A .dpl image built from parts; hooks let a test corrupt any field before
// (or after) the checksums are computed.
struct DplSpec {
  Metadata meta;
  std::vector<DplTensorEntry> entries;  // offsets/strides filled by the test
  std::string data;                     // the logical data region
  bool compressed = false;
  uint64_t frame_bytes = kDplMinFrameBytes;
  std::function<void(std::vector<DplTensorEntry>&)> patch_entries;  // after checksums
  std::function<void(std::string& meta_raw, uint64_t& count)> patch_meta;
  std::function<void(std::string& meta_z)> patch_meta_frame;  // the compressed metadata
  std::function<void(std::vector<std::string>& frames)> patch_frames;  // compressed data frames
  std::function<void(DplHeader&)> patch_header;  // before checksums
  std::function<void(std::string& image)> patch_image;  // after checksums

  std::string Build() const;
};

DplTensorEntry Entry(const std::string& name, GgmlType type, TensorLayout layout,
                     std::vector<uint64_t> ne, uint64_t offset);

// Valid .dpl base, format version 1: an f32 vector, a q6_K matrix in dpl
// layout (2 rows of 512), a q4_K matrix; data region filled with a byte
// pattern. Build() stamps the version its entries need (DplVersionFor).
DplSpec ValidDpl();

// Valid version 2 base: ValidDpl plus a q8_0 (2 rows of 64) and a q4_0 (1
// row of 96) matrix in dpl layout.
DplSpec ValidDplV2();

// A zstd frame of `n` zero bytes made of RLE blocks (4 bytes per 128 KiB),
// its content size in the header: what a "zip bomb" frame looks like, built
// without touching n bytes.
std::string ZeroZstdFrame(uint64_t n);

// One crafted file of issue 11 and its closest valid twin.
struct CraftedFile {
  std::string name;     // NAME_IN_CAPITALS
  std::string ext;      // "gguf" or "dpl"
  std::string bad;      // the image
  std::string twin;
  std::string expect;   // substring of the error opening `bad` must give
};

// Every crafted file of issue 11 that formats/ can reject on its own (model
// hyperparameters are model_test's): the frame-count wrap, one-byte frames
// declaring 2^40, a valid 4 GiB zero region in a tiny file, 100,000
// metadata keys (valid: must parse fast), metadata declaring 400 MB, NUL and
// invalid-UTF-8 tensor names in both containers; and issue 9's versions:
// q8_0 planes in a version 1 file, an unknown version 3 (twins: version 2).
std::vector<CraftedFile> CraftedFiles();

}  // namespace dpl::formats::hostile
