// dpl-convert end to end on llama.cpp's own files: conversion, --verify,
// the compressed form, atomic output, refusals (options, memory, the input
// as output, read-only outputs), an interrupted verify, and dpl-inspect.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "converter/convert.h"
#include "converter/inspect.h"
#include "formats/dpl_layout.h"
#include "formats/model_file.h"
#include "model/model_testing.h"
#include "tests/shared_dir.h"

namespace dpl::converter {
namespace {
namespace fs = std::filesystem;

std::string Oracle(const std::string& name) { return testing::SharedDir() + "/oracle/" + name; }
std::string Tmp(const std::string& name) { return testing::TempDir() + "/" + name; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void Verify(const std::string& gguf_path, const std::string& dpl_path) {
  auto gguf = formats::GgufFile::Open(gguf_path);
  REQUIRE(gguf.ok());
  auto dpl = formats::DplFile::Open(dpl_path);
  REQUIRE_MESSAGE(dpl.ok(), dpl.status().ToString());
  auto vs = VerifyConversion(*gguf, *dpl);
  REQUIRE_MESSAGE(vs.ok(), vs.status().ToString());
  CHECK(vs->n_tensors == gguf->tensors().size());
}

// No hidden temporary file of `out` (formats::OutputFile names them
// DIR/.NAME.dpl-tmp-PID-N) is left in its directory.
bool NoTempLeft(const std::string& out) {
  const fs::path dir = fs::path(out).parent_path();
  const std::string stem = "." + fs::path(out).filename().string() + ".dpl-tmp-";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(stem, 0) == 0) return false;
  }
  return true;
}

TEST_CASE("every oracle and vocab GGUF converts and verifies bit for bit, both forms, both layouts") {
  int n = 0;
  for (const char* sub : {"oracle", "vocab"}) {
    for (const auto& e : fs::directory_iterator(fs::path(testing::SharedDir()) / sub)) {
      if (e.path().extension() != ".gguf") continue;
      const std::string in = e.path().string();
      CAPTURE(in);
      for (int form = 0; form < 3; ++form) {
        const bool compress = form == 1;
        ConvertOptions opt;
        opt.compress = compress;
        opt.layout = form == 2 ? LayoutPolicy::kDpl : LayoutPolicy::kAuto;
        opt.frame_bytes = 1 << 20;
        opt.threads = 2;
        const std::string out = Tmp(e.path().stem().string() + (compress ? ".z.dpl" : ".dpl"));
        auto stats = ConvertGgufToDpl(in, out, opt);
        REQUIRE_MESSAGE(stats.ok(), stats.status().ToString());
        CHECK(stats->output_bytes == fs::file_size(out));
        Verify(in, out);
        CHECK(NoTempLeft(out));
      }
      ++n;
    }
  }
  CHECK(n == 19);  // every GGUF in oracle/ (14, the Qwen3-MoE one too) and vocab/ (5)
}

TEST_CASE("q6_K tensors get the dpl layout with 16-byte rows; the rest stay raw and aligned") {
  const std::string in = Oracle("small-llama-q4km.gguf");
  const std::string out = Tmp("layout.dpl");
  REQUIRE(ConvertGgufToDpl(in, out, {}).ok());
  auto gguf = formats::ModelFile::Open(in);
  auto dpl = formats::ModelFile::Open(out);
  REQUIRE(gguf.ok());
  REQUIRE(dpl.ok());
  CHECK((*dpl)->container() == formats::Container::kDpl);
  int n_dpl = 0;
  for (const formats::TensorView& t : (*gguf)->tensors()) {
    const formats::TensorView* d = (*dpl)->Find(t.name);
    REQUIRE(d != nullptr);
    CHECK(d->data_offset % 256 == 0);
    if (t.type == formats::GgmlType::kQ6_K) {
      ++n_dpl;
      CHECK(d->layout == formats::TensorLayout::kDpl);
      CHECK(d->row_stride % 16 == 0);
      CHECK(d->row_stride == formats::DplRowStride(formats::GgmlType::kQ6_K, t.ne[0] / 256));
    } else {
      CHECK(d->layout == formats::TensorLayout::kRaw);
      CHECK(d->n_bytes == t.n_bytes);
    }
  }
  CHECK(n_dpl > 0);
}

TEST_CASE("--layout: names, and auto's table (dpl for every type with planes but iq4_xs)") {
  for (const char* name : {"auto", "raw", "dpl"}) {
    auto p = LayoutPolicyFromName(name);
    REQUIRE(p.ok());
    CHECK(LayoutPolicyName(*p) == name);
  }
  const auto bad = LayoutPolicyFromName("planes");
  CHECK(std::string(bad.status().message()) == "--layout 'planes' is not one of raw, dpl, auto");
  int n_types = 0, n_dpl_types = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<formats::GgmlTypeTraits> tr = formats::FindGgmlType(id);
    if (!tr) continue;
    CAPTURE(tr->name);
    ++n_types;
    const bool planes = formats::HasDplPlanes(tr->type);
    n_dpl_types += planes;
    CHECK(AutoLayout(tr->type) == (planes && tr->type != formats::GgmlType::kIQ4_XS
                                       ? formats::TensorLayout::kDpl
                                       : formats::TensorLayout::kRaw));
    CHECK(LayoutFor(LayoutPolicy::kAuto, tr->type) == AutoLayout(tr->type));
    CHECK(LayoutFor(LayoutPolicy::kRaw, tr->type) == formats::TensorLayout::kRaw);
    CHECK(LayoutFor(LayoutPolicy::kDpl, tr->type) ==
          (planes ? formats::TensorLayout::kDpl : formats::TensorLayout::kRaw));
  }
  CHECK(n_types == 32);
  CHECK(n_dpl_types == 10);
}

// XXH3-64 of `n` bytes at `at` of a file's `bytes`.
uint64_t HashRange(const std::string& bytes, uint64_t at, uint64_t n) {
  REQUIRE(at + n <= bytes.size());
  return XXH3_64bits(bytes.data() + at, n);
}

template <typename T>
T Field(const std::string& bytes, uint64_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

TEST_CASE("--layout auto writes version 1, byte for byte what the q6_K-only converter wrote") {
  // The tensor table and the data region of each Q4_K_M oracle as the
  // converter of e374fad (q6_K-only dpl) wrote them: XXH3-64 of the table
  // bytes and of the data region (the metadata frame is zstd's, proven
  // identical to the GGUF's by VerifyConversion).
  struct Golden {
    const char* file;
    uint64_t table_xxh3, data_xxh3, data_bytes;
  } goldens[] = {
      {"small-llama-q4km", 0x99281a88b8f90faeull, 0xc25f2bb685f9c36cull, 9672704},
      {"small-qwen2-q4km", 0x99d13f03d81ee28dull, 0xede203224b1d14beull, 6461440},
      {"tiny-qwen2-vocab-q4km", 0x320b64947b16bfc1ull, 0xa020d880c3b3bb90ull, 34753536},
      {"small-qwen3-q4km", 0xfa9a8be170753d01ull, 0x3eeae1661561ee73ull, 7336960},
      {"small-llama31-q4km", 0xaf1190de68d389e1ull, 0xf77872e5505d1810ull, 7039232},
  };
  for (const Golden& g : goldens) {
    CAPTURE(g.file);
    const std::string out = Tmp(std::string(g.file) + ".auto.dpl");
    auto stats = ConvertGgufToDpl(Oracle(std::string(g.file) + ".gguf"), out, {});
    REQUIRE_MESSAGE(stats.ok(), stats.status().ToString());
    CHECK(stats->version == 1);
    CHECK(stats->n_dpl_by_type.size() == 1);
    CHECK(stats->n_dpl_by_type.count(formats::GgmlType::kQ6_K) == 1);
    const std::string bytes = ReadAll(out);
    CHECK(Field<uint32_t>(bytes, 8) == 1);  // version
    const uint64_t table_offset = Field<uint64_t>(bytes, 56), table_bytes = Field<uint64_t>(bytes, 64);
    const uint64_t data_offset = Field<uint64_t>(bytes, 104), data_bytes = Field<uint64_t>(bytes, 112);
    CHECK(data_bytes == g.data_bytes);
    CHECK(HashRange(bytes, table_offset, table_bytes) == g.table_xxh3);
    CHECK(HashRange(bytes, data_offset, bytes.size() - data_offset) == g.data_xxh3);
    Verify(Oracle(std::string(g.file) + ".gguf"), out);
  }
}

TEST_CASE("--layout dpl: every type with planes in dpl, version 2, verified bit for bit") {
  struct Case {
    const char* file;
    std::map<formats::GgmlType, uint64_t> dpl;  // tensors per type
    std::vector<std::string> plane_lines;       // dpl-inspect's, in type id order
  } cases[] = {
      {"mini-llama-q80", {{formats::GgmlType::kQ8_0, 16}},
       {"  q8_0 dpl: qs[32] | d[2] per block, rows padded to 16 B\n"}},
      {"mini-llama-q40", {{formats::GgmlType::kQ4_0, 15}, {formats::GgmlType::kQ6_K, 1}},
       {"  q4_0 dpl: qs[16] | d[2] per block, rows padded to 16 B\n",
        "  q6_K dpl: ql[128] | qh[64] | scales[16] | d[2] per block, rows padded to 16 B\n"}},
      {"mini-llama-q3km", {{formats::GgmlType::kQ3_K, 9}, {formats::GgmlType::kQ6_K, 1}},
       {"  q3_K dpl: hmask[32] | qs[64] | scales[12] | d[2] per block, rows padded to 16 B\n",
        "  q6_K dpl: ql[128] | qh[64] | scales[16] | d[2] per block, rows padded to 16 B\n"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.file);
    const std::string in = Oracle(std::string(c.file) + ".gguf");
    for (bool compress : {false, true}) {
      CAPTURE(compress);
      const std::string out = Tmp(std::string(c.file) + (compress ? ".dpl.z.dpl" : ".dpl.dpl"));
      ConvertOptions opt;
      opt.layout = LayoutPolicy::kDpl;
      opt.verify = true;
      opt.compress = compress;
      opt.frame_bytes = 1 << 20;
      auto stats = ConvertGgufToDpl(in, out, opt);
      REQUIRE_MESSAGE(stats.ok(), stats.status().ToString());
      CHECK(stats->version == 2);
      CHECK(stats->n_dpl_by_type == c.dpl);
      REQUIRE(stats->verify.has_value());
      CHECK(stats->verify->n_dpl_rows > 0);
      Verify(in, out);
      auto gguf = formats::ModelFile::Open(in);
      auto dpl = formats::ModelFile::Open(out);
      REQUIRE(gguf.ok());
      REQUIRE(dpl.ok());
      CHECK((*dpl)->dpl_file()->header().version == 2);
      for (const formats::TensorView& t : (*gguf)->tensors()) {
        CAPTURE(t.name);
        const formats::TensorView* d = (*dpl)->Find(t.name);
        REQUIRE(d != nullptr);
        const formats::GgmlTypeTraits tr = formats::TraitsOf(t.type);
        if (!formats::HasDplPlanes(t.type)) {
          CHECK(d->layout == formats::TensorLayout::kRaw);
          continue;
        }
        CHECK(d->layout == formats::TensorLayout::kDpl);
        const uint64_t nbe = t.ne[0] / tr.block_elems;
        CHECK(d->row_stride == ((nbe * tr.block_bytes + 15) & ~uint64_t{15}));
        // The last row undone equals the GGUF's.
        const uint64_t r = t.n_rows - 1;
        std::vector<uint8_t> back(t.row_stride);
        REQUIRE(formats::DplRowToRaw(t.type, d->data + r * d->row_stride, nbe, back.data()).ok());
        CHECK(std::memcmp(back.data(), t.data + r * t.row_stride, t.row_stride) == 0);
      }
      // dpl-inspect: version 2, one planes line per dpl type, a JSON array.
      std::ostringstream text, json;
      REQUIRE(Inspect(out, {}, text).ok());
      CHECK(text.str().find(compress ? ".dpl v2 (compressed)" : ".dpl v2,") != std::string::npos);
      std::string lines = "\ndpl planes:\n";
      for (const std::string& l : c.plane_lines) lines += l;
      CHECK_MESSAGE(text.str().find(lines) != std::string::npos, text.str());
      InspectOptions jopt;
      jopt.json = true;
      REQUIRE(Inspect(out, jopt, json).ok());
      const nlohmann::json j = nlohmann::json::parse(json.str());
      CHECK(j["version"] == 2);
      REQUIRE(j["planes"].size() == c.dpl.size());
      auto want = c.dpl.begin();
      for (const nlohmann::json& p : j["planes"]) {
        const formats::DplPlaneSpec spec = formats::DplPlanesOf(want->first);
        CHECK(p["type"] == formats::TraitsOf(want->first).name);
        CHECK(p["row_alignment"] == 16);
        REQUIRE(p["planes"].size() == spec.n);
        for (uint32_t k = 0; k < spec.n; ++k) {
          CHECK(p["planes"][k]["field"] == spec.f[k].name);
          CHECK(p["planes"][k]["raw_offset"] == spec.f[k].offset);
          CHECK(p["planes"][k]["bytes"] == spec.f[k].bytes);
        }
        ++want;
      }
    }
  }
}

TEST_CASE("--layout raw: every tensor raw, version 1, the GGUF's bytes") {
  const std::string in = Oracle("mini-llama-q6k.gguf");
  const std::string out = Tmp("raw.dpl");
  ConvertOptions opt;
  opt.layout = LayoutPolicy::kRaw;
  opt.verify = true;
  auto stats = ConvertGgufToDpl(in, out, opt);
  REQUIRE_MESSAGE(stats.ok(), stats.status().ToString());
  CHECK(stats->version == 1);
  CHECK(stats->n_dpl_tensors == 0);
  CHECK(stats->verify->n_dpl_rows == 0);
  auto dpl = formats::ModelFile::Open(out);
  REQUIRE(dpl.ok());
  for (const formats::TensorView& t : (*dpl)->tensors()) CHECK(t.layout == formats::TensorLayout::kRaw);
}

TEST_CASE("a tensor type without a GPU kernel: one warning line naming it, the conversion goes on") {
  const std::string in = Tmp("iq2xxs.gguf");
  const absl::Status written = model::testing::WriteVariant(
      Oracle("small-llama-q4km.gguf"), in,
      [](formats::Metadata&, std::vector<model::testing::TensorEdit>& ts) {
        for (const char* name : {"blk.0.attn_q.weight", "blk.1.ffn_up.weight"}) {
          model::testing::TensorEdit* t = model::testing::FindEdit(ts, name);
          REQUIRE(t != nullptr);
          t->spec.type = formats::GgmlType::kIQ2_XXS;
          t->source = "";  // zeros
        }
      });
  REQUIRE_MESSAGE(written.ok(), written.ToString());
  std::ostringstream warn;
  ConvertOptions opt;
  opt.warn = &warn;
  opt.verify = true;
  const std::string out = Tmp("iq2xxs.dpl");
  auto stats = ConvertGgufToDpl(in, out, opt);
  REQUIRE_MESSAGE(stats.ok(), stats.status().ToString());
  CHECK(stats->n_gpu_warnings == 2);
  CHECK(warn.str() ==
        "warning: tensor 'blk.0.attn_q.weight' is iq2_xxs, which the CUDA runtime has no kernel for "
        "(it runs f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, bf16)\n"
        "warning: tensor 'blk.1.ffn_up.weight' is iq2_xxs, which the CUDA runtime has no kernel for "
        "(it runs f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, bf16)\n");
  Verify(in, out);
  // dpl-convert's closing note says the same, once.
  const absl::Status note = CheckRunnable(out);
  CHECK(note.code() == absl::StatusCode::kUnimplemented);
  CHECK(std::string(note.message()) ==
        "tensor 'blk.0.attn_q.weight' is iq2_xxs, which the CUDA runtime has no kernel for "
        "(it runs f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, "
        "iq4_xs, bf16); and 1 more tensor(s), warned about above");
  // Its twin, the unedited model: no warning, no note.
  std::ostringstream none;
  opt.warn = &none;
  REQUIRE(ConvertGgufToDpl(Oracle("small-llama-q4km.gguf"), out, opt).ok());
  CHECK(none.str().empty());
  CHECK(CheckRunnable(out).ok());
}

// A mixture of experts runs on the GPU when its expert tensors have expert
// kernels (model::GpuHasExpertKernelFor): the oracle's q4_K / q6_K experts
// do, and the note names an expert tensor of a type that has none (q4_0 has
// a dense kernel, so no per-tensor warning says it).
TEST_CASE("the qwen3moe oracle is runnable; an expert type without an expert kernel is named") {
  const std::string out = Tmp("moe.dpl");
  REQUIRE(ConvertGgufToDpl(Oracle("mini-qwen3moe-q4km.gguf"), out, {}).ok());
  const absl::Status ok = CheckRunnable(out);
  CHECK_MESSAGE(ok.ok(), ok.ToString());
  const std::string in = Tmp("moe-q40.gguf");
  const absl::Status written = model::testing::WriteVariant(
      Oracle("mini-qwen3moe-q4km.gguf"), in,
      [](formats::Metadata&, std::vector<model::testing::TensorEdit>& ts) {
        model::testing::TensorEdit* t = model::testing::FindEdit(ts, "blk.1.ffn_down_exps.weight");
        REQUIRE(t != nullptr);
        t->spec.type = formats::GgmlType::kQ4_0;
        t->source = "";  // zeros
      });
  REQUIRE_MESSAGE(written.ok(), written.ToString());
  std::ostringstream warn;
  ConvertOptions opt;
  opt.warn = &warn;
  REQUIRE(ConvertGgufToDpl(in, out, opt).ok());
  CHECK(warn.str().empty());
  const absl::Status note = CheckRunnable(out);
  CHECK(note.code() == absl::StatusCode::kUnimplemented);
  CHECK(std::string(note.message()) ==
        "tensor 'blk.1.ffn_down_exps.weight' is q4_0, which the CUDA runtime has no expert kernel for "
        "(its mixture-of-experts layers run q8_0, q4_K, q5_K, q6_K experts); the CPU reference runs it "
        "(dpl-run --device cpu)");
}

TEST_CASE("a failed conversion leaves no output and keeps an existing file") {
  // A truncated copy of a real model.
  const std::string src = Oracle("small-qwen2-q4km.gguf");
  const std::string bad = Tmp("truncated.gguf");
  {
    std::ifstream in(src, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    bytes.resize(bytes.size() / 2);
    std::ofstream(bad, std::ios::binary) << bytes;
  }
  const std::string out = Tmp("never.dpl");
  auto stats = ConvertGgufToDpl(bad, out, {});
  REQUIRE(!stats.ok());
  CHECK(std::string(stats.status().message()).find("truncated.gguf") != std::string::npos);
  CHECK(!fs::exists(out));

  const std::string keep = Tmp("keep.dpl");
  std::ofstream(keep) << "previous contents";
  CHECK(!ConvertGgufToDpl(bad, keep, {}).ok());
  std::ifstream kept(keep);
  std::string contents((std::istreambuf_iterator<char>(kept)), {});
  CHECK(contents == "previous contents");
  CHECK(NoTempLeft(keep));

  CHECK(!ConvertGgufToDpl(src, Tmp("no/such/dir/out.dpl"), {}).ok());
  CHECK(!ConvertGgufToDpl(Tmp("missing.gguf"), out, {}).ok());
}

TEST_CASE("cancellation stops the conversion and leaves nothing behind") {
  std::atomic<bool> cancel{true};
  ConvertOptions opt;
  opt.cancel = &cancel;
  const std::string out = Tmp("cancelled.dpl");
  auto stats = ConvertGgufToDpl(Oracle("tiny-qwen2-vocab-q4km.gguf"), out, opt);
  REQUIRE(!stats.ok());
  CHECK(stats.status().code() == absl::StatusCode::kCancelled);
  CHECK(!fs::exists(out));
  CHECK(NoTempLeft(out));
}

bool Has(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST_CASE("options out of range or over the memory budget are refused before anything is written") {
  const std::string in = Oracle("small-llama-q4km.gguf");
  struct Row {
    const char* name;
    std::function<void(ConvertOptions&)> bad, twin;  // twin: the clean value
    const char* want;
  } rows[] = {
      {"threads too many", [](ConvertOptions& o) { o.threads = 100000; },
       [](ConvertOptions& o) { o.threads = 2; }, "--threads 100000 out of range (0 = all cores, or 1..1024)"},
      {"threads negative", [](ConvertOptions& o) { o.threads = -1; },
       [](ConvertOptions& o) { o.threads = 0; }, "--threads -1 out of range"},
      {"zstd level", [](ConvertOptions& o) { o.compress_level = 99; },
       [](ConvertOptions& o) { o.compress_level = 1; }, "--level 99 out of range (zstd: "},
      {"frame too small", [](ConvertOptions& o) { o.frame_bytes = 1; },
       [](ConvertOptions& o) { o.frame_bytes = 64 << 10; }, "frame size 1 bytes out of range"},
      {"frame too large", [](ConvertOptions& o) { o.frame_bytes = 2ull << 30; },
       [](ConvertOptions& o) { o.frame_bytes = 1 << 20; }, "out of range (64 KiB..1 GiB)"},
      // Issue 11 case 5: --threads 64 --frame-mib 1024 asked for 256 GiB.
      {"buffers over budget",
       [](ConvertOptions& o) { o.threads = 64, o.frame_bytes = 1ull << 30, o.memory_budget = 8ull << 30; },
       [](ConvertOptions& o) { o.threads = 2, o.frame_bytes = 1 << 20, o.memory_budget = 8ull << 30; },
       "GiB of buffers, over the 8.0 GiB"},
      {"verify inflating over budget",
       [](ConvertOptions& o) { o.verify = true, o.frame_bytes = 64 << 10, o.threads = 1, o.memory_budget = 4 << 20; },
       [](ConvertOptions& o) { o.verify = false, o.frame_bytes = 64 << 10, o.threads = 1, o.memory_budget = 4 << 20; },
       "--verify of the compressed form inflates the whole data region"},
  };
  for (const Row& r : rows) {
    CAPTURE(r.name);
    const std::string out = Tmp(std::string("opt-") + r.name + ".dpl");
    ConvertOptions bad;
    bad.compress = true;
    r.bad(bad);
    auto stats = ConvertGgufToDpl(in, out, bad);
    REQUIRE(!stats.ok());
    CHECK_MESSAGE(Has(stats.status(), r.want), stats.status().ToString());
    CHECK(!fs::exists(out));
    CHECK(NoTempLeft(out));
    ConvertOptions twin;
    twin.compress = true;
    r.twin(twin);
    stats = ConvertGgufToDpl(in, out, twin);
    REQUIRE_MESSAGE(stats.ok(), stats.status().ToString());
    Verify(in, out);
  }
  // threads 0 takes all cores that fit: over budget for 2, so 1.
  ConvertOptions fit;
  fit.compress = true;
  fit.frame_bytes = 256 << 20;
  fit.memory_budget = 1536ull << 20;
  auto stats = ConvertGgufToDpl(in, Tmp("fit.dpl"), fit);
  REQUIRE_MESSAGE(stats.ok(), stats.status().ToString());
  CHECK(stats->threads == 1);
}

TEST_CASE("the output is never the input, nor a read-only file, a directory or a device") {
  // A private copy: a refusal that failed would destroy it, not the oracle.
  const fs::path dir = fs::path(Tmp("same"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string in = (dir / "in.gguf").string();
  fs::copy_file(Oracle("tiny-qwen2-vocab-q4km.gguf"), in);
  const std::string before = ReadAll(in);
  fs::create_symlink("in.gguf", dir / "link.gguf");
  fs::create_hard_link(in, dir / "hard.gguf");
  const std::string ro = (dir / "ro.dpl").string();
  std::ofstream(ro) << "read-only";
  fs::permissions(ro, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  struct Row {
    std::string in, out, want;
  } rows[] = {
      {in, in, "is the input"},
      {(dir / "link.gguf").string(), in, "is the input"},
      {in, (dir / "link.gguf").string(), "is the input"},
      {in, (dir / "hard.gguf").string(), "is the input"},
      {in, ro, "read-only"},
      {in, dir.string(), "is a directory"},
      {in, "/dev/null", "not a regular file"},
      {in, "", "empty output path"},
  };
  for (const Row& r : rows) {
    CAPTURE(r.out);
    auto stats = ConvertGgufToDpl(r.in, r.out, {});
    REQUIRE(!stats.ok());
    CHECK_MESSAGE(Has(stats.status(), r.want), stats.status().ToString());
  }
  CHECK(ReadAll(in) == before);
  CHECK(ReadAll(ro) == "read-only");
  CHECK(NoTempLeft(in));
  CHECK(NoTempLeft(ro));
  // Clean twins: another name converts; the read-only file once writable too.
  REQUIRE(ConvertGgufToDpl(in, (dir / "out.dpl").string(), {}).ok());
  fs::permissions(ro, fs::perms::owner_write, fs::perm_options::add);
  REQUIRE(ConvertGgufToDpl(in, ro, {}).ok());
  Verify(in, ro);
  CHECK(ReadAll(in) == before);
}

// A log that sets `cancel` when the conversion starts verifying: a signal
// (or Ctrl-C) arriving during --verify.
class CancelOnVerify : public std::streambuf {
 public:
  explicit CancelOnVerify(std::atomic<bool>& cancel) : cancel_(cancel) {}

 private:
  int overflow(int c) override {
    line_ += static_cast<char>(c);
    if (line_.rfind("verifying", 0) == 0) cancel_ = true;
    if (c == '\n') line_.clear();
    return c;
  }
  std::atomic<bool>& cancel_;
  std::string line_;
};

TEST_CASE("--verify runs before the output exists: interrupted, it writes nothing") {
  const std::string in = Oracle("small-qwen2-q4km.gguf");
  const std::string out = Tmp("verify-cancelled.dpl");
  std::ofstream(out) << "previous contents";
  for (bool compress : {false, true}) {
    CAPTURE(compress);
    std::atomic<bool> cancel{false};
    CancelOnVerify buf(cancel);
    std::ostream log(&buf);
    ConvertOptions opt;
    opt.compress = compress;
    opt.verify = true;
    opt.log = &log;
    opt.cancel = &cancel;
    auto stats = ConvertGgufToDpl(in, out, opt);
    REQUIRE(!stats.ok());
    CHECK(stats.status().code() == absl::StatusCode::kCancelled);
    CHECK(cancel.load());
    CHECK(ReadAll(out) == "previous contents");
    CHECK(NoTempLeft(out));
  }
  // The clean twin: verified, then written.
  ConvertOptions opt;
  opt.verify = true;
  auto stats = ConvertGgufToDpl(in, out, opt);
  REQUIRE_MESSAGE(stats.ok(), stats.status().ToString());
  REQUIRE(stats->verify.has_value());
  CHECK(stats->verify->n_tensors == stats->n_tensors);
  Verify(in, out);
}

// A log that truncates `path` to `keep` bytes at the first tensor line: the
// input shrinking under the converter while it is mapped (issue 11, case 6).
class TruncateOnFirstTensor : public std::streambuf {
 public:
  TruncateOnFirstTensor(std::string path, uint64_t keep) : path_(std::move(path)), keep_(keep) {}

 private:
  int overflow(int c) override {
    if (!done_ && c == '[') {
      fs::resize_file(path_, keep_);
      done_ = true;
    }
    return c;
  }
  std::string path_;
  uint64_t keep_;
  bool done_ = false;
};

TEST_CASE("an input truncated during the conversion is an error naming it, not SIGBUS") {
  const std::string in = Tmp("shrinking.gguf");
  fs::copy_file(Oracle("small-llama-q4km.gguf"), in, fs::copy_options::overwrite_existing);
  const std::string out = Tmp("shrinking.dpl");
  TruncateOnFirstTensor buf(in, 64 * 1024);
  std::ostream log(&buf);
  ConvertOptions opt;
  opt.log = &log;
  auto stats = ConvertGgufToDpl(in, out, opt);
  REQUIRE(!stats.ok());
  CHECK(stats.status().message().find("shrinking.gguf") != absl::string_view::npos);
  CHECK(stats.status().message().find("truncated") != absl::string_view::npos);
  CHECK(!fs::exists(out));
  CHECK(NoTempLeft(out));
}

TEST_CASE("verify catches a tampered or mismatched file") {
  const std::string in = Oracle("small-llama-q4km.gguf");
  const std::string out = Tmp("tamper.dpl");
  REQUIRE(ConvertGgufToDpl(in, out, {}).ok());
  auto gguf = formats::GgufFile::Open(in);
  REQUIRE(gguf.ok());
  {
    auto dpl = formats::DplFile::Open(out);
    REQUIRE(dpl.ok());
    const formats::DplTensorEntry* q6 = nullptr;
    for (const auto& t : dpl->tensors()) {
      if (t.layout == formats::TensorLayout::kDpl) q6 = &t;
    }
    REQUIRE(q6 != nullptr);
    const uint64_t at = dpl->header().data_offset + q6->offset + 100;
    std::fstream f(out, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 1));
  }
  auto dpl = formats::DplFile::Open(out);
  REQUIRE(dpl.ok());  // data bytes are not in the index checksum
  auto vs = VerifyConversion(*gguf, *dpl);
  REQUIRE(!vs.ok());
  CHECK(std::string(vs.status().message()).find("checksum mismatch") != std::string::npos);

  auto other = formats::GgufFile::Open(Oracle("small-qwen2-q4km.gguf"));
  REQUIRE(other.ok());
  CHECK(!VerifyConversion(*other, *dpl).ok());
}

TEST_CASE("verify refuses a file stamped with the wrong version") {
  const std::string in = Oracle("mini-llama-q80.gguf");
  auto gguf = formats::GgufFile::Open(in);
  REQUIRE(gguf.ok());
  // q8_0 in dpl (auto, or forced) needs version 2; all raw is version 1.
  for (LayoutPolicy policy : {LayoutPolicy::kDpl, LayoutPolicy::kAuto, LayoutPolicy::kRaw}) {
    CAPTURE(LayoutPolicyName(policy));
    const std::string out = Tmp(absl::StrCat("version-", LayoutPolicyName(policy), ".dpl"));
    ConvertOptions opt;
    opt.layout = policy;
    REQUIRE(ConvertGgufToDpl(in, out, opt).ok());
    std::string bytes = ReadAll(out);
    const uint32_t version = Field<uint32_t>(bytes, 8);
    CHECK(version == (policy == LayoutPolicy::kRaw ? 1u : 2u));
    {
      auto dpl = formats::DplFile::Open(out);
      REQUIRE(dpl.ok());
      CHECK(VerifyConversion(*gguf, *dpl).ok());  // the twin
    }
    // Version 1 -> 2 is a valid file (version 2 allows what 1 did), but not
    // what the converter writes; 2 -> 1 no reader accepts.
    if (version == 1) {
      const uint32_t two = 2;
      std::memcpy(bytes.data() + 8, &two, 4);
      const uint64_t h = XXH3_64bits(bytes.data(), 248);
      std::memcpy(bytes.data() + 248, &h, 8);
      std::ofstream(out, std::ios::binary | std::ios::trunc) << bytes;
      auto dpl = formats::DplFile::Open(out);
      REQUIRE_MESSAGE(dpl.ok(), dpl.status().ToString());
      auto vs = VerifyConversion(*gguf, *dpl);
      CHECK(std::string(vs.status().message()) ==
            "format version 2, but its tensors' layouts make it version 1");
    }
  }
}

TEST_CASE("dpl-inspect reports metadata, tensors and totals; checksums on demand") {
  const std::string out = Tmp("inspect.dpl");
  REQUIRE(ConvertGgufToDpl(Oracle("tiny-qwen2-vocab-q4km.gguf"), out, {}).ok());
  std::ostringstream text;
  InspectOptions opt;
  opt.verify_checksums = true;
  REQUIRE(Inspect(out, opt, text).ok());
  const std::string s = text.str();
  CHECK(s.find(".dpl v1") != std::string::npos);
  CHECK(s.find("\ndpl planes:\n  q6_K dpl: ql[128] | qh[64] | scales[16] | d[2] per block, rows padded to 16 B\n") !=
        std::string::npos);
  CHECK(s.find("tokenizer.ggml.tokens") != std::string::npos);
  CHECK(s.find("[string x 151936]") != std::string::npos);  // summarized, not dumped
  CHECK(s.find(" dpl ") != std::string::npos);
  CHECK(s.find("checksums: all 26 tensors OK") != std::string::npos);
  CHECK(s.size() < 40000);

  std::ostringstream json;
  opt.json = true;
  REQUIRE(Inspect(out, opt, json).ok());
  CHECK(json.str().find("\"container\": \"dpl\"") != std::string::npos);
  CHECK(json.str().find("\"layout\": \"dpl\"") != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(json.str());
  CHECK(j["version"] == 1);
  REQUIRE(j["planes"].size() == 1);
  CHECK(j["planes"][0]["type"] == "q6_K");
  CHECK(j["planes"][0]["planes"][3]["field"] == "d");
  CHECK(j["planes"][0]["planes"][3]["raw_offset"] == 208);

  std::ostringstream ignored;
  InspectOptions gguf_opt;
  gguf_opt.verify_checksums = true;
  CHECK(!Inspect(Oracle("tiny-qwen2-vocab-q4km.gguf"), gguf_opt, ignored).ok());
  CHECK(!Inspect(Tmp("missing.dpl"), {}, ignored).ok());
}

}  // namespace
}  // namespace dpl::converter

namespace dpl::converter {
namespace {

TEST_CASE("OpenIndex reads a compressed .dpl's table and metadata without inflating it") {
  const std::string in = Oracle("small-qwen2-q4km.gguf");
  const std::string out = Tmp("index.z.dpl");
  ConvertOptions opt;
  opt.compress = true;
  opt.frame_bytes = 1 << 20;
  REQUIRE(ConvertGgufToDpl(in, out, opt).ok());
  auto full = formats::ModelFile::Open(out);
  auto index = formats::ModelFile::OpenIndex(out);
  REQUIRE(full.ok());
  REQUIRE(index.ok());
  REQUIRE((*index)->tensors().size() == (*full)->tensors().size());
  for (size_t i = 0; i < (*full)->tensors().size(); ++i) {
    const formats::TensorView& a = (*full)->tensors()[i];
    const formats::TensorView& b = (*index)->tensors()[i];
    CHECK(a.name == b.name);
    CHECK(a.data_offset == b.data_offset);
    CHECK(a.n_bytes == b.n_bytes);
    CHECK(a.data != nullptr);
    CHECK(b.data == nullptr);  // nothing inflated
  }
  CHECK((*index)->metadata().size() == (*full)->metadata().size());
  // An uncompressed file maps, so its index views point into the mapping.
  const std::string plain = Tmp("index.dpl");
  REQUIRE(ConvertGgufToDpl(in, plain, {}).ok());
  auto plain_index = formats::ModelFile::OpenIndex(plain);
  REQUIRE(plain_index.ok());
  CHECK((*plain_index)->tensors()[0].data != nullptr);
}

}  // namespace
}  // namespace dpl::converter
