#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "formats/dequant.h"
#include "formats/gguf.h"
#include "formats/model_file.h"
#include "model/model.h"
#include "tests/shared_dir.h"
#include "tools/synth.h"

namespace dpl::synth {
namespace {

using formats::GgmlType;
using formats::GgufFile;
using model::TensorKind;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open ", path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

// No temp file of an output at `path` (formats::OutputFile names them
// DIR/.NAME.dpl-tmp-PID-N) is left in its directory.
bool NoTempFileBeside(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string prefix = "." + p.filename().string() + ".dpl-tmp-";
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path())) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) return false;
  }
  return true;
}

std::string Oracle(const std::string& name) {
  return testing::SharedDir() + "/oracle/" + name;
}

std::string TypeName(GgmlType t) { return std::string(formats::TraitsOf(t).name); }

std::string ShapeString(const std::vector<uint64_t>& ne) {
  std::string s;
  for (uint64_t n : ne) s += (s.empty() ? "" : ",") + std::to_string(n);
  return "(" + s + ")";
}

// Two metadata values are the same when every field GGUF encodes is.
bool SameValue(const formats::MetaValue& a, const formats::MetaValue& b) {
  return a.type == b.type && a.scalar_bits == b.scalar_bits && a.bytes == b.bytes &&
         a.elem_type == b.elem_type && a.count == b.count && a.string_ends == b.string_ends;
}

// Checks that a plan matches a parsed file tensor by tensor, in order.
void CheckPlanMatchesFile(const std::vector<PlannedTensor>& plan, const GgufFile& file) {
  REQUIRE(plan.size() == file.tensors().size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const formats::GgufTensorSpec& want = plan[i].spec;
    const formats::GgufTensorInfo& got = file.tensors()[i];
    CAPTURE(got.name);
    CHECK(want.name == got.name);
    std::vector<uint64_t> got_ne(got.ne.begin(), got.ne.begin() + got.n_dims);
    CHECK(ShapeString(want.ne) == ShapeString(got_ne));
    CHECK(TypeName(want.type) == TypeName(got.type));
  }
}

void CheckSameMetadata(const formats::Metadata& want, const formats::Metadata& got) {
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const formats::MetaKV& w = want.entries()[i];
    const formats::MetaKV& g = got.entries()[i];
    CAPTURE(w.key);
    CHECK(w.key == g.key);
    CHECK_MESSAGE(SameValue(w.value, g.value), w.value.DebugString(), " vs ",
                  g.value.DebugString());
  }
}

Preset MustPreset(const std::string& name) {
  absl::StatusOr<Preset> p = FindPreset(name);
  REQUIRE_MESSAGE(p.ok(), p.status().ToString());
  return *p;
}

std::vector<PlannedTensor> MustPlan(const Preset& p, Ftype ftype) {
  absl::StatusOr<std::vector<PlannedTensor>> plan = PlanTensors(p, ftype);
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  return *plan;
}

// Dequantizes with the project's bit-exact dequantizer (formats/dequant.h,
// itself checked against llama.cpp's vectors in //formats:dequant_test).
float F16At(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return formats::F16ToF32(h);
}

std::vector<float> DequantRows(GgmlType type, const uint8_t* data, uint64_t n_elems) {
  std::vector<float> out(n_elems);
  const absl::Status s = formats::DequantizeBlocks(type, data, n_elems, out.data());
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  return out;
}

// Byte offsets of the f16 scale fields in one block (ggml-common.h).
std::vector<uint32_t> HalfScaleOffsets(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1: return {0, 2};   // d, dmin (m)
    case GgmlType::kQ6_K: return {208};    // d after ql, qh, scales
    case GgmlType::kQ3_K: return {108};    // d after hmask, qs, scales
    case GgmlType::kQ2_K: return {80, 82};  // d, dmin after scales, qs
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS: return {0};    // d first
    default: return {};
  }
}

struct Stats {
  double mean = 0, std = 0;
  bool finite = true;
};
Stats StatsOf(const std::vector<float>& v) {
  Stats s;
  double sum = 0, sq = 0;
  for (float x : v) {
    if (!std::isfinite(x)) s.finite = false;
    sum += x;
  }
  s.mean = sum / v.size();
  for (float x : v) sq += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(sq / v.size());
  return s;
}

// ------------------------------------------------------------------------

TEST_CASE("half conversion rounds to nearest and keeps subnormals") {
  CHECK(formats::F32ToF16(1.0f) == 0x3c00);
  CHECK(formats::F32ToF16(-2.0f) == 0xc000);
  CHECK(formats::F32ToF16(65504.0f) == 0x7bff);
  CHECK(formats::F32ToF16(65520.0f) == 0x7c00);
  CHECK(formats::F32ToF16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(formats::F32ToF16(std::ldexp(1.0f, -14)) == 0x0400);
  CHECK(formats::F32ToF16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie -> even
  CHECK(formats::F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half round-trips
    REQUIRE(formats::F32ToF16(formats::F16ToF32(static_cast<uint16_t>(h))) == h);
  }
}

// The Q4_K_M choice for a matrix of a Qwen2.5-7B-like model (n_gqa 7).
GgmlType Q4KM(TensorKind kind, uint32_t layer, uint32_t n_layer, uint64_t row_len, bool tied) {
  return MatrixType(Ftype::kQ4_K_M, kind, layer, row_len, MixShape{n_layer, 7, tied});
}

TEST_CASE("llama.cpp's use_more_bits and Q4_K_M choices") {
  // n = 28 (Qwen2.5-7B): layers 0-2, 24-27 and i = 5, 8, ..., 23.
  std::vector<uint32_t> more;
  for (uint32_t i = 0; i < 28; ++i) {
    if (UseMoreBits(i, 28)) more.push_back(i);
  }
  CHECK(more == std::vector<uint32_t>{0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27});
  CHECK(!UseMoreBits(0, 2));
  CHECK(UseMoreBits(1, 2));
  CHECK(Q4KM(TensorKind::kAttnV, 0, 28, 3584, false) == GgmlType::kQ6_K);
  CHECK(Q4KM(TensorKind::kAttnV, 3, 28, 3584, false) == GgmlType::kQ4_K);
  CHECK(Q4KM(TensorKind::kFfnDown, 5, 28, 18944, false) == GgmlType::kQ6_K);
  CHECK(Q4KM(TensorKind::kAttnK, 0, 28, 3584, false) == GgmlType::kQ4_K);
  CHECK(Q4KM(TensorKind::kTokenEmbd, 0, 28, 3584, false) == GgmlType::kQ4_K);
  CHECK(Q4KM(TensorKind::kTokenEmbd, 0, 28, 3584, true) == GgmlType::kQ6_K);
  CHECK(Q4KM(TensorKind::kOutput, 0, 28, 3584, false) == GgmlType::kQ6_K);
  // 896-wide rows (Qwen2.5-0.5B) are no whole number of 256-blocks.
  CHECK(Q4KM(TensorKind::kAttnQ, 3, 24, 896, true) == GgmlType::kQ5_0);
  CHECK(Q4KM(TensorKind::kTokenEmbd, 0, 24, 896, true) == GgmlType::kQ8_0);
  CHECK(Q4KM(TensorKind::kFfnDown, 0, 24, 4864, true) == GgmlType::kQ6_K);
}

// A plan's tensor types, counted by type name.
std::map<std::string, int> TypeCounts(const std::vector<PlannedTensor>& plan) {
  std::map<std::string, int> counts;
  for (const PlannedTensor& t : plan) {
    if (t.role == TensorRole::kMatrix) ++counts[TypeName(t.spec.type)];
  }
  return counts;
}

TEST_CASE("ftype names, ids and base types are llama.cpp's") {
  CHECK(Ftypes().size() == 15);
  CHECK(Ftypes().front() == Ftype::kQ4_K_M);
  for (Ftype f : Ftypes()) {
    CAPTURE(FtypeName(f));
    CHECK(ParseFtype(FtypeName(f)).value() == f);
    CHECK(ParseFtype(absl::AsciiStrToUpper(std::string(FtypeName(f)))).value() == f);
  }
  // LLAMA_FTYPE_* of llama.h.
  CHECK(static_cast<uint32_t>(Ftype::kQ5_K_M) == 17);
  CHECK(static_cast<uint32_t>(Ftype::kQ6_K) == 18);
  CHECK(static_cast<uint32_t>(Ftype::kQ8_0) == 7);
  CHECK(static_cast<uint32_t>(Ftype::kQ4_0) == 2);
  CHECK(static_cast<uint32_t>(Ftype::kQ3_K_M) == 12);
  CHECK(static_cast<uint32_t>(Ftype::kIQ4_XS) == 30);
  CHECK(static_cast<uint32_t>(Ftype::kBF16) == 32);
  CHECK(FtypeBaseType(Ftype::kQ3_K_M) == GgmlType::kQ3_K);
  CHECK(FtypeBaseType(Ftype::kIQ4_NL) == GgmlType::kIQ4_NL);
  const absl::StatusOr<Ftype> bad = ParseFtype("q4_k_s");
  REQUIRE(!bad.ok());
  for (const char* known : {"q4_k_m", "q5_k_m", "q6_k", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
                            "iq4_nl", "iq4_xs", "q3_k_m", "q2_k", "bf16", "f16", "f32"}) {
    CHECK_MESSAGE(bad.status().message().find(known) != std::string::npos, known);
  }
}

// llama-quantize wrote the six mini-llama files from one f16 model: every
// tensor's type (and general.file_type) must be what the rules give.
TEST_CASE("type mixes match llama-quantize's own files tensor for tensor") {
  struct Case {
    const char* oracle;
    Ftype ftype;
  };
  const Case cases[] = {
      {"mini-llama-q5km.gguf", Ftype::kQ5_K_M}, {"mini-llama-q6k.gguf", Ftype::kQ6_K},
      {"mini-llama-q80.gguf", Ftype::kQ8_0},    {"mini-llama-q40.gguf", Ftype::kQ4_0},
      {"mini-llama-iq4xs.gguf", Ftype::kIQ4_XS}, {"mini-llama-q3km.gguf", Ftype::kQ3_K_M},
  };
  for (const Case& c : cases) {
    CAPTURE(c.oracle);
    absl::StatusOr<GgufFile> oracle = GgufFile::Open(Oracle(c.oracle));
    REQUIRE_MESSAGE(oracle.ok(), oracle.status().ToString());
    CHECK(oracle->metadata().GetUint("general.file_type").value() ==
          static_cast<uint32_t>(c.ftype));
    const std::vector<PlannedTensor> plan = MustPlan(MustPreset("mini-llama"), c.ftype);
    CHECK(plan.size() == oracle->tensors().size());
    for (const PlannedTensor& t : plan) {
      CAPTURE(t.spec.name);
      const formats::GgufTensorInfo* got = oracle->FindTensor(t.spec.name);
      REQUIRE(got != nullptr);
      CHECK(TypeName(t.spec.type) == TypeName(got->type));
      CHECK(ShapeString(t.spec.ne) ==
            ShapeString(std::vector<uint64_t>(got->ne.begin(), got->ne.begin() + got->n_dims)));
    }
  }
}

TEST_CASE("type mix of every ftype for a 28-layer, n_gqa 7 model") {
  // Qwen2.5-7B: 198 matrices (token_embd, 7 per layer, output). use_more_bits
  // holds on 14 of the 28 layers; 28/8 = 3, 28/16 = 1.
  using Counts = std::map<std::string, int>;
  const std::pair<Ftype, Counts> cases[] = {
      {Ftype::kQ4_K_M, {{"q4_K", 169}, {"q6_K", 29}}},
      {Ftype::kQ5_K_M, {{"q5_K", 169}, {"q6_K", 29}}},
      {Ftype::kQ6_K, {{"q6_K", 198}}},
      {Ftype::kQ8_0, {{"q8_0", 198}}},
      {Ftype::kQ4_0, {{"q4_0", 197}, {"q6_K", 1}}},
      {Ftype::kQ4_1, {{"q4_1", 197}, {"q6_K", 1}}},
      {Ftype::kQ5_0, {{"q5_0", 197}, {"q6_K", 1}}},
      {Ftype::kQ5_1, {{"q5_1", 197}, {"q6_K", 1}}},
      // attn_v q5_K (n_gqa >= 4), ffn_down q5_K on layers 0-2.
      {Ftype::kIQ4_NL, {{"iq4_nl", 166}, {"q5_K", 31}, {"q6_K", 1}}},
      {Ftype::kIQ4_XS, {{"iq4_xs", 166}, {"q5_K", 31}, {"q6_K", 1}}},
      // attn_v q5_K on layers 0-1 else q4_K, ffn_down q5_K on layer 0 else
      // q4_K, attn_output q4_K.
      {Ftype::kQ3_K_M, {{"q3_K", 113}, {"q4_K", 81}, {"q5_K", 3}, {"q6_K", 1}}},
      // attn_v q4_K (n_gqa >= 4), ffn_down and attn_output q3_K.
      {Ftype::kQ2_K, {{"q2_K", 113}, {"q3_K", 56}, {"q4_K", 28}, {"q6_K", 1}}},
      {Ftype::kBF16, {{"bf16", 198}}},
      {Ftype::kF16, {{"f16", 198}}},
      {Ftype::kF32, {{"f32", 198}}},
  };
  for (const auto& [ftype, want] : cases) {
    CAPTURE(FtypeName(ftype));
    const std::vector<PlannedTensor> plan = MustPlan(MustPreset("qwen2.5-7b"), ftype);
    CHECK(TypeCounts(plan) == want);
    for (const PlannedTensor& t : plan) {  // vectors stay f32 in every mix
      if (t.role != TensorRole::kMatrix) CHECK(t.spec.type == GgmlType::kF32);
    }
  }
  const MixShape q7{28, 7, false};
  CHECK(MatrixType(Ftype::kQ3_K_M, TensorKind::kAttnV, 1, 3584, q7) == GgmlType::kQ5_K);
  CHECK(MatrixType(Ftype::kQ3_K_M, TensorKind::kAttnV, 2, 3584, q7) == GgmlType::kQ4_K);
  CHECK(MatrixType(Ftype::kQ3_K_M, TensorKind::kFfnDown, 0, 18944, q7) == GgmlType::kQ5_K);
  CHECK(MatrixType(Ftype::kIQ4_XS, TensorKind::kFfnDown, 2, 18944, q7) == GgmlType::kQ5_K);
  CHECK(MatrixType(Ftype::kIQ4_XS, TensorKind::kFfnDown, 3, 18944, q7) == GgmlType::kIQ4_XS);
  CHECK(MatrixType(Ftype::kQ5_K_M, TensorKind::kAttnQ, 0, 3584, q7) == GgmlType::kQ5_K);
  CHECK(MatrixType(Ftype::kQ5_K_M, TensorKind::kAttnK, 0, 3584, q7) == GgmlType::kQ5_K);
  // n_gqa below 4: attn_v keeps q3_K (q2_k) and the base type (iq4_*).
  const MixShape q2{28, 2, false};
  CHECK(MatrixType(Ftype::kQ2_K, TensorKind::kAttnV, 5, 3584, q2) == GgmlType::kQ3_K);
  CHECK(MatrixType(Ftype::kIQ4_NL, TensorKind::kAttnV, 5, 3584, q2) == GgmlType::kIQ4_NL);
  // Tied: token_embd is the lm head.
  CHECK(MatrixType(Ftype::kQ5_K_M, TensorKind::kTokenEmbd, 0, 3584, {28, 7, true}) ==
        GgmlType::kQ6_K);
  CHECK(MatrixType(Ftype::kQ8_0, TensorKind::kTokenEmbd, 0, 3584, {28, 7, true}) ==
        GgmlType::kQ8_0);
  CHECK(MatrixType(Ftype::kBF16, TensorKind::kOutput, 0, 3584, q7) == GgmlType::kBF16);
}

TEST_CASE("rows that are not whole 256-blocks fall back as llama.cpp does") {
  // Qwen2.5-0.5B: 896-wide rows (3.5 blocks of 256), ffn_down 4864 = 19 x 256.
  const MixShape s{24, 7, true};
  CHECK(MatrixType(Ftype::kQ5_K_M, TensorKind::kAttnQ, 3, 896, s) == GgmlType::kQ5_1);
  CHECK(MatrixType(Ftype::kQ5_K_M, TensorKind::kAttnV, 0, 896, s) == GgmlType::kQ8_0);
  CHECK(MatrixType(Ftype::kQ5_K_M, TensorKind::kFfnDown, 1, 4864, s) == GgmlType::kQ6_K);
  CHECK(MatrixType(Ftype::kQ3_K_M, TensorKind::kAttnQ, 3, 896, s) == GgmlType::kIQ4_NL);
  CHECK(MatrixType(Ftype::kQ2_K, TensorKind::kAttnK, 3, 896, s) == GgmlType::kIQ4_NL);
  CHECK(MatrixType(Ftype::kIQ4_XS, TensorKind::kFfnUp, 3, 896, s) == GgmlType::kIQ4_NL);
  CHECK(MatrixType(Ftype::kQ6_K, TensorKind::kAttnQ, 3, 896, s) == GgmlType::kQ8_0);
  // The lm head of a 32-block mix: q6_K, then q8_0 for 896-wide rows.
  CHECK(MatrixType(Ftype::kQ4_0, TensorKind::kTokenEmbd, 0, 896, s) == GgmlType::kQ8_0);
  CHECK(MatrixType(Ftype::kQ4_0, TensorKind::kTokenEmbd, 0, 1024, s) == GgmlType::kQ6_K);
  // Rows that no fallback holds: f16 for k-quants, an error from PlanTensors
  // for 32-block types.
  CHECK(MatrixType(Ftype::kQ4_K_M, TensorKind::kAttnQ, 0, 80, s) == GgmlType::kF16);
  Preset odd = MustPreset("tiny-llama");
  odd.n_embd = 240;  // 7.5 blocks of 32
  odd.head_dim = 60;
  const absl::StatusOr<std::vector<PlannedTensor>> plan = PlanTensors(odd, Ftype::kQ8_0);
  REQUIRE(!plan.ok());
  CHECK(plan.status().message().find("not a whole number of q8_0 blocks") != std::string::npos);
  for (Ftype f : Ftypes()) {
    CAPTURE(FtypeName(f));
    CHECK(PlanTensors(MustPreset("qwen2.5-0.5b"), f).ok());
  }
}

// llama.cpp's files of the qwen2.5-7b shape with the qwen2 vocabulary,
// measured on the H200 (docs anchors): Q4_K_M 4.36, Q5_K_M 5.07, Q6_K 5.82,
// Q8_0 7.54 GiB. The synthetic files' sizes (header with that vocabulary
// plus the planned tensors) must land within 1.5%; in fact they round to
// the same hundredth.
TEST_CASE("qwen2.5-7b file sizes of the k-quant and q8_0 mixes match llama.cpp's files") {
  absl::StatusOr<Vocab> vocab = LoadVocab(testing::SharedDir() + "/vocab/ggml-vocab-qwen2.gguf");
  REQUIRE_MESSAGE(vocab.ok(), vocab.status().ToString());
  Preset p = MustPreset("qwen2.5-7b");
  p.n_vocab = vocab->n_vocab;
  const double gib = double(1ull << 30);
  const std::pair<Ftype, double> cases[] = {
      {Ftype::kQ4_K_M, 4.36}, {Ftype::kQ5_K_M, 5.07}, {Ftype::kQ6_K, 5.82}, {Ftype::kQ8_0, 7.54}};
  for (const auto& [ftype, want] : cases) {
    CAPTURE(FtypeName(ftype));
    const std::vector<PlannedTensor> plan = MustPlan(p, ftype);
    std::vector<formats::GgufTensorSpec> specs;
    for (const PlannedTensor& t : plan) specs.push_back(t.spec);
    absl::StatusOr<formats::GgufHeader> h =
        formats::BuildGgufHeader(BuildMetadata(p, ftype, &*vocab), specs);
    REQUIRE(h.ok());
    const double file_gib = (h->bytes.size() + PlanDataBytes(plan)) / gib;
    CAPTURE(file_gib);
    CHECK(std::fabs(file_gib / want - 1) < 0.015);
    CHECK(std::lround(file_gib * 100) == std::lround(want * 100));
  }
}

// llama-quantize's Q4_K_M of an 8-expert qwen3moe: the router stays f32, the
// experts are 3-D, attn_k / attn_v q8_0 and attn_output q5_K (the 8-expert
// rules), ffn_down_exps q6_K where use_more_bits says (block 1 of 2).
TEST_CASE("the qwen3moe preset matches llama-quantize's file tensor for tensor") {
  absl::StatusOr<GgufFile> oracle = GgufFile::Open(Oracle("mini-qwen3moe-q4km.gguf"));
  REQUIRE_MESSAGE(oracle.ok(), oracle.status().ToString());
  const Preset p = MustPreset("mini-qwen3moe");
  const std::vector<PlannedTensor> plan = MustPlan(p, Ftype::kQ4_K_M);
  CHECK(plan.size() == oracle->tensors().size());
  for (const PlannedTensor& t : plan) {
    CAPTURE(t.spec.name);
    const formats::GgufTensorInfo* got = oracle->FindTensor(t.spec.name);
    REQUIRE(got != nullptr);
    std::vector<uint64_t> got_ne(got->ne.begin(), got->ne.begin() + got->n_dims);
    CHECK(ShapeString(t.spec.ne) == ShapeString(got_ne));
    CHECK(TypeName(t.spec.type) == TypeName(got->type));
  }
  // The metadata llama.cpp reads, key by key (the file orders them its own way).
  const formats::Metadata m = BuildMetadata(p, Ftype::kQ4_K_M, nullptr);
  for (const formats::MetaKV& kv : m.entries()) {
    CAPTURE(kv.key);
    const formats::MetaValue* want = oracle->metadata().Find(kv.key);
    REQUIRE(want != nullptr);
    CHECK_MESSAGE(SameValue(*want, kv.value), want->DebugString(), " vs ", kv.value.DebugString());
  }
}

// The oracle files were written by llama.cpp's own tooling: the presets must
// give the same tensor names, order, shapes, types and metadata.
TEST_CASE("presets reproduce the oracle files' headers") {
  struct Case {
    const char* preset;
    Ftype ftype;
    const char* oracle;
    bool vocab;
  };
  const Case cases[] = {
      {"small-qwen2", Ftype::kQ4_K_M, "small-qwen2-q4km.gguf", false},
      {"small-llama", Ftype::kQ4_K_M, "small-llama-q4km.gguf", false},
      {"tiny-qwen2", Ftype::kQ4_K_M, "tiny-qwen2-vocab-q4km.gguf", true},
      {"ora-llama", Ftype::kF32, "ora-llama-f32.gguf", false},
      {"ora-qwen2", Ftype::kF32, "ora-qwen2-f32.gguf", false},
      {"small-qwen3", Ftype::kQ4_K_M, "small-qwen3-q4km.gguf", false},
      {"small-llama31", Ftype::kQ4_K_M, "small-llama31-q4km.gguf", false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.preset);
    absl::StatusOr<GgufFile> oracle = GgufFile::Open(Oracle(c.oracle));
    REQUIRE_MESSAGE(oracle.ok(), oracle.status().ToString());
    Preset p = MustPreset(c.preset);
    std::optional<Vocab> vocab;
    if (c.vocab) {
      absl::StatusOr<Vocab> v = LoadVocab(testing::SharedDir() + "/vocab/ggml-vocab-qwen2.gguf");
      REQUIRE_MESSAGE(v.ok(), v.status().ToString());
      CHECK(v->n_vocab == 151936);
      vocab = *v;
      p.n_vocab = v->n_vocab;
    }
    const std::vector<PlannedTensor> plan = MustPlan(p, c.ftype);
    CheckPlanMatchesFile(plan, *oracle);
    CheckSameMetadata(oracle->metadata(), BuildMetadata(p, c.ftype, vocab ? &*vocab : nullptr));
    // Same header, same data layout: same file size.
    std::vector<formats::GgufTensorSpec> specs;
    for (const PlannedTensor& t : plan) specs.push_back(t.spec);
    absl::StatusOr<formats::GgufHeader> h =
        formats::BuildGgufHeader(BuildMetadata(p, c.ftype, vocab ? &*vocab : nullptr), specs);
    REQUIRE(h.ok());
    CHECK(h->bytes.size() + PlanDataBytes(plan) == oracle->file_size());
  }
}

// convert_hf_to_gguf.py's llama3 factors, bit for bit as the oracle holds
// them (head_dim 128, base 500000: the same as Llama-3.1-8B's).
TEST_CASE("rope_freqs.weight holds Llama 3.1's frequency factors") {
  absl::StatusOr<GgufFile> oracle = GgufFile::Open(Oracle("small-llama31-q4km.gguf"));
  REQUIRE_MESSAGE(oracle.ok(), oracle.status().ToString());
  const formats::GgufTensorInfo* want = oracle->FindTensor("rope_freqs.weight");
  REQUIRE(want != nullptr);
  REQUIRE(want->n_bytes == 64 * sizeof(float));
  for (const char* name : {"small-llama31", "llama3.1-8b"}) {
    CAPTURE(name);
    const std::vector<PlannedTensor> plan = MustPlan(MustPreset(name), Ftype::kQ4_K_M);
    const auto rf = std::find_if(plan.begin(), plan.end(), [](const PlannedTensor& t) {
      return t.spec.name == "rope_freqs.weight";
    });
    REQUIRE(rf != plan.end());
    CHECK(rf->role == TensorRole::kFixed);
    CHECK(rf->spec.ne == std::vector<uint64_t>{64});
    std::vector<uint8_t> got(64 * sizeof(float));
    FillRows(*rf, 123, 0, 1, got.data());  // fixed values: the seed does not matter
    CHECK(std::memcmp(got.data(), oracle->TensorData(*want), got.size()) == 0);
  }
  const std::vector<float> f = Llama3RopeFactors(Llama3RopeScaling{}, 500000.0, 128);
  REQUIRE(f.size() == 64);
  CHECK(f.front() == 1.0f);   // wavelength 2 pi: far below 8192 / 4
  CHECK(f.back() == 8.0f);    // longer than 8192: divided by the full factor
  for (size_t i = 1; i < f.size(); ++i) CHECK(f[i] >= f[i - 1]);
  // Presets without llama3 scaling have no rope_freqs.weight.
  for (const PlannedTensor& t : MustPlan(MustPreset("llama3-8b"), Ftype::kQ4_K_M)) {
    CHECK(t.spec.name != "rope_freqs.weight");
  }
}

TEST_CASE("qwen3 and Mistral presets: shapes and the keys the model reads") {
  const Preset q8 = MustPreset("qwen3-8b");
  CHECK(q8.arch == model::Arch::kQwen3);
  const std::vector<PlannedTensor> plan = MustPlan(q8, Ftype::kQ4_K_M);
  CHECK(plan.size() == 1 + 36 * 11 + 2);  // 9 per layer and q/k norms, output_norm, output
  const auto find = [&plan](const std::string& name) -> const PlannedTensor& {
    const auto it = std::find_if(plan.begin(), plan.end(),
                                 [&](const PlannedTensor& t) { return t.spec.name == name; });
    REQUIRE_MESSAGE(it != plan.end(), name);
    return *it;
  };
  CHECK(find("blk.0.attn_q.weight").spec.ne == std::vector<uint64_t>{4096, 4096});
  CHECK(find("blk.0.attn_k.weight").spec.ne == std::vector<uint64_t>{4096, 1024});
  CHECK(find("blk.35.ffn_down.weight").spec.ne == std::vector<uint64_t>{12288, 4096});
  CHECK(find("blk.0.attn_q_norm.weight").spec.ne == std::vector<uint64_t>{128});
  CHECK(find("blk.0.attn_q_norm.weight").role == TensorRole::kNorm);
  CHECK(find("output.weight").spec.ne == std::vector<uint64_t>{4096, 151936});
  for (const PlannedTensor& t : plan) CHECK(t.spec.name.find(".bias") == std::string::npos);
  const std::vector<PlannedTensor> p14 = MustPlan(MustPreset("qwen3-14b"), Ftype::kQ4_K_M);
  CHECK(p14.size() == 1 + 40 * 11 + 2);
  CHECK(p14[2].spec.name == "blk.0.attn_q.weight");
  CHECK(p14[2].spec.ne == std::vector<uint64_t>{5120, 5120});

  // key_length only where head_dim * n_head != n_embd (tiny-qwen3: 4 x 128).
  const formats::Metadata mq = BuildMetadata(MustPreset("tiny-qwen3"), Ftype::kQ4_K_M, nullptr);
  CHECK(mq.GetUint("qwen3.attention.key_length").value() == 128);
  CHECK(BuildMetadata(q8, Ftype::kQ4_K_M, nullptr).Find("qwen3.attention.key_length") ==
        nullptr);

  const Preset mistral = MustPreset("mistral-7b");
  const formats::Metadata mm = BuildMetadata(mistral, Ftype::kQ5_K_M, nullptr);
  CHECK(mm.GetString("general.architecture").value() == "llama");
  CHECK(mm.GetUint("llama.attention.sliding_window").value() == 4096);
  CHECK(mm.GetFloat("llama.rope.freq_base").value() == 10000.0);
  CHECK(mm.GetUint("llama.context_length").value() == 32768);
  CHECK(mm.GetUint("general.file_type").value() == 17);
  CHECK(MustPlan(mistral, Ftype::kQ4_K_M).front().spec.ne == std::vector<uint64_t>{4096, 32000});
  CHECK(BuildMetadata(MustPreset("llama3-8b"), Ftype::kQ4_K_M, nullptr)
            .Find("llama.attention.sliding_window") == nullptr);

  // The model description reads the window back from a written file.
  SynthOptions o;
  o.preset = MustPreset("tiny-llama");
  o.preset.sliding_window = 64;
  o.seed = 3;
  const std::string path = testing::TempDir() + "/tiny-swa.gguf";
  REQUIRE(WriteSyntheticModel(o, path).ok());
  absl::StatusOr<std::shared_ptr<formats::ModelFile>> mf = formats::ModelFile::OpenIndex(path);
  REQUIRE_MESSAGE(mf.ok(), mf.status().ToString());
  absl::StatusOr<model::ModelDesc> desc = model::BindModel(**mf);
  REQUIRE_MESSAGE(desc.ok(), desc.status().ToString());
  CHECK(desc->hp.sliding_window == 64);
}

TEST_CASE("real presets: Q4_K_M sizes match llama.cpp's files") {
  // anchors.md: llama.cpp reports 4.36 GiB (7B) and 8.36 GiB (14B).
  const double gib = double(1ull << 30);
  const double b7 = PlanDataBytes(MustPlan(MustPreset("qwen2.5-7b"), Ftype::kQ4_K_M)) / gib;
  const double b14 = PlanDataBytes(MustPlan(MustPreset("qwen2.5-14b"), Ftype::kQ4_K_M)) / gib;
  // With the real checkpoints' 152064 rows: 4.356 and 8.365 GiB.
  CHECK(b7 == doctest::Approx(4.356).epsilon(0.001));
  CHECK(b14 == doctest::Approx(8.365).epsilon(0.001));
  // The benchmark models carry the ggml-vocab-qwen2 tokenizer (--vocab), so
  // 151936 rows: llama-bench prints exactly these sizes (%.2f GiB).
  for (auto [name, want] : {std::pair<const char*, int>{"qwen2.5-7b", 436}, {"qwen2.5-14b", 836}}) {
    CAPTURE(name);
    Preset p = MustPreset(name);
    p.n_vocab = 151936;
    CHECK(std::lround(PlanDataBytes(MustPlan(p, Ftype::kQ4_K_M)) / gib * 100) == want);
  }

  // Qwen3-30B-A3B with the qwen2 vocabulary: 17.28 GiB (anchors.md), q6_K
  // on the 24 "more bits" layers' attn_v and ffn_down_exps and the head.
  Preset moe = MustPreset("qwen3-30b-a3b");
  moe.n_vocab = 151936;
  const std::vector<PlannedTensor> pm = MustPlan(moe, Ftype::kQ4_K_M);
  CHECK(std::lround(PlanDataBytes(pm) / gib * 100) == 1728);
  int q6_moe = 0;
  for (const PlannedTensor& t : pm) q6_moe += t.spec.type == GgmlType::kQ6_K;
  CHECK(q6_moe == 2 * 24 + 1);

  const std::vector<PlannedTensor> p7 = MustPlan(MustPreset("qwen2.5-7b"), Ftype::kQ4_K_M);
  CHECK(p7.size() == 1 + 28 * 12 + 2);
  int q6 = 0;
  for (const PlannedTensor& t : p7) q6 += t.spec.type == GgmlType::kQ6_K;
  CHECK(q6 == 2 * 14 + 1);  // attn_v and ffn_down on 14 layers, output
  CHECK(p7.front().spec.ne == std::vector<uint64_t>{3584, 152064});
  CHECK(p7.back().spec.name == "output.weight");

  const std::vector<PlannedTensor> p05 = MustPlan(MustPreset("qwen2.5-0.5b"), Ftype::kQ4_K_M);
  CHECK(p05.front().spec.type == GgmlType::kQ8_0);  // tied, 896-wide
  std::set<std::string> types;
  for (const PlannedTensor& t : p05) types.insert(TypeName(t.spec.type));
  CHECK(types == std::set<std::string>{"f32", "q4_K", "q5_0", "q6_K", "q8_0"});

  Preset tied = MustPreset("llama3-8b");
  tied.tied = true;
  const std::vector<PlannedTensor> pt = MustPlan(tied, Ftype::kQ4_K_M);
  CHECK(pt.front().spec.type == GgmlType::kQ6_K);
  CHECK(pt.back().spec.name == "output_norm.weight");

  for (const PlannedTensor& t : MustPlan(MustPreset("qwen2.5-7b"), Ftype::kF16)) {
    CHECK(TypeName(t.spec.type) == (t.role == TensorRole::kMatrix ? "f16" : "f32"));
  }
}

// Dequantized statistics of every type the generator makes.
TEST_CASE("weights are zero-mean with std 0.5/sqrt(row length)") {
  struct Case {
    std::string name;
    GgmlType type;
    uint64_t ne0;
    TensorRole role;
  };
  const Case cases[] = {
      {"blk.0.attn_q.weight", GgmlType::kQ4_K, 3584, TensorRole::kMatrix},
      {"blk.0.ffn_down.weight", GgmlType::kQ4_K, 18944, TensorRole::kMatrix},
      {"blk.0.ffn_down.weight", GgmlType::kQ6_K, 18944, TensorRole::kMatrix},
      {"output.weight", GgmlType::kQ6_K, 5120, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ5_0, 896, TensorRole::kMatrix},
      {"token_embd.weight", GgmlType::kQ8_0, 896, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ8_0, 4096, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ5_K, 4096, TensorRole::kMatrix},
      {"blk.0.ffn_down.weight", GgmlType::kQ5_K, 14336, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ3_K, 4096, TensorRole::kMatrix},
      {"blk.0.ffn_down.weight", GgmlType::kQ3_K, 18944, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ2_K, 3584, TensorRole::kMatrix},
      {"blk.0.ffn_up.weight", GgmlType::kQ2_K, 5120, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ4_0, 4096, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ4_1, 4096, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ5_1, 4096, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kQ5_1, 896, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kIQ4_NL, 4096, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kIQ4_XS, 3584, TensorRole::kMatrix},
      {"blk.0.ffn_down.weight", GgmlType::kIQ4_XS, 14336, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kBF16, 4096, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kF16, 1024, TensorRole::kMatrix},
      {"blk.0.attn_q.weight", GgmlType::kF32, 1024, TensorRole::kMatrix},
      {"blk.0.attn_norm.weight", GgmlType::kF32, 3584, TensorRole::kNorm},
      {"blk.0.attn_q.bias", GgmlType::kF32, 3584, TensorRole::kBias},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    CAPTURE(TypeName(c.type));
    CAPTURE(c.ne0);
    const uint64_t n_rows = 8;
    PlannedTensor t{{c.name, {c.ne0, n_rows}, c.type}, c.role, {}};
    const formats::GgmlTypeTraits tr = formats::TraitsOf(c.type);
    const uint64_t row_bytes = c.ne0 / tr.block_elems * tr.block_bytes;
    std::vector<uint8_t> buf(n_rows * row_bytes);
    FillRows(t, 7, 0, n_rows, buf.data());
    // Each row through the row dequantizer the runtime's reference uses.
    std::vector<float> values(c.ne0 * n_rows);
    for (uint64_t r = 0; r < n_rows; ++r) {
      const absl::Status st = formats::DequantizeRow(c.type, formats::TensorLayout::kRaw,
                                                     buf.data() + r * row_bytes, c.ne0,
                                                     values.data() + r * c.ne0);
      REQUIRE_MESSAGE(st.ok(), st.ToString());
    }
    const Stats s = StatsOf(values);
    CHECK(s.finite);
    if (c.role == TensorRole::kMatrix) {
      const double want = 0.5 / std::sqrt(double(c.ne0));
      CHECK(std::fabs(s.mean) < 0.1 * want);
      CHECK(s.std > 0.7 * want);
      CHECK(s.std < 1.3 * want);
      CHECK(s.std == doctest::Approx(want).epsilon(0.1));  // the design target
    } else if (c.role == TensorRole::kNorm) {
      CHECK(s.mean == doctest::Approx(1.0).epsilon(0.02));
      CHECK(s.std == doctest::Approx(0.1).epsilon(0.2));
    } else {
      CHECK(std::fabs(s.mean) < 0.005);
      CHECK(s.std == doctest::Approx(0.02).epsilon(0.2));
    }
    // Every half scale is finite (no NaN/Inf bit patterns anywhere), at the
    // offsets of ggml-common.h's block structs.
    for (uint64_t b = 0; b < buf.size() / tr.block_bytes; ++b) {
      const uint8_t* blk = buf.data() + b * tr.block_bytes;
      for (uint32_t off : HalfScaleOffsets(c.type)) REQUIRE(std::isfinite(F16At(blk + off)));
    }
  }
}

TEST_CASE("FillRows gives the same bytes for any split of the rows") {
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ3_K, GgmlType::kIQ4_XS, GgmlType::kBF16}) {
    CAPTURE(TypeName(type));
    PlannedTensor t{{"blk.1.ffn_up.weight", {512, 40}, type}, TensorRole::kMatrix, {}};
    const formats::GgmlTypeTraits tr = formats::TraitsOf(type);
    const uint64_t row_bytes = 512 / tr.block_elems * tr.block_bytes;
    std::vector<uint8_t> whole(40 * row_bytes), parts(40 * row_bytes);
    FillRows(t, 11, 0, 40, whole.data());
    FillRows(t, 11, 0, 13, parts.data());
    FillRows(t, 11, 13, 27, parts.data() + 13 * row_bytes);
    CHECK(whole == parts);
    std::vector<uint8_t> other(40 * row_bytes);
    FillRows(t, 12, 0, 40, other.data());
    CHECK(whole != other);
    t.spec.name = "blk.1.ffn_gate.weight";  // another tensor, other data
    FillRows(t, 11, 0, 40, other.data());
    CHECK(whole != other);
  }
}

absl::StatusOr<SynthResult> Synth(const std::string& preset, const std::string& out,
                                  uint64_t seed, unsigned threads,
                                  Ftype ftype = Ftype::kQ4_K_M) {
  SynthOptions o;
  o.preset = MustPreset(preset);
  o.ftype = ftype;
  o.seed = seed;
  o.threads = threads;
  return WriteSyntheticModel(o, out);
}

TEST_CASE("written models parse back with the planned tensors and metadata") {
  std::vector<std::pair<std::string, Ftype>> runs;
  for (const char* name : {"tiny-qwen2", "small-qwen2", "small-llama", "small-qwen3",
                           "small-llama31"}) {
    for (Ftype ftype : {Ftype::kQ4_K_M, Ftype::kF16, Ftype::kF32}) runs.push_back({name, ftype});
  }
  for (const char* name : {"tiny-llama", "tiny-qwen3"}) {  // every mix, every block type
    for (Ftype ftype : Ftypes()) runs.push_back({name, ftype});
  }
  for (const auto& [name, ftype] : runs) {
    CAPTURE(name);
    CAPTURE(FtypeName(ftype));
    const std::string path =
        testing::TempDir() + "/" + name + "-" + std::string(FtypeName(ftype)) + ".gguf";
    absl::StatusOr<SynthResult> r = Synth(name, path, 5, 3, ftype);
    REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    CHECK(NoTempFileBeside(path));
    absl::StatusOr<GgufFile> f = GgufFile::Open(path);
    REQUIRE_MESSAGE(f.ok(), f.status().ToString());
    const Preset p = MustPreset(name);
    const std::vector<PlannedTensor> plan = MustPlan(p, ftype);
    CheckPlanMatchesFile(plan, *f);
    CheckSameMetadata(BuildMetadata(p, ftype, nullptr), f->metadata());
    CHECK(f->version() == 3);
    CHECK(r->n_tensors == plan.size());
    CHECK(r->file_bytes == f->file_size());
    CHECK(f->metadata().GetUint("general.file_type").value() == static_cast<uint32_t>(ftype));
    CHECK(f->metadata().GetString("tokenizer.ggml.model").value() == "none");
    CHECK(f->metadata().GetUint(std::string(model::ArchName(p.arch)) + ".vocab_size").value() == 2048);
    // The runtime's model description accepts what dpl-synth writes.
    absl::StatusOr<std::shared_ptr<formats::ModelFile>> mf = formats::ModelFile::OpenIndex(path);
    REQUIRE_MESSAGE(mf.ok(), mf.status().ToString());
    absl::StatusOr<model::ModelDesc> desc = model::BindModel(**mf);
    REQUIRE_MESSAGE(desc.ok(), desc.status().ToString());
    CHECK((desc->layers[0].bq != nullptr) == p.qkv_bias);
    CHECK((desc->layers[0].q_norm != nullptr) == (p.arch == model::Arch::kQwen3));
    CHECK((desc->rope_freqs != nullptr) == p.llama3_rope.has_value());

    // The data in the file is what FillRows makes, and dequantizes sanely.
    const formats::GgufTensorInfo* q = f->FindTensor("blk.1.attn_q.weight");
    REQUIRE(q != nullptr);
    std::vector<uint8_t> want(q->n_bytes);
    const auto planned = std::find_if(plan.begin(), plan.end(), [](const PlannedTensor& t) {
      return t.spec.name == "blk.1.attn_q.weight";
    });
    REQUIRE(planned != plan.end());
    FillRows(*planned, 5, 0, q->n_rows, want.data());
    CHECK(std::memcmp(f->TensorData(*q), want.data(), want.size()) == 0);
    const Stats s = StatsOf(DequantRows(q->type, f->TensorData(*q), q->n_elements));
    CHECK(s.finite);
    CHECK(s.std == doctest::Approx(0.5 / std::sqrt(double(q->ne[0]))).epsilon(0.3));
    const formats::GgufTensorInfo* norm = f->FindTensor("output_norm.weight");
    REQUIRE(norm != nullptr);
    CHECK(StatsOf(DequantRows(GgmlType::kF32, f->TensorData(*norm), norm->n_elements)).mean ==
          doctest::Approx(1.0).epsilon(0.05));
  }
}

TEST_CASE("the vocab is copied from a vocab GGUF") {
  SynthOptions o;
  o.preset = MustPreset("tiny-qwen2");
  o.vocab_path = testing::SharedDir() + "/vocab/ggml-vocab-qwen2.gguf";
  o.seed = 1;
  const std::string path = testing::TempDir() + "/tiny-qwen2-vocab.gguf";
  absl::StatusOr<SynthResult> r = WriteSyntheticModel(o, path);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  REQUIRE(f.ok());
  absl::StatusOr<GgufFile> v = GgufFile::Open(*o.vocab_path);
  REQUIRE(v.ok());
  int copied = 0;
  for (const formats::MetaKV& kv : v->metadata().entries()) {
    if (kv.key.rfind("tokenizer.", 0) != 0) continue;
    const formats::MetaValue* got = f->metadata().Find(kv.key);
    REQUIRE_MESSAGE(got != nullptr, kv.key);
    CHECK(SameValue(kv.value, *got));
    ++copied;
  }
  CHECK(copied == 9);
  CHECK(f->metadata().Find("qwen2.vocab_size") == nullptr);
  CHECK(f->FindTensor("token_embd.weight")->ne[1] == 151936);
}

TEST_CASE("bad vocab files are refused and leave no output") {
  SynthOptions o;
  o.preset = MustPreset("tiny-llama");
  const std::string path = testing::TempDir() + "/refused.gguf";
  o.vocab_path = testing::TempDir() + "/does-not-exist.gguf";
  absl::StatusOr<SynthResult> r = WriteSyntheticModel(o, path);
  CHECK(!r.ok());
  o.vocab_path = Oracle("small-llama-q4km.gguf");  // a model without a tokenizer
  r = WriteSyntheticModel(o, path);
  REQUIRE(!r.ok());
  CHECK(r.status().message().find("tokenizer.ggml.tokens") != std::string::npos);
  CHECK(!FileExists(path));
  CHECK(NoTempFileBeside(path));
  CHECK(!FindPreset("qwen9").ok());
  CHECK(!ParseFtype("q4_k_s").ok());
  CHECK(ParseFtype("Q4_K_M").value() == Ftype::kQ4_K_M);
}

TEST_CASE("output is a function of the seed only, not of the thread count") {
  const std::string dir = testing::TempDir();
  REQUIRE(Synth("small-qwen2", dir + "/a.gguf", 42, 1).ok());
  REQUIRE(Synth("small-qwen2", dir + "/b.gguf", 42, 1).ok());
  REQUIRE(Synth("small-qwen2", dir + "/c.gguf", 42, 5).ok());
  REQUIRE(Synth("small-qwen2", dir + "/d.gguf", 43, 5).ok());
  const std::string a = ReadFile(dir + "/a.gguf");
  CHECK(a == ReadFile(dir + "/b.gguf"));
  CHECK(a == ReadFile(dir + "/c.gguf"));
  const std::string d = ReadFile(dir + "/d.gguf");
  CHECK(a.size() == d.size());
  CHECK(a != d);
  // The new block types (q3_K, q4_K, q5_K, q6_K here; iq4_xs, q5_K) too.
  for (Ftype ftype : {Ftype::kQ3_K_M, Ftype::kIQ4_XS}) {
    CAPTURE(FtypeName(ftype));
    REQUIRE(Synth("small-qwen3", dir + "/e.gguf", 42, 1, ftype).ok());
    REQUIRE(Synth("small-qwen3", dir + "/f.gguf", 42, 7, ftype).ok());
    CHECK(ReadFile(dir + "/e.gguf") == ReadFile(dir + "/f.gguf"));
  }
}

// ---- the command line

std::string Binary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  REQUIRE_MESSAGE(srcdir != nullptr, "run under bazel test");
  return std::string(srcdir) + "/" + (ws ? ws : "dpl") + "/tools/dpl-synth";
}

struct RunResult {
  int status;
  std::string out, err;
};
RunResult Run(const std::string& args) {
  const std::string dir = testing::TempDir();
  const std::string cmd =
      Binary() + " " + args + " >" + dir + "/cli.out 2>" + dir + "/cli.err";
  const int rc = std::system(cmd.c_str());
  REQUIRE(rc != -1);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, ReadFile(dir + "/cli.out"),
          ReadFile(dir + "/cli.err")};
}

TEST_CASE("dpl-synth command line") {
  const std::string dir = testing::TempDir();
  RunResult r = Run("--list");
  CHECK(r.status == 0);
  for (const char* name : {"qwen2.5-14b", "tiny-llama", "qwen3-8b", "qwen3-14b", "llama3.1-8b",
                           "mistral-7b", "tiny-qwen3"}) {
    CHECK_MESSAGE(r.out.find(name) != std::string::npos, name);
  }
  r = Run("--help");
  CHECK(r.status == 0);
  for (Ftype f : Ftypes()) {  // cxxopts wraps the list; each name is whole
    const std::string name(FtypeName(f));
    const bool listed = r.out.find(" " + name + ",") != std::string::npos ||
                        r.out.find(" " + name + " (default") != std::string::npos;
    CHECK_MESSAGE(listed, name);
  }

  r = Run("tiny-qwen3 " + dir + "/cli5.gguf --ftype Q5_K_M");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("q5_k_m") != std::string::npos);
  {
    absl::StatusOr<GgufFile> g = GgufFile::Open(dir + "/cli5.gguf");
    REQUIRE(g.ok());
    CHECK(g->metadata().GetUint("general.file_type").value() == 17);
    CHECK(TypeName(g->FindTensor("blk.0.attn_q.weight")->type) == "q5_K");
    CHECK(TypeName(g->FindTensor("blk.1.attn_v.weight")->type) == "q6_K");  // use_more_bits(1, 2)
  }

  r = Run("tiny-llama " + dir + "/cli1.gguf --seed 9 --threads 1");
  CHECK(r.status == 0);
  CHECK(r.out.find("21 tensors") != std::string::npos);
  r = Run("tiny-llama " + dir + "/cli2.gguf --seed 9 --threads 4");
  CHECK(r.status == 0);
  CHECK(ReadFile(dir + "/cli1.gguf") == ReadFile(dir + "/cli2.gguf"));

  r = Run("tiny-qwen2 " + dir + "/cli3.gguf --untied --no-vocab 4096 --ftype f16");
  REQUIRE(r.status == 0);
  absl::StatusOr<GgufFile> f = GgufFile::Open(dir + "/cli3.gguf");
  REQUIRE(f.ok());
  REQUIRE(f->FindTensor("output.weight") != nullptr);
  CHECK(f->FindTensor("output.weight")->ne[1] == 4096);
  CHECK(TypeName(f->FindTensor("output.weight")->type) == "f16");
  CHECK(f->metadata().GetUint("general.file_type").value() == 1);

  r = Run("tiny-llama " + dir + "/cli4.gguf --tied");
  REQUIRE(r.status == 0);
  f = GgufFile::Open(dir + "/cli4.gguf");
  REQUIRE(f.ok());
  CHECK(f->FindTensor("output.weight") == nullptr);
  CHECK(TypeName(f->FindTensor("token_embd.weight")->type) == "q6_K");

  struct Bad {
    std::string args, message;
  };
  const Bad bads[] = {
      {"nope " + dir + "/x.gguf", "unknown preset 'nope'"},
      {"tiny-llama " + dir + "/x.gguf --ftype q3_k", "unknown ftype 'q3_k'"},
      {"tiny-llama " + dir + "/x.gguf --ftype q3_k", "known: " + KnownFtypeNames()},
      {"tiny-llama " + dir + "/x.gguf --vocab " + dir + "/missing.gguf", "missing.gguf"},
      {"tiny-llama " + dir + "/x.gguf --vocab " + Oracle("small-llama-q4km.gguf"),
       "no tokenizer.ggml.tokens"},
      {"tiny-llama", "expected PRESET OUT.gguf"},
      {"tiny-llama " + dir + "/x.gguf --vocab a --no-vocab 5", "exclude"},
  };
  for (const Bad& b : bads) {
    CAPTURE(b.args);
    r = Run(b.args);
    CHECK(r.status == 1);
    CHECK_MESSAGE(r.err.find(b.message) != std::string::npos, r.err);
    CHECK(!FileExists(dir + "/x.gguf"));
  }
}

}  // namespace
}  // namespace dpl::synth
