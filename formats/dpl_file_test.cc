// The .dpl reader on hostile input: a table of named corrupt files (with
// checksums recomputed, so each reaches the check it targets), each beside a
// passing twin; plus compressed-form round trips.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "formats/dpl_file.h"
#include "formats/q6k_dpl.h"

namespace dpl::formats {
namespace {

// Builds a .dpl image from parts; hooks let a test corrupt any field before
// (or after) the checksums are computed.
struct DplSpec {
  Metadata meta;
  std::vector<DplTensorEntry> entries;  // offsets/strides filled by the test
  std::string data;                     // the logical data region
  bool compressed = false;
  uint64_t frame_bytes = kDplMinFrameBytes;
  std::function<void(std::vector<DplTensorEntry>&)> patch_entries;  // after checksums
  std::function<void(std::string& meta_raw, uint64_t& count)> patch_meta;
  std::function<void(DplHeader&)> patch_header;  // before checksums
  std::function<void(std::string& image)> patch_image;  // after checksums

  std::string Build() const {
    std::vector<DplTensorEntry> es = entries;
    for (DplTensorEntry& e : es) e.xxh3 = XXH3_64bits(data.data() + e.offset, e.n_bytes);
    if (patch_entries) patch_entries(es);
    std::string meta_raw;
    SerializeGgufKv(meta, meta_raw);
    uint64_t meta_count = meta.size();
    if (patch_meta) patch_meta(meta_raw, meta_count);
    std::string meta_z(ZSTD_compressBound(meta_raw.size()), '\0');
    meta_z.resize(ZSTD_compress(meta_z.data(), meta_z.size(), meta_raw.data(), meta_raw.size(), 3));
    std::string table;
    for (const DplTensorEntry& e : es) EncodeDplTensorEntry(e, table);
    std::vector<std::string> frames;
    if (compressed) {
      for (uint64_t at = 0; at < data.size(); at += frame_bytes) {
        const uint64_t n = std::min<uint64_t>(frame_bytes, data.size() - at);
        std::string z(ZSTD_compressBound(n), '\0');
        z.resize(ZSTD_compress(z.data(), z.size(), data.data() + at, n, 3));
        frames.push_back(z);
      }
    }
    DplHeader h;
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
    uint64_t stored = 0;
    if (compressed) {
      h.frames_offset = end;
      h.n_frames = frames.size();
      h.frame_raw_bytes = frame_bytes;
      for (const std::string& z : frames) {
        const uint64_t pair[2] = {stored, z.size()};
        frame_index.append(reinterpret_cast<const char*>(pair), 16);
        stored += z.size();
      }
      end += frame_index.size();
    } else {
      stored = data.size();
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
};

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

// Valid base: an f32 vector, a q6_K matrix in dpl layout (2 rows of 512),
// a q4_K matrix; data region filled with a byte pattern.
DplSpec ValidBase() {
  DplSpec s;
  s.meta.Set("general.architecture", MetaValue::String("llama"));
  s.meta.Set("llama.block_count", MetaValue::U32(1));
  s.entries.push_back(Entry("norm.weight", GgmlType::kF32, TensorLayout::kRaw, {64}, 0));        // 256
  s.entries.push_back(Entry("w6.weight", GgmlType::kQ6_K, TensorLayout::kDplQ6K, {512, 2}, 256));  // 2 x 432
  s.entries.push_back(Entry("w4.weight", GgmlType::kQ4_K, TensorLayout::kRaw, {256, 3}, 1280));    // 432
  s.data.resize(2048);
  for (size_t i = 0; i < s.data.size(); ++i) s.data[i] = static_cast<char>(i * 131 + 7);
  return s;
}

absl::StatusOr<DplFile> ParseImage(const std::string& image) {
  return DplFile::Parse(reinterpret_cast<const uint8_t*>(image.data()), image.size());
}

template <typename T>
void PokeAt(std::string& image, uint64_t at, T v) {
  std::memcpy(image.data() + at, &v, sizeof(T));
}

struct HostileCase {
  const char* name;
  std::function<void(DplSpec&)> corrupt;
  std::function<void(DplSpec&)> twin;
  const char* expect;
};

const std::vector<HostileCase>& Cases() {
  static const std::vector<HostileCase> cases = {
      {"BAD_MAGIC", [](DplSpec& s) { s.patch_image = [](std::string& im) { im[0] = 'X'; }; },
       [](DplSpec&) {}, "not a .dpl file"},
      {"TRUNCATED_HEADER", [](DplSpec& s) { s.patch_image = [](std::string& im) { im.resize(100); }; },
       [](DplSpec&) {}, "truncated header"},
      {"BAD_VERSION", [](DplSpec& s) {
         s.patch_image = [](std::string& im) {
           PokeAt<uint32_t>(im, 8, 2);  // then fix the header checksum
           PokeAt<uint64_t>(im, 248, XXH3_64bits(im.data(), 248));
         };
       },
       [](DplSpec&) {}, "2 is not supported"},
      {"HEADER_CHECKSUM", [](DplSpec& s) { s.patch_image = [](std::string& im) { im[20] ^= 1; }; },
       [](DplSpec&) {}, "header checksum"},
      {"INDEX_CHECKSUM", [](DplSpec& s) { s.patch_image = [](std::string& im) { im[300] ^= 1; }; },
       [](DplSpec&) {}, "index checksum"},
      {"TRUNCATED_DATA", [](DplSpec& s) { s.patch_image = [](std::string& im) { im.resize(im.size() - 1); }; },
       [](DplSpec&) {}, "file size mismatch"},
      {"EXTENDED_FILE", [](DplSpec& s) { s.patch_image = [](std::string& im) { im += "x"; }; },
       [](DplSpec&) {}, "file size mismatch"},
      {"UNKNOWN_FLAGS", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.flags |= 4; }; },
       [](DplSpec&) {}, "unknown flag bits"},
      {"RESERVED_NONZERO", [](DplSpec& s) {
         s.patch_image = [](std::string& im) {
           im[200] = 1;
           PokeAt<uint64_t>(im, 248, XXH3_64bits(im.data(), 248));
         };
       },
       [](DplSpec&) {}, "reserved header byte"},
      {"DATA_OFFSET_MISALIGNED", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.data_offset += 8; }; },
       [](DplSpec&) {}, "data offset"},
      {"DATA_STORED_WRONG", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.data_stored_bytes -= 256; }; },
       [](DplSpec&) {}, "data stored size"},
      {"DATA_BYTES_WRONG", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.data_bytes += 256; }; },
       [](DplSpec&) {}, "data size"},
      {"META_OUTSIDE_INDEX", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.meta_offset = 1ull << 62; }; },
       [](DplSpec&) {}, "metadata range"},
      {"META_RAW_HUGE", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.meta_raw_bytes = 1ull << 40; }; },
       [](DplSpec&) {}, "metadata size"},
      {"META_RAW_MISMATCH", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.meta_raw_bytes += 1; }; },
       [](DplSpec&) {}, "metadata frame"},
      {"META_COUNT_TOO_SMALL", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.meta_count -= 1; }; },
       [](DplSpec&) {}, "trailing bytes"},
      {"META_COUNT_TOO LARGE", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.meta_count += 1; }; },
       [](DplSpec&) {}, "metadata (decompressed)"},
      {"META_DUPLICATE_KEY",
       [](DplSpec& s) {
         s.patch_meta = [](std::string& raw, uint64_t& count) { raw += raw; count *= 2; };
       },
       [](DplSpec&) {}, "duplicate key"},
      {"TABLE_OUTSIDE_INDEX", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.table_bytes = 1ull << 50; }; },
       [](DplSpec&) {}, "tensor table range"},
      {"HUGE_N_TENSORS", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.n_tensors = 1ull << 60; }; },
       [](DplSpec&) {}, "cannot fit"},
      {"FEWER_TENSORS_THAN_TABLE", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.n_tensors = 2; }; },
       [](DplSpec&) {}, "trailing bytes"},
      {"UNKNOWN_TYPE", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[0].type = static_cast<GgmlType>(5); }; },
       [](DplSpec&) {}, "unknown ggml type id 5"},
      {"UNKNOWN_LAYOUT", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[0].layout = static_cast<TensorLayout>(9); }; },
       [](DplSpec&) {}, "unknown layout 9"},
      {"LAYOUT_NEEDS_Q6K", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[2].layout = TensorLayout::kDplQ6K; }; },
       [](DplSpec&) {}, "needs type q6_K"},
      {"ROW_STRIDE_WRONG", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[1].row_stride = 420; es[1].n_bytes = 840; }; },
       [](DplSpec&) {}, "row stride"},
      {"N_BYTES_WRONG", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[1].n_bytes += 16; }; },
       [](DplSpec&) {}, "byte size"},
      {"N_DIMS_ZERO", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[0].n_dims = 0; }; },
       [](DplSpec&) {}, "n_dims"},
      {"NE_BEYOND_N_DIMS", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[0].ne[3] = 2; es[0].n_bytes *= 2; }; },
       [](DplSpec&) {}, "must be 1 beyond n_dims"},
      {"SHAPE_OVERFLOWS", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[0].n_dims = 2; es[0].ne[1] = 1ull << 62; }; },
       [](DplSpec&) {}, "overflows"},
      {"PARTIAL_BLOCK_ROW", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[2].ne[0] = 128; }; },
       [](DplSpec&) {}, "whole number"},
      {"OFFSET_MISALIGNED", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[2].offset += 16; }; },
       [](DplSpec&) {}, "not a multiple of 256"},
      {"OFFSET_OUT_OF_REGION", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[2].offset = 1ull << 40; }; },
       [](DplSpec&) {}, "runs past"},
      {"OFFSET_WRAPS", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[2].offset = ~uint64_t{255}; }; },
       [](DplSpec&) {}, "runs past"},
      {"OVERLAP", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[2].offset = 768; }; },
       [](DplSpec&) {}, "overlap"},
      {"DUPLICATE_NAME", [](DplSpec& s) { s.patch_entries = [](auto& es) { es[2].name = "w6.weight"; }; },
       [](DplSpec& s) { s.patch_entries = [](auto& es) { es[2].name = "w7.weight"; }; }, "duplicate tensor name"},
      {"FRAMES_IN_UNCOMPRESSED", [](DplSpec& s) { s.patch_header = [](DplHeader& h) { h.n_frames = 1; }; },
       [](DplSpec&) {}, "uncompressed"},
      {"FRAME_SIZE_TINY",
       [](DplSpec& s) { s.compressed = true; s.patch_header = [](DplHeader& h) { h.frame_raw_bytes = 1000; }; },
       [](DplSpec& s) { s.compressed = true; }, "frame size"},
      {"FRAME_COUNT_WRONG",
       [](DplSpec& s) { s.compressed = true; s.patch_header = [](DplHeader& h) { h.n_frames = 2; }; },
       [](DplSpec& s) { s.compressed = true; }, "frame count"},
  };
  return cases;
}

TEST_CASE("the valid base .dpl parses, both forms") {
  for (bool compressed : {false, true}) {
    DplSpec s = ValidBase();
    s.compressed = compressed;
    auto f = ParseImage(s.Build());
    REQUIRE_MESSAGE(f.ok(), f.status().ToString());
    CHECK(f->compressed() == compressed);
    REQUIRE(f->tensors().size() == 3);
    CHECK(f->FindTensor("w6.weight")->layout == TensorLayout::kDplQ6K);
    CHECK(f->FindTensor("w6.weight")->row_stride == DplQ6KRowStride(2));
    CHECK(*f->metadata().GetUint("llama.block_count") == 1);
    std::string region(s.data.size(), '\0');
    const uint8_t* r = f->data_region();
    if (compressed) {
      REQUIRE(f->DecompressAll(reinterpret_cast<uint8_t*>(region.data()), 3).ok());
      r = reinterpret_cast<const uint8_t*>(region.data());
      CHECK(region == s.data);
    }
    for (const DplTensorEntry& t : f->tensors()) CHECK(f->VerifyChecksum(t, r).ok());
  }
}

TEST_CASE("hostile .dpl files are rejected with a named error; their twins pass") {
  for (const HostileCase& c : Cases()) {
    const std::string name = c.name;
    CAPTURE(name);
    DplSpec bad = ValidBase();
    c.corrupt(bad);
    auto parsed_bad = ParseImage(bad.Build());
    CHECK_MESSAGE(!parsed_bad.ok(), name, " was accepted");
    if (!parsed_bad.ok()) {
      const std::string msg(parsed_bad.status().message());
      CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, name, ": ", msg);
    }
    DplSpec good = ValidBase();
    c.twin(good);
    auto parsed_good = ParseImage(good.Build());
    CHECK_MESSAGE(parsed_good.ok(), name, " twin: ", parsed_good.status().ToString());
  }
}

TEST_CASE("a corrupt data byte fails its tensor's checksum, not the parse") {
  DplSpec s = ValidBase();
  s.patch_image = [](std::string& im) { im[im.size() - 500] ^= 0x40; };
  const std::string image = s.Build();
  auto f = ParseImage(image);
  REQUIRE(f.ok());
  int bad = 0;
  for (const DplTensorEntry& t : f->tensors()) {
    absl::Status st = f->VerifyChecksum(t, f->data_region());
    if (!st.ok()) {
      ++bad;
      CHECK(std::string(st.message()).find("checksum mismatch") != std::string::npos);
    }
  }
  CHECK(bad == 1);
}

TEST_CASE("a corrupt zstd data frame is reported by DecompressAll") {
  DplSpec s = ValidBase();
  s.compressed = true;
  s.patch_image = [](std::string& im) { im[im.size() - 3] ^= 0xFF; };
  auto f = ParseImage(s.Build());
  REQUIRE(f.ok());
  std::vector<uint8_t> region(f->header().data_bytes);
  const absl::Status st = f->DecompressAll(region.data(), 2);
  bool checksums_ok = true;
  if (st.ok()) {  // zstd may decode garbage; then the checksums must catch it
    for (const DplTensorEntry& t : f->tensors()) checksums_ok &= f->VerifyChecksum(t, region.data()).ok();
  }
  CHECK((!st.ok() || !checksums_ok));
}

TEST_CASE("every truncation is rejected; single-byte flips never crash") {
  const std::string image = ValidBase().Build();
  for (size_t n = 0; n < image.size(); n += 7) CHECK(!ParseImage(image.substr(0, n)).ok());
  for (size_t i = 0; i < image.size(); ++i) {
    std::string m = image;
    m[i] ^= 0x5A;
    auto f = ParseImage(m);
    if (i < kDplHeaderBytes + 64) CHECK(!f.ok());  // header and index are checksummed
  }
}

TEST_CASE("q6_K dpl transform round trips and matches the documented planes") {
  constexpr uint64_t nbe = 3;
  std::vector<uint8_t> raw(nbe * 210);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 17 + 3);
  std::vector<uint8_t> dpl(DplQ6KRowStride(nbe), 0);
  CHECK(dpl.size() == 640);  // 630 rounded up to 16
  Q6KRowToDpl(raw.data(), nbe, dpl.data());
  // Block 1's fields at ql + 128, qh + 64, sc + 16, d + 2 of their planes.
  CHECK(std::memcmp(&dpl[128], &raw[210], 128) == 0);
  CHECK(std::memcmp(&dpl[nbe * 128 + 64], &raw[210 + 128], 64) == 0);
  CHECK(std::memcmp(&dpl[nbe * 192 + 16], &raw[210 + 192], 16) == 0);
  CHECK(std::memcmp(&dpl[nbe * 208 + 2], &raw[210 + 208], 2) == 0);
  for (size_t p = nbe * 210; p < dpl.size(); ++p) CHECK(dpl[p] == 0);
  std::vector<uint8_t> back(raw.size());
  DplRowToQ6K(dpl.data(), nbe, back.data());
  CHECK(back == raw);
}

}  // namespace
}  // namespace dpl::formats
