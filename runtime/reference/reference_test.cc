#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "runtime/reference/reference_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "converter/convert.h"
#include "formats/gguf.h"
#include "formats/model_file.h"
#include "model/model.h"
#include "model/model_testing.h"
#include "tests/shared_dir.h"

namespace dpl::reference {
namespace {

std::string OraclePath(const std::string& file) {
  return dpl::testing::SharedDir() + "/oracle/" + file;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<int32_t> ReadTokens(const std::string& name) {
  std::vector<int32_t> ids;
  const std::string text = ReadAll(OraclePath(name + ".tokens"));
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    REQUIRE_MESSAGE(absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id), "bad token ", part);
    ids.push_back(id);
  }
  REQUIRE(!ids.empty());
  return ids;
}

std::vector<float> ReadLogits(const std::string& name) {
  const std::string bytes = ReadAll(OraclePath(name + ".logits.f32"));
  REQUIRE(bytes.size() % 4 == 0);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::unique_ptr<ReferenceModel> LoadOrDie(const std::string& path, ReferenceOptions opts = {}) {
  absl::StatusOr<std::shared_ptr<formats::ModelFile>> file = formats::ModelFile::Open(path);
  REQUIRE_MESSAGE(file.ok(), file.status().ToString());
  absl::StatusOr<std::unique_ptr<ReferenceModel>> m = ReferenceModel::Load(*file, opts);
  REQUIRE_MESSAGE(m.ok(), m.status().ToString());
  return std::move(*m);
}

// Feeds every token from position 0 and compares the logits at positions
// [first_compared, n_tokens) with the oracle rows, in order. Returns the RMS of
// the difference over the RMS of the reference, across all compared positions.
double RunAgainstOracle(const std::string& name, int64_t first_compared, double* worst_pos,
                        double* tokens_per_s, const std::string& model_path = "") {
  std::unique_ptr<ReferenceModel> m =
      LoadOrDie(model_path.empty() ? OraclePath(name + ".gguf") : model_path);
  MESSAGE(name, ": ", model::HparamsDebugString(m->hparams()), " threads=", m->threads(),
          " resident=", m->weights_resident());
  const std::vector<int32_t> tokens = ReadTokens(name);
  const std::vector<float> ref = ReadLogits(name);
  const int64_t n_vocab = m->n_vocab();
  const int64_t n_rows = static_cast<int64_t>(tokens.size()) - first_compared;
  REQUIRE(n_rows > 0);
  REQUIRE(ref.size() == static_cast<size_t>(n_rows * n_vocab));
  double diff2 = 0, ref2 = 0;
  *worst_pos = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t pos = 0; pos < static_cast<int64_t>(tokens.size()); ++pos) {
    absl::StatusOr<std::vector<double>> logits = m->ForwardF64(tokens[pos], pos);
    REQUIRE_MESSAGE(logits.ok(), logits.status().ToString());
    REQUIRE(logits->size() == static_cast<size_t>(n_vocab));
    if (pos < first_compared) continue;
    const float* r = ref.data() + (pos - first_compared) * n_vocab;
    double d2 = 0, r2 = 0;
    for (int64_t i = 0; i < n_vocab; ++i) {
      const double d = (*logits)[i] - r[i];
      d2 += d * d;
      r2 += static_cast<double>(r[i]) * r[i];
    }
    REQUIRE(r2 > 0);
    *worst_pos = std::max(*worst_pos, std::sqrt(d2 / r2));
    diff2 += d2;
    ref2 += r2;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *tokens_per_s = tokens.size() / secs;
  return std::sqrt(diff2 / ref2);
}

void CheckOracle(const std::string& name, int64_t first_compared, double limit) {
  double worst = 0, tps = 0;
  const double rel = RunAgainstOracle(name, first_compared, &worst, &tps);
  MESSAGE(name, ": RMS(logits - llama.cpp) / RMS(llama.cpp) = ", rel * 100,
          "% (worst position ", worst * 100, "%), ", tps, " tokens/s");
  CHECK(rel < limit);
  CHECK(worst < 2 * limit);
}

TEST_CASE("ora-llama-f32 matches llama.cpp") { CheckOracle("ora-llama-f32", 0, 0.002); }
TEST_CASE("ora-qwen2-f32 matches llama.cpp") { CheckOracle("ora-qwen2-f32", 0, 0.002); }
TEST_CASE("small-llama-q4km matches llama.cpp") { CheckOracle("small-llama-q4km", 0, 0.03); }
TEST_CASE("small-qwen2-q4km matches llama.cpp") { CheckOracle("small-qwen2-q4km", 0, 0.03); }
// qwen3: per-head q/k RMSNorm, head_dim 128 from attention.key_length (n_embd / n_head = 64).
TEST_CASE("small-qwen3-q4km matches llama.cpp") { CheckOracle("small-qwen3-q4km", 0, 0.03); }
// qwen3moe: the router's softmax, top 2 of 8 experts, their weights
// renormalized; the experts' 3-D tensors (q4_K, and q6_K for one layer's down).
TEST_CASE("mini-qwen3moe-q4km matches llama.cpp") { CheckOracle("mini-qwen3moe-q4km", 0, 0.03); }
// The routing shows: the same weights with one expert a token are far off
// (llama.cpp's own logits move by 31%).
TEST_CASE("mini-qwen3moe-q4km with one expert a token does not match") {
  const std::string path = dpl::testing::TempDir() + "/moe-top1.gguf";
  const absl::Status w = model::testing::WriteVariant(
      OraclePath("mini-qwen3moe-q4km.gguf"), path,
      [](formats::Metadata& m, std::vector<model::testing::TensorEdit>&) {
        m.Set("qwen3moe.expert_used_count", formats::MetaValue::U32(1));
      });
  REQUIRE_MESSAGE(w.ok(), w.ToString());
  double worst = 0, tps = 0;
  const double rel = RunAgainstOracle("mini-qwen3moe-q4km", 0, &worst, &tps, path);
  MESSAGE("one expert a token: ", rel * 100, "% from llama.cpp's two");
  CHECK(rel > 0.15);
  std::remove(path.c_str());
}
// router_margins (what the GPU tests excuse near-ties by): one entry per MoE
// layer, the gap between the k-th and (k+1)-th expert probability, in
// [0, 1); with every expert used, infinity; a dense model has none.
TEST_CASE("router_margins: one per MoE layer, each the top-k gap") {
  std::unique_ptr<ReferenceModel> m = LoadOrDie(OraclePath("mini-qwen3moe-q4km.gguf"));
  const std::vector<int32_t> tokens = ReadTokens("mini-qwen3moe-q4km");
  double smallest = 1;
  for (int64_t pos = 0; pos < 8; ++pos) {
    REQUIRE(m->ForwardF64(tokens[pos], pos).ok());
    REQUIRE(m->router_margins().size() == static_cast<size_t>(m->hparams().n_layer));
    for (double g : m->router_margins()) {
      CHECK(g >= 0);
      CHECK(g < 1);
      smallest = std::min(smallest, g);
    }
  }
  CHECK(smallest < 0.5);  // not a constant
  const std::string all = dpl::testing::TempDir() + "/moe-all.gguf";
  REQUIRE(model::testing::WriteVariant(OraclePath("mini-qwen3moe-q4km.gguf"), all,
                                       [](formats::Metadata& md, std::vector<model::testing::TensorEdit>&) {
                                         md.Set("qwen3moe.expert_used_count", formats::MetaValue::U32(8));
                                       })
              .ok());
  std::unique_ptr<ReferenceModel> every = LoadOrDie(all);
  REQUIRE(every->ForwardF64(tokens[0], 0).ok());
  for (double g : every->router_margins()) CHECK(std::isinf(g));
  std::remove(all.c_str());
  std::unique_ptr<ReferenceModel> dense = LoadOrDie(OraclePath("small-llama-q4km.gguf"));
  REQUIRE(dense->ForwardF64(tokens[0] % dense->n_vocab(), 0).ok());
  CHECK(dense->router_margins().empty());
}
// ForceExperts (what the GPU tests hold the reference to the GPU's own
// expert choices by): forcing a pass's own choices gives its logits bit for
// bit; forcing another expert in one layer moves them and leaves
// own_experts the model's; a wrong forcing is refused and forgotten.
TEST_CASE("ForceExperts: the model's own choice is its own logits, another moves them") {
  std::unique_ptr<ReferenceModel> m = LoadOrDie(OraclePath("mini-qwen3moe-q4km.gguf"));
  const std::vector<int32_t> tokens = ReadTokens("mini-qwen3moe-q4km");
  const int n_layer = static_cast<int>(m->hparams().n_layer);
  const int k = static_cast<int>(m->hparams().n_expert_used), n_expert = static_cast<int>(m->hparams().n_expert);
  REQUIRE(m->ForwardF64(tokens[0], 0).ok());
  absl::StatusOr<std::vector<double>> own = m->ForwardF64(tokens[1], 1);
  REQUIRE(own.ok());
  const std::vector<std::vector<int>> chosen = m->own_experts();
  REQUIRE(chosen.size() == static_cast<size_t>(n_layer));
  for (const std::vector<int>& ids : chosen) CHECK(ids.size() == static_cast<size_t>(k));
  // The same choices forced (in another order: the sum is over a set).
  std::vector<std::vector<int>> same = chosen;
  for (std::vector<int>& ids : same) std::reverse(ids.begin(), ids.end());
  m->ForceExperts(same);
  absl::StatusOr<std::vector<double>> forced_same = m->ForwardF64(tokens[1], 1);
  REQUIRE(forced_same.ok());
  // Reversed, the k weights add in another order: within rounding.
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < own->size(); ++i) {
    d2 += ((*forced_same)[i] - (*own)[i]) * ((*forced_same)[i] - (*own)[i]);
    r2 += (*own)[i] * (*own)[i];
  }
  CHECK(std::sqrt(d2 / r2) < 1e-12);
  m->ForceExperts(chosen);
  CHECK(*m->ForwardF64(tokens[1], 1) == *own);
  // Layer 0's last choice replaced by an expert it did not take.
  std::vector<std::vector<int>> other = chosen;
  for (int e = 0; e < n_expert; ++e) {
    if (std::find(chosen[0].begin(), chosen[0].end(), e) == chosen[0].end()) {
      other[0].back() = e;
      break;
    }
  }
  m->ForceExperts(other);
  absl::StatusOr<std::vector<double>> moved = m->ForwardF64(tokens[1], 1);
  REQUIRE(moved.ok());
  CHECK(m->own_experts() == chosen);
  d2 = 0;
  for (size_t i = 0; i < own->size(); ++i) d2 += ((*moved)[i] - (*own)[i]) * ((*moved)[i] - (*own)[i]);
  CHECK(std::sqrt(d2 / r2) > 1e-3);
  // Refused: a layer missing, a repeated id, an id out of range; then the
  // next pass is the model's own again.
  std::vector<std::vector<int>> missing(chosen.begin(), chosen.end() - 1), repeated = chosen, outside = chosen;
  repeated[1][1] = repeated[1][0];
  outside[1][1] = n_expert;
  for (const std::vector<std::vector<int>>& bad : {missing, repeated, outside}) {
    m->ForceExperts(bad);
    const absl::StatusOr<std::vector<double>> r = m->ForwardF64(tokens[1], 1);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(*m->ForwardF64(tokens[1], 1) == *own);
  }
}
// One f16 model quantized by llama-quantize into every common type: a wrong
// dequantization of any of them shows as tens of percent.
TEST_CASE("mini-llama in Q5_K_M, Q6_K, Q8_0, Q4_0, IQ4_XS and Q3_K_M matches llama.cpp") {
  for (const char* name : {"mini-llama-q5km", "mini-llama-q6k", "mini-llama-q80", "mini-llama-q40",
                           "mini-llama-iq4xs", "mini-llama-q3km"}) {
    CAPTURE(name);
    CheckOracle(name, 0, 0.03);
  }
}
// Llama 3.1's rope frequency factors matter at long range: the oracle holds
// the logits of the last 32 of 2048 positions.
TEST_CASE("small-llama31-q4km (rope_freqs) matches llama.cpp on its last 32 positions") {
  const std::vector<int32_t> tokens = ReadTokens("small-llama31-q4km");
  REQUIRE(tokens.size() == 2048);
  CheckOracle("small-llama31-q4km", static_cast<int64_t>(tokens.size()) - 32, 0.03);
}

TEST_CASE("tiny-qwen2-vocab-q4km: prompt and 3 continuation tokens match llama.cpp") {
  const std::vector<int32_t> tokens = ReadTokens("tiny-qwen2-vocab-q4km");
  REQUIRE(tokens.size() > 4);
  // 4 logit rows: after the prompt (position n_prompt - 1) and after each of
  // the 3 continuation tokens.
  CheckOracle("tiny-qwen2-vocab-q4km", static_cast<int64_t>(tokens.size()) - 4, 0.03);
}

// Per-row dequantization inside the matvec (the path a 7B model takes) must
// give the very same float64 logits as weights dequantized at load, whatever
// the thread count.
TEST_CASE("per-row and resident weights, 1 or 2 threads: identical logits") {
  const std::string path = OraclePath("small-qwen2-q4km.gguf");
  ReferenceOptions resident;
  resident.threads = 1;
  ReferenceOptions streamed;
  streamed.threads = 2;
  streamed.max_resident_bytes = 0;
  std::unique_ptr<ReferenceModel> a = LoadOrDie(path, resident);
  std::unique_ptr<ReferenceModel> b = LoadOrDie(path, streamed);
  CHECK(a->weights_resident());
  CHECK(!b->weights_resident());
  const std::vector<int32_t> tokens = ReadTokens("small-qwen2-q4km");
  for (int64_t pos = 0; pos < 5; ++pos) {
    absl::StatusOr<std::vector<double>> la = a->ForwardF64(tokens[pos], pos);
    absl::StatusOr<std::vector<double>> lb = b->ForwardF64(tokens[pos], pos);
    REQUIRE(la.ok());
    REQUIRE(lb.ok());
    REQUIRE(std::memcmp(la->data(), lb->data(), la->size() * sizeof(double)) == 0);
  }
}

// The same model as .dpl (q6_K rows in the dense split-plane layout, plain
// and zstd-compressed) gives bit-identical logits through the same API.
TEST_CASE(".dpl conversions of a Q4_K_M model give identical logits") {
  const std::string gguf_path = OraclePath("small-qwen2-q4km.gguf");
  std::unique_ptr<ReferenceModel> ref = LoadOrDie(gguf_path);
  const std::vector<int32_t> tokens = ReadTokens("small-qwen2-q4km");
  std::vector<std::vector<double>> want;
  for (int64_t pos = 0; pos < 4; ++pos) {
    absl::StatusOr<std::vector<double>> l = ref->ForwardF64(tokens[pos], pos);
    REQUIRE(l.ok());
    want.push_back(*l);
  }
  for (bool compress : {false, true}) {
    CAPTURE(compress);
    const std::string dpl_path = dpl::testing::TempDir() +
                                 (compress ? "/small-qwen2-z.dpl" : "/small-qwen2.dpl");
    converter::ConvertOptions copts;
    copts.compress = compress;
    copts.frame_bytes = 1 << 20;
    absl::StatusOr<converter::ConvertStats> st =
        converter::ConvertGgufToDpl(gguf_path, dpl_path, copts);
    REQUIRE_MESSAGE(st.ok(), st.status().ToString());
    absl::StatusOr<std::shared_ptr<formats::ModelFile>> file = formats::ModelFile::Open(dpl_path);
    REQUIRE_MESSAGE(file.ok(), file.status().ToString());
    CHECK((*file)->container() == formats::Container::kDpl);
    int n_dpl = 0;
    for (const formats::TensorView& t : (*file)->tensors()) {
      n_dpl += t.layout == formats::TensorLayout::kDpl;
    }
    CHECK(n_dpl > 0);  // token_embd (the tied lm head) is q6_K at least
    for (uint64_t resident : {uint64_t{2} << 30, uint64_t{0}}) {
      ReferenceOptions opts;
      opts.max_resident_bytes = resident;
      absl::StatusOr<std::unique_ptr<ReferenceModel>> m = ReferenceModel::Load(*file, opts);
      REQUIRE_MESSAGE(m.ok(), m.status().ToString());
      for (int64_t pos = 0; pos < 4; ++pos) {
        absl::StatusOr<std::vector<double>> l = (*m)->ForwardF64(tokens[pos], pos);
        REQUIRE(l.ok());
        REQUIRE(std::memcmp(l->data(), want[pos].data(), l->size() * sizeof(double)) == 0);
      }
    }
    std::remove(dpl_path.c_str());
  }
}

TEST_CASE("KV cache: rewind, reset, bounds") {
  ReferenceOptions opts;
  opts.n_ctx = 4;
  std::unique_ptr<ReferenceModel> m = LoadOrDie(OraclePath("ora-llama-f32.gguf"), opts);
  CHECK(m->n_ctx() == 4);
  std::vector<std::vector<float>> first;
  for (int64_t pos = 0; pos < 4; ++pos) {
    absl::StatusOr<std::vector<float>> l = m->Forward(static_cast<int32_t>(7 + pos), pos);
    REQUIRE(l.ok());
    first.push_back(*l);
  }
  CHECK(m->n_past() == 4);
  CHECK(first[0] != first[1]);

  absl::StatusOr<std::vector<float>> beyond = m->Forward(1, 4);
  CHECK(beyond.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(beyond.status().message().find("position 4") != absl::string_view::npos);

  // Re-running position 2 after a rewind reproduces it exactly.
  absl::StatusOr<std::vector<float>> again = m->Forward(9, 2);
  REQUIRE(again.ok());
  CHECK(*again == first[2]);
  CHECK(m->n_past() == 3);
  // A different token at position 1 changes what position 2 sees.
  REQUIRE(m->Forward(100, 1).ok());
  absl::StatusOr<std::vector<float>> changed = m->Forward(9, 2);
  REQUIRE(changed.ok());
  CHECK(*changed != first[2]);

  absl::StatusOr<std::vector<float>> gap = m->Forward(1, 3 + 1);  // n_past is 3: 4 skips ahead
  CHECK(!gap.ok());
  m->Reset();
  CHECK(m->n_past() == 0);
  absl::StatusOr<std::vector<float>> skip = m->Forward(1, 1);
  CHECK(skip.status().code() == absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<float>> restart = m->Forward(7, 0);
  REQUIRE(restart.ok());
  CHECK(*restart == first[0]);

  absl::StatusOr<std::vector<float>> bad_token = m->Forward(m->n_vocab(), 1);
  CHECK(bad_token.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(bad_token.status().message().find("2048") != absl::string_view::npos);
  CHECK(!m->Forward(-1, 1).ok());
}

// Logits at every position of `tokens` for a copy of small-llama-q4km (4
// layers) whose metadata says attention.sliding_window = `window` (0: none).
std::vector<std::vector<double>> WindowedLogits(const std::vector<int32_t>& tokens, uint32_t window) {
  const std::string path = dpl::testing::TempDir() + "/window-" + std::to_string(window) + ".gguf";
  REQUIRE(model::testing::WriteVariant(
              OraclePath("small-llama-q4km.gguf"), path,
              [window](formats::Metadata& m, std::vector<model::testing::TensorEdit>&) {
                if (window > 0) m.Set("llama.attention.sliding_window", formats::MetaValue::U32(window));
              })
              .ok());
  std::unique_ptr<ReferenceModel> m = LoadOrDie(path);
  std::remove(path.c_str());
  CHECK(m->hparams().sliding_window == window);
  std::vector<std::vector<double>> out;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    absl::StatusOr<std::vector<double>> l = m->ForwardF64(tokens[pos], static_cast<int64_t>(pos));
    REQUIRE(l.ok());
    out.push_back(*l);
  }
  return out;
}

// With a window of W, layer l's output at position p depends on tokens
// p - l (W - 1) .. p only: with W = 2 and 4 layers, position 5 never sees
// token 0, and with W = 1 attention returns each position's own v, so a
// token's logits do not depend on what came before at all. Full attention
// (no window, or one wider than the prompt) sees everything.
TEST_CASE("sliding window: keys older than W positions are not attended") {
  const std::vector<int32_t> a = {11, 22, 33, 44, 55, 66}, b = {99, 22, 33, 44, 55, 66};
  const auto full_a = WindowedLogits(a, 0), full_b = WindowedLogits(b, 0);
  CHECK(full_a[5] != full_b[5]);
  CHECK(WindowedLogits(a, 6) == full_a);  // a window as wide as the prompt changes nothing
  const auto w2_a = WindowedLogits(a, 2), w2_b = WindowedLogits(b, 2);
  CHECK(w2_a[5] == w2_b[5]);  // receptive field 4 * (2 - 1) = 4 positions back: 1..5
  CHECK(w2_a[4] != w2_b[4]);  // 0..4: token 0 reaches it
  CHECK(w2_a[5] != full_a[5]);
  const std::vector<int32_t> c = {44, 11, 22, 44};
  const auto w1 = WindowedLogits(c, 1);
  CHECK(w1[0] == w1[3]);  // same token, nothing else visible
}

// What ReferenceModel::Load says of a copy of ora-llama-f32.gguf after
// `edit` (model_test covers the hyperparameter and shape errors).
absl::Status LoadVariant(const std::string& tag, const model::testing::VariantEdit& edit) {
  const std::string path = dpl::testing::TempDir() + "/variant-" + tag + ".gguf";
  const absl::Status written =
      model::testing::WriteVariant(OraclePath("ora-llama-f32.gguf"), path, edit);
  REQUIRE_MESSAGE(written.ok(), written.ToString());
  absl::StatusOr<std::shared_ptr<formats::ModelFile>> file = formats::ModelFile::Open(path);
  REQUIRE_MESSAGE(file.ok(), file.status().ToString());
  ReferenceOptions opts;
  opts.threads = 1;
  opts.n_ctx = 8;
  absl::StatusOr<std::unique_ptr<ReferenceModel>> m = ReferenceModel::Load(*file, opts);
  std::remove(path.c_str());
  return m.status();
}

void CheckError(const absl::Status& s, absl::string_view needle) {
  CAPTURE(s.ToString());
  CHECK(!s.ok());
  CHECK(s.message().find(needle) != absl::string_view::npos);
}

TEST_CASE("unsupported models are rejected with an error naming the file and the problem") {
  using Tensors = std::vector<model::testing::TensorEdit>;
  // The unmodified copy loads: the edits below are what breaks it.
  CHECK(LoadVariant("same", [](formats::Metadata&, Tensors&) {}).ok());
  CheckError(LoadVariant("arch",
                         [](formats::Metadata& m, Tensors&) {
                           m.Set("general.architecture", formats::MetaValue::String("gpt2"));
                         }),
             "variant-arch.gguf: unsupported architecture 'gpt2'");
  CheckError(LoadVariant("missing",
                         [](formats::Metadata&, Tensors& t) {
                           model::testing::EraseEdit(t, "blk.1.ffn_up.weight");
                         }),
             "variant-missing.gguf: tensor 'blk.1.ffn_up.weight' is missing");
  CheckError(LoadVariant("extra",
                         [](formats::Metadata&, Tensors& t) {
                           t.push_back({{"blk.0.attn_q_norm.weight", {256}, formats::GgmlType::kF32}, ""});
                         }),
             "blk.0.attn_q_norm.weight");
  // A type the dequantizer does not know: the reference's own check.
  CheckError(LoadVariant("type",
                         [](formats::Metadata&, Tensors& t) {
                           model::testing::TensorEdit* e = model::testing::FindEdit(t, "blk.0.attn_k.weight");
                           e->spec.type = formats::GgmlType::kIQ2_XXS;
                           e->source = "";
                         }),
             "blk.0.attn_k.weight: unsupported tensor type iq2_xxs");
}

}  // namespace
}  // namespace dpl::reference
