#include "formats/hostile_files.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dpl::formats::hostile {
namespace {

template <typename T>
void Put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void PutStr(std::string& s, const std::string& v) {
  Put<uint64_t>(s, v.size());
  s += v;
}

std::string Zstd(const char* data, uint64_t n) {
  std::string z(ZSTD_compressBound(n), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), data, n, 3));
  return z;
}

// The compressed data frames of `data` in frames of `frame_bytes`.
std::vector<std::string> Frames(const std::string& data, uint64_t frame_bytes) {
  std::vector<std::string> frames;
  for (uint64_t at = 0; at < data.size(); at += frame_bytes) {
    frames.push_back(Zstd(data.data() + at, std::min<uint64_t>(frame_bytes, data.size() - at)));
  }
  return frames;
}

}  // namespace

void RawGguf::AddString(const std::string& key, const std::string& value) {
  AddRaw(EncodedPair(key, 8, U64(value.size()) + value));
}
void RawGguf::AddU32(const std::string& key, uint32_t v) { AddRaw(EncodedPair(key, 4, U32(v))); }
void RawGguf::AddRaw(const std::string& encoded) {
  kv_bytes += encoded;
  ++n_kv;
}

std::string RawGguf::Build() const {
  std::string s;
  Put<uint32_t>(s, magic);
  Put<uint32_t>(s, version);
  Put<uint64_t>(s, n_tensors_override != UINT64_MAX ? n_tensors_override : tensors.size());
  Put<uint64_t>(s, n_kv_override != UINT64_MAX ? n_kv_override : n_kv);
  s += kv_bytes;
  for (const RawTensor& t : tensors) {
    PutStr(s, t.name);
    Put<uint32_t>(s, t.n_dims_override ? t.n_dims_override : t.ne.size());
    for (uint64_t n : t.ne) Put<uint64_t>(s, n);
    Put<uint32_t>(s, t.type);
    Put<uint64_t>(s, t.offset);
  }
  s.resize((s.size() + alignment - 1) / alignment * alignment, '\0');
  s.append(data_bytes, '\x11');
  if (truncate_to >= 0) s.resize(truncate_to);
  return s;
}

RawGguf ValidGguf() {
  RawGguf g;
  g.AddString("general.architecture", "llama");
  g.AddU32("llama.block_count", 1);
  g.tensors.push_back({"a.weight", {8, 2}, 0, 0});      // 64 bytes
  g.tensors.push_back({"b.weight", {256, 1}, 12, 64});  // 144 bytes
  g.tensors.push_back({"c.weight", {4}, 0, 224});       // 16 bytes
  g.data_bytes = 256;
  return g;
}

std::string U64(uint64_t v) { std::string s; Put<uint64_t>(s, v); return s; }
std::string U32(uint32_t v) { std::string s; Put<uint32_t>(s, v); return s; }

std::string EncodedPair(const std::string& key, uint32_t type, const std::string& payload) {
  std::string s;
  PutStr(s, key);
  Put<uint32_t>(s, type);
  return s + payload;
}

std::string DplSpec::Build() const {
  std::vector<DplTensorEntry> es = entries;
  for (DplTensorEntry& e : es) e.xxh3 = XXH3_64bits(data.data() + e.offset, e.n_bytes);
  if (patch_entries) patch_entries(es);
  std::string meta_raw;
  SerializeGgufKv(meta, meta_raw);
  uint64_t meta_count = meta.size();
  if (patch_meta) patch_meta(meta_raw, meta_count);
  std::string meta_z = Zstd(meta_raw.data(), meta_raw.size());
  if (patch_meta_frame) patch_meta_frame(meta_z);
  std::string table;
  for (const DplTensorEntry& e : es) EncodeDplTensorEntry(e, table);
  std::vector<std::string> frames;
  if (compressed) frames = Frames(data, frame_bytes);
  if (patch_frames) patch_frames(frames);
  DplHeader h;
  h.version = DplVersionFor(es);
  h.flags = compressed ? kDplFlagCompressed : 0;
  h.meta_offset = kDplHeaderBytes;
  h.meta_stored_bytes = meta_z.size();
  h.meta_raw_bytes = meta_raw.size();
  h.meta_count = meta_count;
  h.table_offset = h.meta_offset + meta_z.size();
  h.table_bytes = table.size();
  h.n_tensors = es.size();
  uint64_t end = h.table_offset + table.size();
  std::string frame_index;
  uint64_t stored = compressed ? 0 : data.size();
  if (compressed) {
    h.frames_offset = end;
    h.n_frames = frames.size();
    h.frame_raw_bytes = frame_bytes;
    for (const std::string& z : frames) {
      frame_index += U64(stored) + U64(z.size());
      stored += z.size();
    }
    end += frame_index.size();
  }
  h.data_offset = (end + kDplDataAlignment - 1) / kDplDataAlignment * kDplDataAlignment;
  h.data_bytes = data.size();
  h.data_stored_bytes = stored;
  h.file_bytes = h.data_offset + stored;
  std::string index(h.data_offset - kDplHeaderBytes, '\0');
  std::memcpy(index.data(), meta_z.data(), meta_z.size());
  std::memcpy(index.data() + (h.table_offset - kDplHeaderBytes), table.data(), table.size());
  if (compressed) {
    std::memcpy(index.data() + (h.frames_offset - kDplHeaderBytes), frame_index.data(),
                frame_index.size());
  }
  if (patch_header) patch_header(h);
  h.index_xxh3 = XXH3_64bits(index.data(), index.size());
  std::string image = EncodeDplHeader(h) + index;
  if (compressed) {
    for (const std::string& z : frames) image += z;
  } else {
    image += data;
  }
  if (patch_image) patch_image(image);
  return image;
}

DplTensorEntry Entry(const std::string& name, GgmlType type, TensorLayout layout,
                     std::vector<uint64_t> ne, uint64_t offset) {
  DplTensorEntry e;
  e.name = name;
  e.type = type;
  e.layout = layout;
  e.n_dims = ne.size();
  for (size_t i = 0; i < ne.size(); ++i) e.ne[i] = ne[i];
  e.n_rows = e.ne[1] * e.ne[2] * e.ne[3];
  e.row_stride = *RowStrideFor(type, layout, e.ne[0]);
  e.n_bytes = e.n_rows * e.row_stride;
  e.offset = offset;
  return e;
}

DplSpec ValidDpl() {
  DplSpec s;
  s.meta.Set("general.architecture", MetaValue::String("llama"));
  s.meta.Set("llama.block_count", MetaValue::U32(1));
  s.entries.push_back(Entry("norm.weight", GgmlType::kF32, TensorLayout::kRaw, {64}, 0));          // 256
  s.entries.push_back(Entry("w6.weight", GgmlType::kQ6_K, TensorLayout::kDpl, {512, 2}, 256));  // 2 x 432
  s.entries.push_back(Entry("w4.weight", GgmlType::kQ4_K, TensorLayout::kRaw, {256, 3}, 1280));    // 432
  s.data.resize(2048);
  for (size_t i = 0; i < s.data.size(); ++i) s.data[i] = static_cast<char>(i * 131 + 7);
  return s;
}

DplSpec ValidDplV2() {
  DplSpec s = ValidDpl();
  s.entries.push_back(Entry("w8.weight", GgmlType::kQ8_0, TensorLayout::kDpl, {64, 2}, 1792));  // 2 x 80
  s.entries.push_back(Entry("w40.weight", GgmlType::kQ4_0, TensorLayout::kDpl, {96, 1}, 2048));  // 64
  s.data.resize(2304);
  for (size_t i = 0; i < s.data.size(); ++i) s.data[i] = static_cast<char>(i * 131 + 7);
  return s;
}

std::string ZeroZstdFrame(uint64_t n) {
  constexpr uint64_t kBlock = 128 * 1024;
  std::string z = U32(0xFD2FB528);  // magic
  z += '\xE0';                      // single segment, 8-byte content size
  z += U64(n);
  uint64_t left = n;
  do {
    const uint64_t b = std::min(left, kBlock);
    left -= b;
    const uint32_t header = static_cast<uint32_t>(b << 3 | 1u << 1 | (left == 0 ? 1u : 0u));  // RLE
    z.append(reinterpret_cast<const char*>(&header), 3);
    z += '\0';
  } while (left > 0);
  return z;
}

namespace {

constexpr uint64_t kGiB = 1ull << 30;

CraftedFile Dpl(const std::string& name, const std::function<void(DplSpec&)>& corrupt,
                const std::string& expect, bool compressed,
                const std::function<void(DplSpec&)>& twin_edit = nullptr,
                DplSpec (*base)() = ValidDpl) {
  DplSpec bad = base(), twin = base();
  bad.compressed = twin.compressed = compressed;
  corrupt(bad);
  if (twin_edit) twin_edit(twin);
  return {name, "dpl", bad.Build(), twin.Build(), expect};
}

CraftedFile Gguf(const std::string& name, const std::function<void(RawGguf&)>& corrupt,
                 const std::function<void(RawGguf&)>& twin_edit, const std::string& expect) {
  RawGguf bad = ValidGguf(), twin = ValidGguf();
  corrupt(bad);
  twin_edit(twin);
  return {name, "gguf", bad.Build(), twin.Build(), expect};
}

// n keys "k.0" .. "k.(n-1)", u32 each, encoded as GGUF pairs.
std::string ManyKeys(uint64_t n) {
  std::string kv;
  for (uint64_t i = 0; i < n; ++i) kv += EncodedPair(absl::StrCat("k.", i), 4, U32(i));
  return kv;
}

constexpr uint64_t kManyKeys = 100000;

std::vector<CraftedFile> DplCrafted() {
  std::vector<CraftedFile> out;
  // Issue 11 case 1: (data_bytes + frame - 1) / frame wrapped to 0 frames.
  out.push_back(Dpl("DPL_DATA_BYTES_WRAPS_FRAME_COUNT", [](DplSpec& s) {
    s.patch_frames = [](std::vector<std::string>& f) { f.clear(); };
    s.patch_header = [](DplHeader& h) { h.data_bytes = UINT64_MAX; };
  }, "frame count", true));
  // Case 2: 1024 one-byte frames declaring 2^40 bytes.
  out.push_back(Dpl("DPL_ONE_BYTE_FRAMES_DECLARE_2_40", [](DplSpec& s) {
    s.patch_frames = [](std::vector<std::string>& f) { f.assign(1024, "x"); };
    s.patch_header = [](DplHeader& h) { h.data_bytes = 1ull << 40; h.frame_raw_bytes = kGiB; };
  }, "not a zstd frame with a declared content size", true));
  out.push_back(Dpl("DPL_FRAME_CONTENT_SIZE_LIES", [](DplSpec& s) {
    s.patch_frames = [](std::vector<std::string>& f) { f[0] = ZeroZstdFrame(1000); };
  }, "its zstd header declares 1000 bytes", true));
  // A well-formed 128 KB file whose frames inflate to 4 GiB of zeros: the
  // index opens without allocating it; inflating it must be refused under a
  // 3 GB address-space limit before anything is allocated.
  out.push_back(Dpl("DPL_4GIB_REGION_IN_128KB", [](DplSpec& s) {
    s.patch_frames = [](std::vector<std::string>& f) { f.assign(4, ZeroZstdFrame(kGiB)); };
    s.patch_header = [](DplHeader& h) { h.data_bytes = 4 * kGiB; h.frame_raw_bytes = kGiB; };
  }, "needs 4294967296 bytes", true));
  // Case 7: 400 MB of metadata in a 12 KB zstd frame.
  out.push_back(Dpl("DPL_METADATA_DECLARES_400MB", [](DplSpec& s) {
    s.patch_meta_frame = [](std::string& z) { z = ZeroZstdFrame(400000000); };
    s.patch_header = [](DplHeader& h) { h.meta_raw_bytes = 400000000; };
  }, "metadata size", false));
  // Case 7: 100,000 keys and then a duplicate: linear time, named error.
  out.push_back(Dpl("DPL_100K_KEYS_THEN_DUPLICATE", [](DplSpec& s) {
    s.patch_meta = [](std::string& raw, uint64_t& count) {
      raw += ManyKeys(kManyKeys) + EncodedPair("k.7", 4, U32(0));
      count += kManyKeys + 1;
    };
  }, "duplicate key 'k.7'", false, [](DplSpec& s) {
    s.patch_meta = [](std::string& raw, uint64_t& count) {
      raw += ManyKeys(kManyKeys);
      count += kManyKeys;
    };
  }));
  out.push_back(Dpl("DPL_TENSOR_NAME_NUL", [](DplSpec& s) {
    s.entries[1].name = std::string("w6\0weight", 9);
  }, "a NUL byte", false));
  out.push_back(Dpl("DPL_TENSOR_NAME_INVALID_UTF8", [](DplSpec& s) {
    s.entries[1].name = "w6.\xff\xfeweight";
  }, "byte 0xff is not valid UTF-8", false));
  // Issue 9: q8_0 and q4_0 planes stamped version 1, which a version-1
  // reader would take for raw blocks; the twin is the same file as version 2.
  out.push_back(Dpl("DPL_Q8_0_PLANES_IN_VERSION_1", [](DplSpec& s) {
    s.patch_header = [](DplHeader& h) { h.version = kDplVersionQ6KDpl; };
  }, "tensor 'w8.weight' layout at offset", false, nullptr, ValidDplV2));
  out.push_back(Dpl("DPL_VERSION_3", [](DplSpec& s) {
    s.patch_header = [](DplHeader& h) { h.version = 3; };
  }, "3 is not supported (this reader knows versions 1 to 2)", true, nullptr, ValidDplV2));
  return out;
}

std::vector<CraftedFile> GgufCrafted() {
  std::vector<CraftedFile> out;
  const auto none = [](RawGguf&) {};
  out.push_back(Gguf("GGUF_100K_KEYS_THEN_DUPLICATE", [](RawGguf& g) {
    g.kv_bytes += ManyKeys(kManyKeys) + EncodedPair("k.99999", 4, U32(0));
    g.n_kv += kManyKeys + 1;
  }, [](RawGguf& g) {
    g.kv_bytes += ManyKeys(kManyKeys);
    g.n_kv += kManyKeys;
  }, "duplicate key 'k.99999'"));
  out.push_back(Gguf("GGUF_TENSOR_NAME_NUL", [](RawGguf& g) {
    g.tensors[1].name = std::string("b\0weight", 8);
  }, none, "a NUL byte"));
  out.push_back(Gguf("GGUF_TENSOR_NAME_INVALID_UTF8", [](RawGguf& g) {
    g.tensors[1].name = "b.\xc0\xafweight";  // an overlong '/'
  }, [](RawGguf& g) { g.tensors[1].name = "b.\xc3\xa4weight"; }, "byte 0xc0 is not valid UTF-8"));
  return out;
}

}  // namespace

std::vector<CraftedFile> CraftedFiles() {
  std::vector<CraftedFile> out = DplCrafted();
  for (CraftedFile& f : GgufCrafted()) out.push_back(std::move(f));
  return out;
}

}  // namespace dpl::formats::hostile
