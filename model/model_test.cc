#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "model/model.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "formats/hostile_test_util.h"
#include "formats/model_file.h"
#include "model/model_testing.h"
#include "tests/shared_dir.h"

namespace dpl::model {
namespace {

using formats::ModelFile;
using formats::TensorView;
using testing::TensorEdit;

std::string OraclePath(const std::string& file) {
  return dpl::testing::SharedDir() + "/oracle/" + file;
}

std::shared_ptr<ModelFile> OpenOrDie(const std::string& path) {
  absl::StatusOr<std::shared_ptr<ModelFile>> f = ModelFile::OpenIndex(path);
  REQUIRE_MESSAGE(f.ok(), f.status().ToString());
  return *f;
}

// Every .gguf of shared/oracle, sorted: the dense ones, or (moe) the
// mixture-of-experts ones.
std::vector<std::string> OracleModels(bool moe = false) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dpl::testing::SharedDir() + "/oracle")) {
    if (e.path().extension() != ".gguf") continue;
    const bool is_moe = e.path().filename().string().find("moe") != std::string::npos;
    if (is_moe == moe) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What a bound model must look like against its file.
void CheckBound(const ModelFile& file, const ModelDesc& d) {
  CHECK(d.layers.size() == static_cast<size_t>(d.hp.n_layer));
  CHECK(d.tied == (file.Find("output.weight") == nullptr));
  CHECK((d.output == d.token_embd) == d.tied);
  CHECK(d.output_norm != nullptr);
  CHECK((d.rope_freqs != nullptr) == (file.Find("rope_freqs.weight") != nullptr));
  for (const LayerTensors& L : d.layers) {
    for (const TensorView* t : {L.attn_norm, L.wq, L.wk, L.wv, L.wo, L.ffn_norm, L.w_gate,
                                L.w_up, L.w_down}) {
      REQUIRE(t != nullptr);
    }
    CHECK((L.bq != nullptr) == (d.hp.arch == Arch::kQwen2));  // the oracle's qwen2 files have them
    CHECK(L.bo == nullptr);
    CHECK((L.q_norm != nullptr) == (d.hp.arch == Arch::kQwen3));
    CHECK((L.k_norm != nullptr) == (d.hp.arch == Arch::kQwen3));
    CHECK(d.hp.qk_norm == (d.hp.arch == Arch::kQwen3));
  }
  uint64_t bytes = 0, macs = 0;  // macs: a prompt token's, the layers' matrices
  for (const TensorView& t : file.tensors()) {
    if ((t.name != "token_embd.weight" || d.tied) && t.name != "rope_freqs.weight") {
      bytes += t.n_bytes;
    }
    if (t.name.rfind("blk.", 0) == 0 && t.ne.size() > 1 && t.ne[1] > 1) macs += t.ne[0] * t.ne[1];
  }
  CHECK(d.bytes_per_token == bytes);
  CHECK(d.prompt_macs_per_token == macs);
  CHECK(macs > 0);
}

TEST_CASE("every oracle file binds (llama, qwen2, qwen3)") {
  int bound = 0, qwen3 = 0;
  for (const std::string& path : OracleModels()) {
    CAPTURE(path);
    std::shared_ptr<ModelFile> file = OpenOrDie(path);
    const absl::string_view arch = file->metadata().GetString("general.architecture").value();
    absl::StatusOr<ModelDesc> d = BindModel(*file);
    REQUIRE_MESSAGE(d.ok(), d.status().ToString());
    MESSAGE(HparamsDebugString(d->hp));
    CHECK(d->hp.arch_name == arch);
    CHECK(ArchName(d->hp.arch) == arch);
    CHECK(d->hp.sliding_window == 0);
    CheckBound(*file, *d);
    ++bound;
    if (arch == "qwen3") {
      ++qwen3;
      CHECK(d->hp.head_dim == 128);  // attention.key_length, not n_embd / n_head = 64
      CHECK(d->hp.q_dim() == 1024);
    }
  }
  CHECK(bound == 13);
  CHECK(qwen3 == 1);
}

// qwen3moe (issue 31): the router and the 3-D expert tensors bound in place
// of the dense feed-forward; a token reads n_expert_used of the experts.
TEST_CASE("the mixture-of-experts oracle binds (qwen3moe)") {
  const std::vector<std::string> moe = OracleModels(/*moe=*/true);
  REQUIRE(moe.size() == 1);
  std::shared_ptr<ModelFile> file = OpenOrDie(moe[0]);
  const absl::StatusOr<ModelDesc> d = BindModel(*file);
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  MESSAGE(HparamsDebugString(d->hp));
  CHECK(d->hp.arch == Arch::kQwen3Moe);
  CHECK(d->hp.moe());
  CHECK(d->hp.qk_norm);
  CHECK(d->hp.rope_style == RopeStyle::kNeox);
  CHECK(d->hp.n_expert == 8);
  CHECK(d->hp.n_expert_used == 2);
  CHECK(d->hp.n_ff_exp == 256);
  uint64_t bytes = 0;
  for (const LayerTensors& L : d->layers) {
    CHECK(L.w_gate == nullptr);
    CHECK(L.w_up == nullptr);
    CHECK(L.w_down == nullptr);
    REQUIRE(L.router != nullptr);
    REQUIRE(L.gate_exps != nullptr);
    REQUIRE(L.up_exps != nullptr);
    REQUIRE(L.down_exps != nullptr);
    CHECK(L.gate_exps->ne[2] == 8);
    CHECK(L.down_exps->ne[0] == 256);
    CHECK(L.q_norm != nullptr);
    bytes += (L.gate_exps->n_bytes + L.up_exps->n_bytes + L.down_exps->n_bytes) / 8 * 2;
  }
  uint64_t macs = 0;  // a prompt token's: every layer matrix, two of each expert tensor's eight
  for (const TensorView& t : file->tensors()) {
    if (t.name != "token_embd.weight" && t.name.find("_exps") == std::string::npos) bytes += t.n_bytes;
    if (t.name.rfind("blk.", 0) == 0 && t.ne.size() > 1 && t.ne[1] > 1) {
      const uint64_t m = static_cast<uint64_t>(t.ne[0]) * static_cast<uint64_t>(t.ne[1]);
      macs += t.name.find("_exps") == std::string::npos ? m : m * 2;
    }
  }
  CHECK(d->bytes_per_token == bytes);
  CHECK(d->prompt_macs_per_token == macs);
}

TEST_CASE("TensorName spells llama.cpp's names") {
  const std::pair<TensorKind, const char*> want[] = {
      {TensorKind::kTokenEmbd, "token_embd.weight"},
      {TensorKind::kOutputNorm, "output_norm.weight"},
      {TensorKind::kOutput, "output.weight"},
      {TensorKind::kRopeFreqs, "rope_freqs.weight"},
      {TensorKind::kAttnNorm, "blk.7.attn_norm.weight"},
      {TensorKind::kAttnQ, "blk.7.attn_q.weight"},
      {TensorKind::kAttnK, "blk.7.attn_k.weight"},
      {TensorKind::kAttnV, "blk.7.attn_v.weight"},
      {TensorKind::kAttnOutput, "blk.7.attn_output.weight"},
      {TensorKind::kAttnQBias, "blk.7.attn_q.bias"},
      {TensorKind::kAttnKBias, "blk.7.attn_k.bias"},
      {TensorKind::kAttnVBias, "blk.7.attn_v.bias"},
      {TensorKind::kAttnOutputBias, "blk.7.attn_output.bias"},
      {TensorKind::kFfnNorm, "blk.7.ffn_norm.weight"},
      {TensorKind::kFfnGate, "blk.7.ffn_gate.weight"},
      {TensorKind::kFfnUp, "blk.7.ffn_up.weight"},
      {TensorKind::kFfnDown, "blk.7.ffn_down.weight"},
      {TensorKind::kAttnQNorm, "blk.7.attn_q_norm.weight"},
      {TensorKind::kAttnKNorm, "blk.7.attn_k_norm.weight"},
  };
  for (const auto& [kind, name] : want) CHECK(TensorName(kind, 7) == name);
}

// The oracle files come from llama.cpp's tooling: TensorSpecs lists every
// tensor they hold, and in their order where they keep the converter's order
// (llama-quantize's mini-llama files sort theirs).
TEST_CASE("TensorSpecs: the oracle files' names, shapes and order") {
  for (const std::string& path : OracleModels()) {
    CAPTURE(path);
    std::shared_ptr<ModelFile> file = OpenOrDie(path);
    absl::StatusOr<Hparams> hp = ReadHparams(*file);
    REQUIRE_MESSAGE(hp.ok(), hp.status().ToString());
    const bool tied = file->Find("output.weight") == nullptr;
    std::vector<std::string> listed;
    for (const TensorSpec& s : TensorSpecs(*hp, tied)) {
      CAPTURE(s.name);
      const TensorView* t = file->Find(s.name);
      CHECK((t != nullptr || s.optional));
      if (t == nullptr) continue;
      listed.push_back(s.name);
      CHECK(t->ne[0] == static_cast<uint64_t>(s.n_cols));
      CHECK(t->n_rows == static_cast<uint64_t>(s.n_rows));
    }
    std::vector<std::string> in_file;
    for (const TensorView& t : file->tensors()) in_file.push_back(t.name);
    if (in_file.front() != "token_embd.weight") {
      std::sort(in_file.begin(), in_file.end());
      std::sort(listed.begin(), listed.end());
    }
    CHECK(listed == in_file);
  }
}

TEST_CASE("TensorSpecs: shapes and the architecture table") {
  // small-qwen2-q4km: 512 wide, 3 layers, 4 (2) heads of 128, ffn 1536, tied.
  absl::StatusOr<Hparams> hp = ReadHparams(*OpenOrDie(OraclePath("small-qwen2-q4km.gguf")));
  REQUIRE_MESSAGE(hp.ok(), hp.status().ToString());
  const std::vector<TensorSpec> qwen2 = TensorSpecs(*hp, /*tied=*/true);
  REQUIRE(qwen2.size() == 1 + 3 * 12 + 1);
  CHECK((qwen2[0].name == "token_embd.weight" && qwen2[0].layer == -1));
  CHECK((qwen2[0].n_cols == 512 && qwen2[0].n_rows == 2048 && qwen2[0].matrix));
  CHECK((qwen2[2].name == "blk.0.attn_q.weight" && qwen2[2].n_rows == 512));
  CHECK((qwen2[3].kind == TensorKind::kAttnK && qwen2[3].n_rows == 256 && qwen2[3].layer == 0));
  CHECK((qwen2[9].kind == TensorKind::kFfnDown && qwen2[9].n_cols == 1536));
  CHECK((qwen2[10].name == "blk.0.attn_q.bias" && qwen2[10].optional && !qwen2[10].matrix));
  CHECK((qwen2[12].n_cols == 256 && qwen2[12].n_rows == 1));
  CHECK((qwen2[13].name == "blk.1.attn_norm.weight" && qwen2[13].layer == 1));
  CHECK((qwen2.back().kind == TensorKind::kOutputNorm && !qwen2.back().optional));

  // llama may also hold attn_output.bias and rope_freqs; untied: output last.
  hp->arch = Arch::kLlama;
  const std::vector<TensorSpec> llama = TensorSpecs(*hp, /*tied=*/false);
  REQUIRE(llama.size() == 1 + 3 * 13 + 3);
  CHECK((llama[13].name == "blk.0.attn_output.bias" && llama[13].n_cols == 512));
  const TensorSpec& freqs = llama[llama.size() - 2];
  CHECK((freqs.name == "rope_freqs.weight" && freqs.n_cols == 64 && freqs.optional));
  CHECK((llama.back().name == "output.weight" && !llama.back().optional));
  for (const TensorSpec& s : llama) CHECK(s.matrix == (s.n_rows != 1));

  // qwen3: no biases; q and k norms of head_dim after each layer's matrices.
  hp->arch = Arch::kQwen3;
  const std::vector<TensorSpec> qwen3 = TensorSpecs(*hp, /*tied=*/true);
  REQUIRE(qwen3.size() == 1 + 3 * 11 + 1);
  CHECK((qwen3[10].name == "blk.0.attn_q_norm.weight" && qwen3[10].n_cols == 128 &&
         !qwen3[10].optional && !qwen3[10].matrix));
  CHECK(qwen3[11].kind == TensorKind::kAttnKNorm);
}

TEST_CASE("attention.sliding_window is read where the metadata has it") {
  const std::string path = dpl::testing::TempDir() + "/model-window.gguf";
  REQUIRE(testing::WriteVariant(OraclePath("ora-llama-f32.gguf"), path,
                                [](formats::Metadata& m, std::vector<TensorEdit>&) {
                                  m.Set("llama.attention.sliding_window", formats::MetaValue::U32(4096));
                                })
              .ok());
  absl::StatusOr<Hparams> hp = ReadHparams(*OpenOrDie(path));
  REQUIRE_MESSAGE(hp.ok(), hp.status().ToString());
  CHECK(hp->sliding_window == 4096);
  std::remove(path.c_str());
}

// A copy of `source` (by default ora-llama-f32: llama, 256 wide, 2 layers,
// 4 (2) heads) after `edit`, and what BindModel says of it.
absl::Status BindVariant(const std::string& tag, const testing::VariantEdit& edit,
                         const std::string& source = "ora-llama-f32.gguf") {
  const std::string path = dpl::testing::TempDir() + "/model-variant-" + tag + ".gguf";
  const absl::Status written = testing::WriteVariant(OraclePath(source), path, edit);
  REQUIRE_MESSAGE(written.ok(), written.ToString());
  std::shared_ptr<ModelFile> file = OpenOrDie(path);
  absl::Status s = BindModel(*file).status();
  std::remove(path.c_str());
  return s;
}

void CheckError(const absl::Status& s, absl::string_view needle) {
  CAPTURE(s.ToString());
  CHECK(!s.ok());
  CHECK(s.message().find(needle) != absl::string_view::npos);
}

TEST_CASE("hostile files: errors name the key or tensor") {
  using Meta = formats::Metadata;
  using Tensors = std::vector<TensorEdit>;
  CHECK(BindVariant("same", [](Meta&, Tensors&) {}).ok());
  CheckError(BindVariant("arch", [](Meta& m, Tensors&) {
               m.Set("general.architecture", formats::MetaValue::String("gpt2"));
             }),
             "unsupported architecture 'gpt2' (supported: llama, qwen2, qwen3, qwen3moe)");
  CheckError(BindVariant("qwen3-no-qnorm", [](Meta&, Tensors& t) { testing::EraseEdit(t, "blk.1.attn_q_norm.weight"); },
                         "small-qwen3-q4km.gguf"),
             "tensor 'blk.1.attn_q_norm.weight' is missing");
  CheckError(BindVariant("qwen3-knorm-shape", [](Meta&, Tensors& t) {
               testing::FindEdit(t, "blk.0.attn_k_norm.weight")->spec.ne = {64};
             }, "small-qwen3-q4km.gguf"),
             "blk.0.attn_k_norm.weight has shape [64], expected [128]");
  CheckError(BindVariant("qwen3-bias", [](Meta&, Tensors& t) {
               t.push_back({{"blk.0.attn_q.bias", {1024}, formats::GgmlType::kF32}, ""});
             }, "small-qwen3-q4km.gguf"),
             "tensor 'blk.0.attn_q.bias' is not part of the qwen3 graph");
  CheckError(BindVariant("window", [](Meta& m, Tensors&) {
               m.Set("llama.attention.sliding_window", formats::MetaValue::U32(0xFFFFFFFFu));
             }),
             "llama.attention.sliding_window = 4294967295 is out of range (0..16777216)");
  CheckError(BindVariant("gqa", [](Meta& m, Tensors&) {
               m.Set("llama.attention.head_count_kv", formats::MetaValue::U32(3));
             }),
             "llama.attention.head_count = 4 is not divisible by "
             "llama.attention.head_count_kv = 3");
  CheckError(BindVariant("no-embd", [](Meta& m, Tensors&) { m.Erase("llama.embedding_length"); }),
             "llama.embedding_length");
  CheckError(BindVariant("eps", [](Meta& m, Tensors&) {
               m.Set("llama.attention.layer_norm_rms_epsilon", formats::MetaValue::F32(2));
             }),
             "llama.attention.layer_norm_rms_epsilon = 2 is out of range");
  CheckError(BindVariant("yarn", [](Meta& m, Tensors&) {
               m.Set("llama.rope.scaling.type", formats::MetaValue::String("yarn"));
             }),
             "rope.scaling.type 'yarn'");
  CheckError(BindVariant("missing", [](Meta&, Tensors& t) { testing::EraseEdit(t, "blk.1.ffn_up.weight"); }),
             "tensor 'blk.1.ffn_up.weight' is missing");
  CheckError(BindVariant("shape", [](Meta&, Tensors& t) {
               testing::FindEdit(t, "blk.0.attn_k.weight")->spec.ne = {256, 64};
             }),
             "blk.0.attn_k.weight has shape [256, 64], expected [256, 128]");
  CheckError(BindVariant("width", [](Meta& m, Tensors&) {
               m.Set("llama.feed_forward_length", formats::MetaValue::U32(512));
             }),
             "blk.0.ffn_gate.weight has shape [256, 768], expected [256, 512]");
  CheckError(BindVariant("norm", [](Meta&, Tensors& t) {
               testing::FindEdit(t, "output_norm.weight")->spec.ne = {255};
             }),
             "output_norm.weight has shape [255], expected [256]");
  CheckError(BindVariant("f16-norm", [](Meta&, Tensors& t) {
               testing::FindEdit(t, "blk.1.ffn_norm.weight")->spec.type = formats::GgmlType::kF16;
             }),
             "blk.1.ffn_norm.weight has type f16, expected f32");
  CheckError(BindVariant("extra", [](Meta&, Tensors& t) {
               t.push_back({{"blk.0.attn_q_norm.weight", {64}, formats::GgmlType::kF32}, ""});
             }),
             "tensor 'blk.0.attn_q_norm.weight' is not part of the llama graph");
}

// BindModel of a variant in a child under issue 11's bounds (3 GB, 10 s).
formats::BoundedRun BindVariantBounded(const std::string& tag, const testing::VariantEdit& edit) {
  const std::string path = dpl::testing::TempDir() + "/model-bounded-" + tag + ".gguf";
  const absl::Status written = testing::WriteVariant(OraclePath("ora-llama-f32.gguf"), path, edit);
  REQUIRE_MESSAGE(written.ok(), written.ToString());
  const formats::BoundedRun run = formats::RunBounded(
      [&] {
        DPL_ASSIGN_OR_RETURN(const std::shared_ptr<ModelFile> file, ModelFile::OpenIndex(path));
        return BindModel(*file).status();
      },
      formats::kHostileMaxAddressBytes, formats::kHostileMaxSeconds);
  std::remove(path.c_str());
  return run;
}

TEST_CASE("hostile hyperparameters: capped, stated in the error, before any allocation") {
  using Meta = formats::Metadata;
  using Tensors = std::vector<TensorEdit>;
  const auto u32 = [](const char* key, uint32_t v) {
    return [key, v](Meta& m, Tensors&) { m.Set(key, formats::MetaValue::U32(v)); };
  };
  const struct {
    const char* tag;
    testing::VariantEdit edit;
    const char* expect;
  } cases[] = {
      {"layers-2-31", u32("llama.block_count", 1u << 31),
       "llama.block_count = 2147483648 is out of range (1..512)"},
      {"layers-2-27", u32("llama.block_count", 1u << 27), "llama.block_count = 134217728 is out of range"},
      {"layers-2-24", u32("llama.block_count", 1u << 24), "llama.block_count = 16777216 is out of range"},
      {"layers-500", u32("llama.block_count", 500),
       "llama.block_count = 500 but the file has 21 tensors and no 'blk.499.attn_norm.weight'"},
      {"embd", u32("llama.embedding_length", 1u << 31), "llama.embedding_length = 2147483648 is out of range (1..65536)"},
      {"ff", u32("llama.feed_forward_length", 1u << 30), "llama.feed_forward_length = 1073741824 is out of range (1..262144)"},
      {"heads", u32("llama.attention.head_count", 1u << 20), "llama.attention.head_count = 1048576 is out of range (1..1024)"},
      {"kv-heads", u32("llama.attention.head_count_kv", 4096), "head_count_kv = 4096 is out of range (1..1024)"},
      {"head-dim", u32("llama.attention.key_length", 1u << 16), "key_length = 65536 is out of range (1..1024)"},
      {"context", u32("llama.context_length", 0xFFFFFFFFu), "llama.context_length = 4294967295 is out of range (0..16777216)"},
      // (n_vocab's cap, 2^22, is token_embd's row count: a file must hold
      // that tensor, so its size bounds n_vocab already.)
  };
  for (const auto& c : cases) {
    CAPTURE(c.tag);
    const formats::BoundedRun run = BindVariantBounded(c.tag, c.edit);
    CAPTURE(run.Describe());
    REQUIRE(run.exited);
    CHECK(!run.ok);
    CHECK(run.message.find(c.expect) != std::string::npos);
  }
  const formats::BoundedRun twin = BindVariantBounded("twin", [](Meta&, Tensors&) {});
  CHECK_MESSAGE(twin.ok, twin.Describe());
}

TEST_CASE("a tied model's head is its embedding, read every step") {
  absl::StatusOr<std::shared_ptr<ModelFile>> file = ModelFile::OpenIndex(OraclePath("ora-qwen2-f32.gguf"));
  REQUIRE(file.ok());
  absl::StatusOr<ModelDesc> d = BindModel(**file);
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  CHECK(d->tied);
  CHECK(d->output == d->token_embd);
  CHECK(d->hp.rope_style == RopeStyle::kNeox);
  CHECK(d->hp.head_dim == 128);
  CHECK(d->bytes_per_token > d->token_embd->n_bytes);
}

TEST_CASE("the CUDA runtime's weight types: the list, and the error naming tensor and type") {
  std::vector<std::string> gpu;
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<formats::GgmlTypeTraits> tr = formats::FindGgmlType(id);
    if (tr && GpuHasKernelFor(tr->type)) gpu.emplace_back(tr->name);
  }
  CHECK(gpu == std::vector<std::string>{"f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K",
                                        "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs", "bf16"});
  CHECK(CheckGpuType("blk.0.attn_q.weight", formats::GgmlType::kQ4_K).ok());
  const absl::Status s = CheckGpuType("blk.0.attn_q.weight", formats::GgmlType::kIQ2_XXS);
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(std::string(s.message()) ==
        "tensor 'blk.0.attn_q.weight' is iq2_xxs, which the CUDA runtime has no kernel for (it runs "
        "f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, bf16)");
}

TEST_CASE("mixture-of-experts metadata: errors name the key") {
  using Meta = formats::Metadata;
  using Tensors = std::vector<TensorEdit>;
  const std::string moe = "mini-qwen3moe-q4km.gguf";
  CheckError(BindVariant("moe-no-used", [](Meta& m, Tensors&) { m.Erase("qwen3moe.expert_used_count"); }, moe),
             "qwen3moe.expert_used_count");
  CheckError(BindVariant("moe-used", [](Meta& m, Tensors&) {
               m.Set("qwen3moe.expert_used_count", formats::MetaValue::U32(9));
             }, moe),
             "qwen3moe.expert_used_count = 9 is out of range (1..8)");
  CheckError(BindVariant("moe-count", [](Meta& m, Tensors&) {
               m.Set("qwen3moe.expert_count", formats::MetaValue::U32(4));
             }, moe),
             "blk.0.ffn_gate_inp.weight has shape [512, 8], expected [512, 4]");
  CheckError(BindVariant("moe-exps-shape", [](Meta&, Tensors& t) {
               testing::FindEdit(t, "blk.1.ffn_up_exps.weight")->spec.ne = {512, 256, 4};
             }, moe),
             "blk.1.ffn_up_exps.weight has shape [512, 256, 4], expected [512, 256, 8]");
  CheckError(BindVariant("dense-experts", [](Meta& m, Tensors&) {
               m.Set("llama.expert_count", formats::MetaValue::U32(8));
             }),
             "llama.expert_count = 8: mixture-of-experts is supported for qwen3moe only");
}

}  // namespace
}  // namespace dpl::model
