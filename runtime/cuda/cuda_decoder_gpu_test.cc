// GPU tests (tags gpu, manual) of the whole decode step:
//   - graph replay and eager execution give identical bits;
//   - logits follow the CPU reference (normalized RMS error) for random-weight
//     models of each architecture, and for a big model given in
//     DPL_TEST_BIG_MODEL (a .dpl; e.g. a 7B-shaped dpl-synth model);
//   - a batched prompt pass matches token-by-token decoding;
//   - prompts on tensor cores, in one chunk or several, follow the reference
//     at every position;
//   - batched steps of many sequences follow the single-sequence step;
//   - mixture of experts (qwen3moe): llama.cpp's oracle and dpl-synth models
//     of every expert type, steps and prompts, batched rows, packed passes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "converter/convert.h"
#include "kernels/device_tuning.h"
#include "model/model_testing.h"
#include "runtime/cuda/cuda_decoder.h"
#include "runtime/reference/reference_model.h"
#include "tests/shared_dir.h"
#include "tools/synth.h"

namespace dpl::runtime {
namespace {

// A dpl-synth model converted with `layout`; `window` > 0 writes
// {arch}.attention.sliding_window into a copy of its metadata first.
std::string MakeDpl(const std::string& preset, synth::Ftype ftype = synth::Ftype::kQ4_K_M,
                    converter::LayoutPolicy layout = converter::LayoutPolicy::kAuto,
                    uint32_t window = 0) {
  const std::string name = absl::StrCat(preset, std::string(synth::FtypeName(ftype)), "-l",
                                        static_cast<int>(layout), "-w", window);
  const std::string gguf = testing::TempDir() + "/" + name + ".gguf";
  const std::string dpl = testing::TempDir() + "/" + name + ".dpl";
  synth::SynthOptions so;
  so.preset = *synth::FindPreset(preset);
  so.ftype = ftype;
  so.seed = 11;
  REQUIRE(synth::WriteSyntheticModel(so, gguf).ok());
  std::string src = gguf;
  if (window > 0) {
    src = gguf + ".window.gguf";
    const std::string arch(model::ArchName(so.preset.arch));
    REQUIRE(model::testing::WriteVariant(gguf, src,
                                         [&](formats::Metadata& m, std::vector<model::testing::TensorEdit>&) {
                                           m.Set(arch + ".attention.sliding_window",
                                                 formats::MetaValue::U32(window));
                                         })
                .ok());
  }
  converter::ConvertOptions co;
  co.layout = layout;
  REQUIRE(converter::ConvertGgufToDpl(src, dpl, co).ok());
  return dpl;
}

double RelRms(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// The CPU reference of the file at path, with n_ctx positions.
std::unique_ptr<reference::ReferenceModel> LoadReference(const std::string& path, int n_ctx) {
  auto file = formats::ModelFile::Open(path);
  REQUIRE_MESSAGE(file.ok(), file.status().ToString());
  reference::ReferenceOptions ro;
  ro.n_ctx = n_ctx;
  auto ref = reference::ReferenceModel::Load(*file, ro);
  REQUIRE_MESSAGE(ref.ok(), ref.status().ToString());
  return *std::move(ref);
}

std::vector<int32_t> Tokens(int n, int n_vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + 13) % n_vocab);
  return t;
}

TEST_CASE("graph replay and eager steps give identical bits") {
  for (const char* preset : {"small-llama", "small-qwen2"}) {
    CAPTURE(preset);
    const std::string path = MakeDpl(preset);
    CudaDecoderOptions g, e;
    e.eager = true;
    auto graph = CudaDecoder::Create(path, g);
    auto eager = CudaDecoder::Create(path, e);
    REQUIRE_MESSAGE(graph.ok(), graph.status().ToString());
    REQUIRE_MESSAGE(eager.ok(), eager.status().ToString());
    CHECK((*graph)->uses_graph());
    CHECK(!(*eager)->uses_graph());
    for (int32_t t : Tokens(12, (*graph)->n_vocab())) {
      std::vector<float> a, b;
      const int32_t one[1] = {t};
      REQUIRE((*graph)->Eval(one, &a, nullptr).ok());
      REQUIRE((*eager)->Eval(one, &b, nullptr).ok());
      REQUIRE(a.size() == b.size());
      CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    }
  }
}

TEST_CASE("RoPE folded into the Q/K/V matvec gives the RoPE kernel's bits") {
  // llama (adjacent pairs), qwen2 (neox pairs, q/k/v biases); Q4_K_M (q4_K
  // launches, mixed or with a q6_K V launch of its own) and Q6_K (every
  // folded q6_K form). The fold must be on for these (rope_fold_ok_), so
  // this compares the two paths, not one path with itself.
  for (const char* preset : {"small-llama", "small-qwen2"}) {
    for (synth::Ftype ftype : {synth::Ftype::kQ4_K_M, synth::Ftype::kQ6_K}) {
      CAPTURE(preset);
      CAPTURE(synth::FtypeName(ftype));
      const std::string path = MakeDpl(preset, ftype);
      absl::StatusOr<kernels::DecodeTuning> t = kernels::DecodeTuningForDevice();
      REQUIRE(t.ok());
      CudaDecoderOptions fold, plain;
      fold.tuning = *t;
      fold.tuning->rope_in_matvec = true;
      plain.tuning = *t;
      plain.tuning->rope_in_matvec = false;
      auto a = CudaDecoder::Create(path, fold);
      auto b = CudaDecoder::Create(path, plain);
      REQUIRE_MESSAGE(a.ok(), a.status().ToString());
      REQUIRE_MESSAGE(b.ok(), b.status().ToString());
      CHECK((*a)->folds_rope());
      CHECK(!(*b)->folds_rope());
      // Positions 0..39: the cache rows written by the fold are read back by
      // every later step's attention.
      for (int32_t tok : Tokens(40, (*a)->n_vocab())) {
        std::vector<float> la, lb;
        const int32_t one[1] = {tok};
        REQUIRE((*a)->Eval(one, &la, nullptr).ok());
        REQUIRE((*b)->Eval(one, &lb, nullptr).ok());
        REQUIRE(la.size() == lb.size());
        REQUIRE(std::memcmp(la.data(), lb.data(), la.size() * 4) == 0);
      }
    }
  }
}

void CompareWithReference(const std::string& path, int n_tokens, double limit) {
  CudaDecoderOptions o;
  o.n_ctx = 512;
  auto gpu = CudaDecoder::Create(path, o);
  REQUIRE_MESSAGE(gpu.ok(), gpu.status().ToString());
  const std::unique_ptr<reference::ReferenceModel> ref = LoadReference(path, 512);
  double worst = 0;
  int pos = 0;
  for (int32_t t : Tokens(n_tokens, (*gpu)->n_vocab())) {
    std::vector<float> a;
    const int32_t one[1] = {t};
    REQUIRE((*gpu)->Eval(one, &a, nullptr).ok());
    auto b = ref->Forward(t, pos++);
    REQUIRE(b.ok());
    worst = std::max(worst, RelRms(a, *b));
  }
  std::printf("%s: worst relative RMS error vs the CPU reference over %d positions: %.4f%%\n",
              path.c_str(), n_tokens, 100 * worst);
  CHECK(worst < limit);
}

TEST_CASE("logits follow the CPU reference") {
  for (const char* preset : {"small-llama", "small-qwen2", "tiny-llama", "tiny-qwen3", "small-qwen3",
                             "small-llama31"}) {
    CAPTURE(preset);
    CompareWithReference(MakeDpl(preset), 16, 0.04);
  }
}

// Every weight-type mix the GPU runs, raw and with every type's dpl planes.
TEST_CASE("logits follow the CPU reference for every ftype and layout") {
  using synth::Ftype;
  for (Ftype f : {Ftype::kQ5_K_M, Ftype::kQ6_K, Ftype::kQ8_0, Ftype::kQ4_0, Ftype::kQ4_1,
                  Ftype::kQ5_0, Ftype::kQ5_1, Ftype::kIQ4_NL, Ftype::kIQ4_XS, Ftype::kQ3_K_M,
                  Ftype::kQ2_K, Ftype::kBF16}) {
    for (converter::LayoutPolicy l : {converter::LayoutPolicy::kRaw, converter::LayoutPolicy::kDpl}) {
      CAPTURE(synth::FtypeName(f));
      CAPTURE(static_cast<int>(l));
      CompareWithReference(MakeDpl("small-llama", f, l), 8, 0.04);
    }
  }
}

// The dpl layout moves bytes only: the same model converted raw and dpl
// gives the same bits through the decode step (graph) and the prompt path
// (tensor cores and dp4a chunks) wherever both run the same kernels. A
// 70-token prompt pins dequantize + cuBLAS: the f16 form's wide launch
// (DecodeTuning::mma_f16_max_tokens) exists for q6_K and q8_0 only in
// their dpl layouts, so there the two files would take different kernels;
// ComparePromptChunkings checks the wide launch against cuBLAS.
TEST_CASE("raw and dpl conversions of a model give bit-identical logits") {
  using synth::Ftype;
  auto t = kernels::DecodeTuningForDevice();
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  CudaDecoderOptions o;
  o.tuning = *t;
  o.tuning->mma_f16_max_tokens = 0;
  for (Ftype f : {Ftype::kQ4_K_M, Ftype::kQ8_0, Ftype::kQ3_K_M, Ftype::kIQ4_XS, Ftype::kQ5_1}) {
    CAPTURE(synth::FtypeName(f));
    auto raw = CudaDecoder::Create(MakeDpl("small-qwen2", f, converter::LayoutPolicy::kRaw), o);
    auto dpl = CudaDecoder::Create(MakeDpl("small-qwen2", f, converter::LayoutPolicy::kDpl), o);
    REQUIRE_MESSAGE(raw.ok(), raw.status().ToString());
    REQUIRE_MESSAGE(dpl.ok(), dpl.status().ToString());
    const std::vector<int32_t> prompt = Tokens(70, (*raw)->n_vocab());
    std::vector<float> a, b, all_a, all_b;
    REQUIRE((*raw)->Eval(prompt, &a, &all_a).ok());
    REQUIRE((*dpl)->Eval(prompt, &b, &all_b).ok());
    CHECK(all_a == all_b);
    for (int32_t t : Tokens(5, (*raw)->n_vocab())) {
      const int32_t one[1] = {t};
      REQUIRE((*raw)->Eval(one, &a, nullptr).ok());
      REQUIRE((*dpl)->Eval(one, &b, nullptr).ok());
      CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    }
  }
}

void ComparePromptChunkings(const std::string& path, int n_tokens);  // below

// Mistral-style sliding windows on the GPU: decode steps and prompt chunks
// (tensor cores) against the CPU reference, with windows that bite (2, 5)
// and one as wide as the prompt.
TEST_CASE("a sliding window follows the CPU reference, decode and prompt") {
  for (uint32_t w : {2u, 5u, 40u}) {
    CAPTURE(w);
    const std::string path = MakeDpl("small-llama", synth::Ftype::kQ4_K_M, converter::LayoutPolicy::kAuto, w);
    CompareWithReference(path, 16, 0.04);
    ComparePromptChunkings(path, 40);
  }
}

TEST_CASE("a big model given in DPL_TEST_BIG_MODEL follows the CPU reference") {
  const char* big = std::getenv("DPL_TEST_BIG_MODEL");
  if (big == nullptr || *big == '\0') {
    MESSAGE("DPL_TEST_BIG_MODEL not set: skipped");
    return;
  }
  CompareWithReference(big, 3, 0.04);
}

// Batched and single-token passes on the dp4a matvec sum in different
// orders (the token-tiled matvec does not split rows across warps) and the
// batch takes the prompt attention kernel (f16 q and p on tensor cores). With
// f32 weights the matvec activations stay exact, so the results agree to that
// rounding carried through the layers (measured on the H200: 3.45e-5 for
// small-qwen2 f32 before the prompt attention kernel, 1.74e-4 with it). With
// quantized weights the activations are rounded to int8 per block of 32
// (matvec.h) and any last-bit difference can move a value across a rounding
// boundary: they agree only to the quantization step (1.4e-2 measured), so
// those models are held to the CPU reference instead
// (ComparePromptChunkings, max_batch 7, every position).
void CompareBatchedWithSingle(const std::string& path, double limit) {
  CudaDecoderOptions o;
  // Chunks below tuning.gemm_min_tokens take the token-tiled dp4a matvec.
  o.max_batch = kernels::DecodeTuning{}.gemm_min_tokens - 1;  // 40 tokens: chunks of 7 and a tail
  REQUIRE(o.max_batch > 1);
  auto batched = CudaDecoder::Create(path, o);
  auto single = CudaDecoder::Create(path, o);
  REQUIRE(batched.ok());
  REQUIRE(single.ok());
  const std::vector<int32_t> toks = Tokens(40, (*batched)->n_vocab());
  std::vector<float> all, last;
  REQUIRE((*batched)->Eval(toks, &last, &all).ok());
  REQUIRE(all.size() == toks.size() * static_cast<size_t>((*batched)->n_vocab()));
  const size_t V = (*batched)->n_vocab();
  double worst = 0;
  for (size_t i = 0; i < toks.size(); ++i) {
    std::vector<float> one_logits;
    const int32_t one[1] = {toks[i]};
    REQUIRE((*single)->Eval(one, &one_logits, nullptr).ok());
    std::vector<float> row(all.begin() + i * V, all.begin() + (i + 1) * V);
    worst = std::max(worst, RelRms(row, one_logits));
  }
  std::printf("%s: batched vs single-token: worst relative RMS difference %.2e (limit %.0e)\n",
              path.c_str(), worst, limit);
  CHECK(worst < limit);
}

TEST_CASE("a batched prompt pass on the dp4a matvec matches token-by-token decoding (f32)") {
  CompareBatchedWithSingle(MakeDpl("small-qwen2", synth::Ftype::kF32), 2e-4);
}

// The prompt paths against the float64 CPU reference at every position: a
// prompt in one chunk (f16 weights and activations, cuBLAS, flash attention
// over the chunk; and on the f16 form's wide launch, k unsplit and split),
// in chunks of 64 and a short tail (int8 activations: the mma form of the
// matvec for q4_K / q6_K models, else f16 GEMM for the chunks and the token
// tile for the tail), in chunks of gemm_min_tokens - 1 and token by token.
// The chunkings are also compared with each other: the differences are
// printed (issue 8 asks for them) and bounded by the same 4% gate.
void ComparePromptChunkings(const std::string& path, int n_tokens) {
  const std::unique_ptr<reference::ReferenceModel> ref = LoadReference(path, 1024);
  std::vector<int32_t> toks = Tokens(n_tokens, ref->n_vocab());
  std::vector<std::vector<double>> want;
  for (int i = 0; i < n_tokens; ++i) {
    auto row = ref->Forward(toks[i], i);
    REQUIRE(row.ok());
    want.emplace_back(row->begin(), row->end());
  }
  const size_t V = want[0].size();
  // wide: products of more than 64 tokens on the f16 form's wide launch
  // (DecodeTuning::mma_f16_max_tokens) where every matrix has the form;
  // split: its k split in clusters (mma_f16_wide_split); mix: with Q/K/V, O
  // and a q6_K down on dequantize + cuBLAS in that pass (wide_gemm_*, from
  // 65 rows). Otherwise they dequantize + cuBLAS, whatever the default limit.
  auto rows_of = [&](int max_batch, bool wide = false, bool split = false, bool mix = false) {
    CudaDecoderOptions o;
    o.n_ctx = 1024;
    o.max_batch = max_batch;
    absl::StatusOr<kernels::DecodeTuning> t = kernels::DecodeTuningForDevice();
    REQUIRE(t.ok());
    o.tuning = *t;
    o.tuning->mma_f16_max_tokens = wide ? 512 : 0;
    o.tuning->mma_f16_wide_split = split;
    const int from = mix ? kernels::kMmaMaxTokens + 1 : 0;
    o.tuning->wide_gemm_qkv_rows = o.tuning->wide_gemm_o_rows = o.tuning->wide_gemm_q6k_down_rows = from;
    auto d = CudaDecoder::Create(path, o);
    REQUIRE_MESSAGE(d.ok(), d.status().ToString());
    std::vector<float> all, last;
    if (max_batch == 1) {
      for (int32_t t : toks) {
        const int32_t one[1] = {t};
        REQUIRE((*d)->Eval(one, &last, nullptr).ok());
        all.insert(all.end(), last.begin(), last.end());
      }
    } else {
      const absl::Status s = (*d)->Eval(toks, &last, &all);
      REQUIRE_MESSAGE(s.ok(), s.ToString());
    }
    REQUIRE(all.size() == toks.size() * V);
    return all;
  };
  auto worst_vs = [&](const std::vector<float>& got, const std::vector<float>* other) {
    double worst = 0;
    for (int i = 0; i < n_tokens; ++i) {
      const std::vector<float> row(got.begin() + i * V, got.begin() + (i + 1) * V);
      if (other != nullptr) {
        worst = std::max(worst, RelRms(row, std::vector<float>(other->begin() + i * V,
                                                               other->begin() + (i + 1) * V)));
      } else {
        worst = std::max(worst, RelRms(row, std::vector<float>(want[i].begin(), want[i].end())));
      }
    }
    return worst;
  };
  const std::vector<float> one_chunk = rows_of(512);
  const std::vector<float> wide = rows_of(512, true);
  const std::vector<float> wide_split = rows_of(512, true, true);
  const std::vector<float> wide_mix = rows_of(512, true, true, true);
  const std::vector<float> chunks = rows_of(64);  // 64 * k + a tail below gemm_min_tokens
  const std::vector<float> dp4a = rows_of(kernels::DecodeTuning{}.gemm_min_tokens - 1);
  const std::vector<float> single = rows_of(1);
  const double e_one = worst_vs(one_chunk, nullptr), e_chunks = worst_vs(chunks, nullptr),
               e_dp4a = worst_vs(dp4a, nullptr), e_single = worst_vs(single, nullptr),
               e_wide = worst_vs(wide, nullptr), e_split = worst_vs(wide_split, nullptr),
               e_mix = worst_vs(wide_mix, nullptr);
  const double d_chunks = worst_vs(chunks, &one_chunk), d_dp4a = worst_vs(dp4a, &one_chunk),
               d_single = worst_vs(single, &one_chunk), d_wide = worst_vs(wide, &one_chunk),
               d_split = worst_vs(wide_split, &one_chunk), d_mix = worst_vs(wide_mix, &one_chunk);
  std::printf("%s, %d tokens, worst relative RMS vs the CPU reference: one chunk %.4f%%, one chunk on "
              "the f16 form's wide launch %.4f%% (k split %.4f%%), chunks of 64 %.4f%%, dp4a chunks %.4f%%, "
              "token by token %.4f%%; vs one chunk: wide %.2e (split %.2e), chunks %.2e, dp4a chunks %.2e, "
              "token by token %.2e\n",
              path.c_str(), n_tokens, 100 * e_one, 100 * e_wide, 100 * e_split, 100 * e_chunks, 100 * e_dp4a,
              100 * e_single, d_wide, d_split, d_chunks, d_dp4a, d_single);
  CHECK(e_one < 0.04);
  CHECK(e_wide < 0.04);
  CHECK(d_wide < 0.04);
  CHECK(e_split < 0.04);
  CHECK(d_split < 0.04);
  std::printf("  the wide pass with Q/K/V, O and q6_K down on cuBLAS: %.4f%% from the reference, %.2e from one "
              "chunk\n", 100 * e_mix, d_mix);
  CHECK(e_mix < 0.04);
  CHECK(d_mix < 0.04);
  CHECK(e_chunks < 0.04);
  CHECK(e_dp4a < 0.04);
  CHECK(e_single < 0.04);
  CHECK(d_chunks < 0.04);
  CHECK(d_dp4a < 0.04);
  CHECK(d_single < 0.04);
}

// Prompt chunks of four sequences packed into one pass (EvalSeqs: tensor
// cores for 107 rows, then the int8 path for 6), each chunk's last logits
// against its own CPU reference at that position (the limit of the chunking
// test above), the caches then continued by a decode step; the same pass
// again gives the same bits; bad passes change nothing.
TEST_CASE("a packed prompt pass of several sequences follows each sequence's reference") {
  const std::string path = MakeDpl("small-qwen2");
  auto file = formats::ModelFile::Open(path);
  REQUIRE(file.ok());
  CudaDecoderOptions o;
  o.n_ctx = 256;
  o.n_seq = 4;
  o.max_batch = 128;
  auto made = CudaDecoder::Create(path, o);
  REQUIRE_MESSAGE(made.ok(), made.status().ToString());
  CudaDecoder& d = **made;
  const int V = d.n_vocab();
  const std::vector<int> first_len = {37, 5, 64, 1}, second_len = {2, 1, 1, 2};
  std::vector<std::vector<int32_t>> toks(4);
  std::vector<std::unique_ptr<reference::ReferenceModel>> refs;
  for (int s = 0; s < 4; ++s) {
    for (int i = 0; i < first_len[s] + second_len[s]; ++i) toks[s].push_back((i * 7919 + 13 + 1000 * s) % V);
    reference::ReferenceOptions ro;
    ro.n_ctx = 256;
    auto r = reference::ReferenceModel::Load(*file, ro);
    REQUIRE(r.ok());
    refs.push_back(*std::move(r));
  }
  auto pass = [&](const std::vector<int>& from, const std::vector<int>& len, std::vector<float>* last) {
    std::vector<CudaDecoder::SeqChunk> chunks;
    for (int s = 0; s < 4; ++s) chunks.push_back({s, absl::MakeConstSpan(toks[s]).subspan(from[s], len[s])});
    return d.EvalSeqs(chunks, last);
  };
  auto check = [&](const std::vector<float>& last, const std::vector<int>& upto) {
    REQUIRE(last.size() == 4 * static_cast<size_t>(V));
    for (int s = 0; s < 4; ++s) {
      std::vector<float> want;
      for (int i = static_cast<int>(refs[s]->n_past()); i < upto[s]; ++i) {
        auto row = refs[s]->Forward(toks[s][i], i);
        REQUIRE(row.ok());
        want = *row;
      }
      const double e = RelRms(std::vector<float>(last.begin() + s * V, last.begin() + (s + 1) * V), want);
      CAPTURE(s);
      CHECK(e < 0.04);
      CHECK(d.n_past(s) == upto[s]);
    }
  };
  std::vector<float> last, again;
  REQUIRE(pass({0, 0, 0, 0}, first_len, &last).ok());
  check(last, first_len);
  // The same pass again on rewound sequences: the same bits.
  for (int s = 0; s < 4; ++s) REQUIRE(d.RewindSeq(s, 0).ok());
  REQUIRE(pass({0, 0, 0, 0}, first_len, &again).ok());
  CHECK(again == last);
  // Bad passes: nothing runs, nothing moves.
  std::vector<CudaDecoder::SeqChunk> twice = {{1, absl::MakeConstSpan(toks[1]).subspan(0, 1)},
                                              {1, absl::MakeConstSpan(toks[1]).subspan(1, 1)}};
  CHECK(!d.EvalSeqs(twice, nullptr).ok());
  const std::vector<int32_t> big(100, 3), bad = {V};
  std::vector<CudaDecoder::SeqChunk> too_many = {{0, big}, {1, big}};
  CHECK(!d.EvalSeqs(too_many, nullptr).ok());
  std::vector<CudaDecoder::SeqChunk> bad_id = {{0, big}, {1, bad}};
  CHECK(!d.EvalSeqs(bad_id, nullptr).ok());
  for (int s = 0; s < 4; ++s) CHECK(d.n_past(s) == first_len[s]);
  // The second chunks (6 rows: the int8 path), at each sequence's position.
  REQUIRE(pass(first_len, second_len, &last).ok());
  std::vector<int> total(4);
  for (int s = 0; s < 4; ++s) total[s] = first_len[s] + second_len[s];
  check(last, total);
}

// Sequence 0's decode row with `chunks` in one mixed pass on a
// (StepWithChunks), a step and then a packed pass of the chunks on b; checks
// the row's logits agree within 4% (other matmul paths, so not the same
// bits) and returns each decoder's chunks' last logits, (chunks, n_vocab).
std::pair<std::vector<float>, std::vector<float>> MixedPassAgainstTwo(
    CudaDecoder& a, CudaDecoder& b, const std::vector<CudaDecoder::SeqChunk>& chunks) {
  const int zero[1] = {0};
  int32_t next_a[1] = {-1}, next_b[1] = {-1};
  std::vector<float> last_a, last_b, row_a, row_b;
  REQUIRE(a.StepWithChunks(zero, next_a, chunks, &last_a).ok());
  REQUIRE(a.StepLogits(0, &row_a).ok());
  REQUIRE(b.StepSeqs(zero, next_b).ok());
  REQUIRE(b.StepLogits(0, &row_b).ok());
  REQUIRE(b.EvalSeqs(chunks, &last_b).ok());
  CHECK(RelRms(row_a, row_b) < 0.04);
  REQUIRE(last_a.size() == chunks.size() * static_cast<size_t>(a.n_vocab()));
  REQUIRE(last_b.size() == last_a.size());
  return {std::move(last_a), std::move(last_b)};
}

// A mixed pass (StepWithChunks: sequence 0's decode row and two prompt
// chunks of sequences 1 and 2 in one forward pass) against the same work as
// a step and then a packed pass on a twin decoder: the step's logits, the
// chunks' last logits, and after it a step of all three (the caches the
// mixed pass wrote, at the right positions of the right regions), each row
// within the chunking limit of the reference comparisons above (the passes
// take other matmul paths, so not the same bits); greedy.
TEST_CASE("a mixed pass of a decode row and prompt chunks follows a step and a packed pass") {
  const std::string path = MakeDpl("small-qwen2");
  CudaDecoderOptions o;
  o.n_ctx = 256;
  o.n_seq = 3;
  o.max_batch = 128;
  auto made_a = CudaDecoder::Create(path, o), made_b = CudaDecoder::Create(path, o);
  REQUIRE(made_a.ok());
  REQUIRE(made_b.ok());
  CudaDecoder &a = **made_a, &b = **made_b;
  const int V = a.n_vocab();
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  std::vector<std::vector<int32_t>> toks(3);
  const int len[3] = {20, 30, 3};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < len[s]; ++i) toks[s].push_back((i * 7919 + 29 + 977 * s) % V);
  }
  for (CudaDecoder* d : {&a, &b}) {
    REQUIRE(d->EvalSeq(0, toks[0], nullptr, nullptr).ok());
    REQUIRE(d->BeginSampling(0, greedy, toks[0]).ok());
  }
  const std::vector<CudaDecoder::SeqChunk> chunks = {{1, toks[1]}, {2, toks[2]}};
  const auto [last_a, last_b] = MixedPassAgainstTwo(a, b, chunks);
  for (int c = 0; c < 2; ++c) {
    CAPTURE(c);
    CHECK(RelRms(std::vector<float>(last_a.begin() + c * V, last_a.begin() + (c + 1) * V),
                 std::vector<float>(last_b.begin() + c * V, last_b.begin() + (c + 1) * V)) < 0.04);
  }
  for (int s = 0; s < 3; ++s) CHECK(a.n_past(s) == b.n_past(s));
  // Sequences 1 and 2 start sampling; one step of all three on each.
  for (CudaDecoder* d : {&a, &b}) {
    REQUIRE(d->BeginSampling(1, greedy, toks[1]).ok());
    REQUIRE(d->BeginSampling(2, greedy, toks[2]).ok());
  }
  const int all[3] = {0, 1, 2};
  int32_t na[3], nb[3];
  REQUIRE(a.StepSeqs(all, na).ok());
  REQUIRE(b.StepSeqs(all, nb).ok());
  std::vector<float> row_a, row_b;
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    REQUIRE(a.StepLogits(i, &row_a).ok());
    REQUIRE(b.StepLogits(i, &row_b).ok());
    CHECK(RelRms(row_a, row_b) < 0.04);
  }
  // A sequence in both the step and a chunk, or too many rows: refused.
  const int zero[1] = {0};
  int32_t next_a[1] = {-1};
  const std::vector<CudaDecoder::SeqChunk> overlap = {{0, toks[2]}};
  CHECK(!a.StepWithChunks(zero, next_a, overlap, nullptr).ok());
  const std::vector<int32_t> big(128, 5);
  const std::vector<CudaDecoder::SeqChunk> too_big = {{1, big}};
  CHECK(!a.StepWithChunks(zero, next_a, too_big, nullptr).ok());
}

TEST_CASE("prompts on tensor cores: one chunk, several, token by token, all follow the reference") {
  // Chunks of 64 and tails of 5 and 3 tokens (see above).
  REQUIRE(kernels::DecodeTuning{}.gemm_min_tokens <= 64);
  REQUIRE(kernels::DecodeTuning{}.gemm_min_tokens > 5);
  ComparePromptChunkings(MakeDpl("small-qwen2"), 64 * 3 + 5);
  ComparePromptChunkings(MakeDpl("small-llama"), 64 * 2 + 3);
  ComparePromptChunkings(MakeDpl("small-qwen2", synth::Ftype::kF32), 150);
}

}  // namespace
}  // namespace dpl::runtime

namespace dpl::runtime {
namespace {

std::vector<int32_t> DeviceSample(CudaDecoder& d, const generate::SamplerParams& p,
                                  const std::vector<int32_t>& prompt, int n) {
  REQUIRE(d.Rewind(0).ok());
  std::vector<float> last;
  REQUIRE(d.Eval(prompt, &last, nullptr).ok());
  std::vector<int32_t> out;
  const absl::Status s = d.SampleLoop(p, prompt, n, [&](int32_t t) {
    out.push_back(t);
    return true;
  });
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  return out;
}

TEST_CASE("on-device greedy sampling follows the logits; seeded sampling repeats; graph == eager") {
  const std::string path = MakeDpl("small-llama");
  CudaDecoderOptions g, e;
  e.eager = true;
  auto graph = CudaDecoder::Create(path, g);
  auto eager = CudaDecoder::Create(path, e);
  REQUIRE(graph.ok());
  REQUIRE(eager.ok());
  const std::vector<int32_t> prompt = Tokens(9, (*graph)->n_vocab());

  // Greedy on the device equals argmax over the logits Eval returns.
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> dev = DeviceSample(**graph, greedy, prompt, 20);
  REQUIRE(dev.size() == 20);
  REQUIRE((*eager)->Rewind(0).ok());
  std::vector<float> logits;
  REQUIRE((*eager)->Eval(prompt, &logits, nullptr).ok());
  for (int32_t want : dev) {
    const int32_t argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    CHECK(argmax == want);
    const int32_t one[1] = {want};
    REQUIRE((*eager)->Eval(one, &logits, nullptr).ok());
  }

  // Seeded temperature sampling: same seed twice, graph and eager alike.
  generate::SamplerParams p;
  p.temperature = 1.2f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.repeat_penalty = 1.1f;
  p.seed = 1234;
  auto fresh_graph = CudaDecoder::Create(path, g);
  auto fresh_eager = CudaDecoder::Create(path, e);
  REQUIRE(fresh_graph.ok());
  REQUIRE(fresh_eager.ok());
  const std::vector<int32_t> a = DeviceSample(**fresh_graph, p, prompt, 32);
  const std::vector<int32_t> b = DeviceSample(**fresh_eager, p, prompt, 32);
  CHECK(a == b);
  auto again = CudaDecoder::Create(path, g);
  REQUIRE(again.ok());
  CHECK(DeviceSample(**again, p, prompt, 32) == a);
  p.seed = 4321;
  auto other = CudaDecoder::Create(path, g);
  REQUIRE(other.ok());
  CHECK(DeviceSample(**other, p, prompt, 32) != a);
}

// OpenAI's presence penalty alone (repeat_penalty 1) keeps the penalty ring:
// a penalty far above the logits' spread means no token comes twice within
// the window (prompt included), greedy or not.
TEST_CASE("a presence penalty alone still penalizes on the device") {
  const std::string path = MakeDpl("tiny-llama");
  auto d = CudaDecoder::Create(path, {});
  REQUIRE(d.ok());
  const std::vector<int32_t> prompt = Tokens(5, (*d)->n_vocab());
  generate::SamplerParams p;
  p.temperature = 0;
  p.repeat_penalty = 1.0f;
  p.presence_penalty = 1000.0f;
  p.repeat_last_n = 64;
  const std::vector<int32_t> got = DeviceSample(**d, p, prompt, 32);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), got.begin(), got.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
}

TEST_CASE("the sampling loop stops where the caller says and keeps the cache consistent") {
  const std::string path = MakeDpl("tiny-llama");
  auto d = CudaDecoder::Create(path, {});
  REQUIRE(d.ok());
  const std::vector<int32_t> prompt = Tokens(5, (*d)->n_vocab());
  std::vector<float> last;
  REQUIRE((*d)->Eval(prompt, &last, nullptr).ok());
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  int seen = 0;
  REQUIRE((*d)->SampleLoop(greedy, prompt, -1, [&](int32_t) { return ++seen < 7; }).ok());
  CHECK(seen == 7);
  CHECK((*d)->n_past() == 5 + 7);  // 6 accepted tokens + the refused one, all fed
}

}  // namespace
}  // namespace dpl::runtime

namespace dpl::runtime {
namespace {

// Batched decode steps against the single-sequence step. n_seq sequences
// with prompts of different lengths start together; then `schedule` says
// which of them step together, for how many steps (the active set shrinks
// and shifts: padding rows, sequences sitting out while others go on).
// Every row's logits are compared with a one-sequence decoder fed the same
// tokens at the same positions; each row's token is the argmax of its
// logits. Returns the worst relative RMS difference of a row.
using Schedule = std::vector<std::pair<std::vector<int>, int>>;
double WorstBatchedVsSingle(const std::string& path, int n_seq, const Schedule& schedule) {
  CudaDecoderOptions bo;
  bo.n_ctx = 128;
  bo.n_seq = n_seq;
  auto batched = CudaDecoder::Create(path, bo);
  REQUIRE_MESSAGE(batched.ok(), batched.status().ToString());
  CudaDecoder& B = **batched;
  CudaDecoderOptions so;
  so.n_ctx = 128;
  auto single = CudaDecoder::Create(path, so);
  REQUIRE(single.ok());
  CudaDecoder& A = **single;
  const int V = B.n_vocab();
  std::vector<std::vector<int32_t>> seq_tokens(n_seq);  // prompt, then every fed token
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> pool = Tokens(64, V);
  for (int s = 0; s < n_seq; ++s) {
    seq_tokens[s].assign(pool.begin() + s, pool.begin() + s + 3 + s % 12);  // 3..14 tokens
    REQUIRE(B.EvalSeq(s, seq_tokens[s], nullptr, nullptr).ok());
    auto first = B.BeginSampling(s, greedy, seq_tokens[s]);
    REQUIRE(first.ok());
    seq_tokens[s].push_back(*first);
  }
  std::vector<std::vector<std::vector<float>>> step_logits(n_seq);  // per sequence, in order
  for (const auto& [seqs, steps] : schedule) {
    for (int i = 0; i < steps; ++i) {
      std::vector<int32_t> next(seqs.size());
      const absl::Status st = B.StepSeqs(seqs, absl::MakeSpan(next));
      REQUIRE_MESSAGE(st.ok(), st.ToString());
      for (size_t r = 0; r < seqs.size(); ++r) {
        std::vector<float> row;
        REQUIRE(B.StepLogits(static_cast<int>(r), &row).ok());
        CHECK(next[r] == std::max_element(row.begin(), row.end()) - row.begin());
        step_logits[seqs[r]].push_back(std::move(row));
        seq_tokens[seqs[r]].push_back(next[r]);
      }
    }
  }
  double worst = 0;
  for (int s = 0; s < n_seq; ++s) {
    const size_t n_steps = step_logits[s].size();
    CHECK(B.n_past(s) == static_cast<int64_t>(seq_tokens[s].size() - 1));
    // A: the prompt (the same single chunk as B's), then each fed token alone.
    const size_t prompt = seq_tokens[s].size() - 1 - n_steps;
    REQUIRE(A.Rewind(0).ok());
    REQUIRE(A.Eval(absl::MakeConstSpan(seq_tokens[s]).subspan(0, prompt), nullptr, nullptr).ok());
    for (size_t i = 0; i < n_steps; ++i) {
      std::vector<float> want;
      REQUIRE(A.Eval(absl::MakeConstSpan(&seq_tokens[s][prompt + i], 1), &want, nullptr).ok());
      const double e = RelRms(step_logits[s][i], want);
      worst = std::max(worst, e);
    }
  }
  return worst;
}

// Four sequences (buckets 1, 2, 4). A batched row differs from the single
// step only in the order of its float sums (the int8 mma kernel or the
// token tile against the decode geometry's k-split, the attention split
// count), ~1e-7 relative. But those sums are then rounded to int8
// activation blocks, and a value on a rounding edge moves one quantum
// (1/127 of its block's max); with a 512-wide model one such flip moves the
// logits by ~1e-3. Measured on the H200 (2026-12-03, token tile): 5.7e-3
// worst, 1.8e-7 with one matvec launch per matrix (whose k order the token
// tile happens to share on these shapes). The gate is the oracle limit of a
// Q4_K_M file.
TEST_CASE("batched steps of four sequences follow the single-sequence step") {
  const std::string path = MakeDpl("small-qwen2");
  const double worst = WorstBatchedVsSingle(path, 4,
                                            {{{0, 1, 2, 3}, 3},  // bucket 4
                                             {{0, 2, 3}, 3},     // bucket 4, one padding row
                                             {{3, 1}, 2},        // bucket 2, out of order
                                             {{2}, 2}});         // bucket 1
  std::printf("batched steps (buckets 1-4) vs the single-sequence step: worst relative RMS "
              "of a row's logits %.2e\n",
              worst);
  CHECK(worst < 0.04);
}

// Twelve sequences through every bucket (1 to 12 rows), same gate.
TEST_CASE("batched steps of twelve sequences, every bucket, follow the single-sequence step") {
  const std::string path = MakeDpl("small-qwen2");
  const double worst =
      WorstBatchedVsSingle(path, 12,
                           {{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 3},  // bucket 12
                            {{0, 2, 4, 6, 8, 10, 11}, 3},                 // bucket 8, one padding row
                            {{1, 5, 9}, 3},                               // bucket 4
                            {{11, 3}, 2},                                 // bucket 2
                            {{7}, 2}});                                   // bucket 1
  std::printf("batched steps (buckets 1-12) vs the single-sequence step: worst relative RMS of a "
              "row's logits %.2e\n",
              worst);
  CHECK(worst < 0.04);
}

// A decoder of small-llama with n_seq sequences of n_ctx positions.
std::unique_ptr<CudaDecoder> SmallLlamaDecoder(int64_t n_ctx, int n_seq) {
  CudaDecoderOptions o;
  o.n_ctx = n_ctx;
  o.n_seq = n_seq;
  auto d = CudaDecoder::Create(MakeDpl("small-llama"), o);
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  return std::move(*d);
}

// Rows of one step with the same prompt (and so the same tokens) give the
// same bits, whichever rows and regions they sit in.
TEST_CASE("equal sequences in one batched step give bit-identical rows") {
  const std::unique_ptr<CudaDecoder> d = SmallLlamaDecoder(64, 4);
  CudaDecoder& D = *d;
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> same = {5, 6, 7, 8, 9}, other = {40, 41};
  for (int s = 0; s < 4; ++s) {
    const std::vector<int32_t>& p = s == 1 || s == 3 ? same : other;
    REQUIRE(D.EvalSeq(s, p, nullptr, nullptr).ok());
    REQUIRE(D.BeginSampling(s, greedy, p).ok());
  }
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> next(4);
    REQUIRE(D.StepSeqs({3, 0, 1, 2}, absl::MakeSpan(next)).ok());
    std::vector<float> r0, r2;
    REQUIRE(D.StepLogits(0, &r0).ok());  // sequence 3
    REQUIRE(D.StepLogits(2, &r2).ok());  // sequence 1
    CHECK(std::memcmp(r0.data(), r2.data(), r0.size() * 4) == 0);
    CHECK(next[0] == next[2]);
    CHECK(next[1] == next[3]);
  }
}

TEST_CASE("batched steps refuse bad sequence sets") {
  const std::unique_ptr<CudaDecoder> d = SmallLlamaDecoder(8, 3);
  CudaDecoder& D = *d;
  CHECK(D.step_buckets() == std::vector<int>{1, 2, 3});
  const std::vector<int32_t> prompt = {1, 2, 3};
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  for (int s : {0, 1}) {
    REQUIRE(D.EvalSeq(s, prompt, nullptr, nullptr).ok());
    REQUIRE(D.BeginSampling(s, greedy, prompt).ok());
  }
  std::vector<int32_t> next(4);
  CHECK(!D.StepSeqs({}, absl::MakeSpan(next).subspan(0, 0)).ok());
  CHECK(!D.StepSeqs({0, 0}, absl::MakeSpan(next).subspan(0, 2)).ok());     // twice
  CHECK(!D.StepSeqs({0, 3}, absl::MakeSpan(next).subspan(0, 2)).ok());     // out of range
  CHECK(!D.StepSeqs({0, 2}, absl::MakeSpan(next).subspan(0, 2)).ok());     // 2 never started
  CHECK(!D.StepSeqs({0, 1, 2, 0}, absl::MakeSpan(next)).ok());             // more than n_seq
  CHECK(!D.StepSeqs({0, 1}, absl::MakeSpan(next).subspan(0, 1)).ok());     // outputs
  CHECK(!D.EvalSeq(3, prompt, nullptr, nullptr).ok());
  // Sequence 1 fills its context (8 positions: 3 + 5 steps) while 0 stays.
  for (int i = 0; i < 5; ++i) REQUIRE(D.StepSeqs({1}, absl::MakeSpan(next).subspan(0, 1)).ok());
  CHECK(!D.StepSeqs({0, 1}, absl::MakeSpan(next).subspan(0, 2)).ok());
  CHECK(D.n_past(0) == 3);
  REQUIRE(D.StepSeqs({0}, absl::MakeSpan(next).subspan(0, 1)).ok());
  CHECK(D.n_past(0) == 4);
  // Rewinding drops the pending token: a step needs BeginSampling again.
  REQUIRE(D.RewindSeq(1, 3).ok());
  CHECK(!D.StepSeqs({1}, absl::MakeSpan(next).subspan(0, 1)).ok());
}

}  // namespace
}  // namespace dpl::runtime

namespace dpl::runtime {
namespace {

// Paged KV (issue 30) against regions: the same calls on two decoders, one
// with a region of 256 positions per sequence, one with a pool of 80 blocks
// of 16 that the test hands out in a shuffled order (as the scheduler's
// pool would after some traffic), give the same bits: only where the rows
// sit changes. Covered: a prompt on cuBLAS (100 tokens), on the int8
// tensor cores (37) and a one-token pass (the folded RoPE), a packed pass,
// batched steps, a mixed pass, a copied start whose partial block is
// copied by SetBlockTable, and a kept start whose shared partial block is
// replaced (copy on write) while another sequence still reads it.
TEST_CASE("a paged KV cache gives the bits of regions") {
  const std::string path = MakeDpl("small-qwen2");
  CudaDecoderOptions o;
  o.n_ctx = 256;
  o.n_seq = 4;
  o.max_batch = 128;
  auto made_r = CudaDecoder::Create(path, o);
  REQUIRE_MESSAGE(made_r.ok(), made_r.status().ToString());
  o.kv_block = 16;
  o.kv_pool_blocks = 80;
  auto made_p = CudaDecoder::Create(path, o);
  REQUIRE_MESSAGE(made_p.ok(), made_p.status().ToString());
  CudaDecoder &R = **made_r, &P = **made_p;
  REQUIRE(P.paged());
  REQUIRE(!R.paged());
  CHECK(P.n_ctx() == 256);
  const int V = R.n_vocab();
  // The pool's blocks in a fixed shuffled order, taken from the back.
  std::vector<int> free(80);
  for (int i = 0; i < 80; ++i) free[static_cast<size_t>(i)] = (i * 37 + 11) % 80;
  std::vector<std::vector<int>> tables(4);
  auto reach = [&](int seq, int64_t positions) {
    std::vector<int>& t = tables[static_cast<size_t>(seq)];
    while (static_cast<int64_t>(t.size()) * 16 < positions) {
      REQUIRE(!free.empty());
      t.push_back(free.back());
      free.pop_back();
    }
    const absl::Status st = P.SetBlockTable(seq, t);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  };
  auto toks = [&](int n, int salt) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 7919 + 13 + 977 * salt) % V;
    return t;
  };
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  // One prompt chunk of a sequence on both; its last logits bitwise equal.
  auto eval = [&](int seq, const std::vector<int32_t>& t) {
    reach(seq, P.n_past(seq) + static_cast<int64_t>(t.size()));
    std::vector<float> lr, lp;
    REQUIRE(R.EvalSeq(seq, t, &lr, nullptr).ok());
    const absl::Status st = P.EvalSeq(seq, t, &lp, nullptr);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    CAPTURE(seq);
    CHECK(same(lr, lp));
  };
  // Batched steps of `seqs` on both: the same tokens, the same logits.
  auto step = [&](const std::vector<int>& seqs, int n) {
    for (int i = 0; i < n; ++i) {
      for (int s : seqs) reach(s, P.n_past(s) + 1);
      std::vector<int32_t> nr(seqs.size()), np(seqs.size());
      REQUIRE(R.StepSeqs(seqs, absl::MakeSpan(nr)).ok());
      const absl::Status st = P.StepSeqs(seqs, absl::MakeSpan(np));
      REQUIRE_MESSAGE(st.ok(), st.ToString());
      CHECK(nr == np);
      for (size_t r = 0; r < seqs.size(); ++r) {
        std::vector<float> a, b;
        REQUIRE(R.StepLogits(static_cast<int>(r), &a).ok());
        REQUIRE(P.StepLogits(static_cast<int>(r), &b).ok());
        CAPTURE(r);
        CHECK(same(a, b));
      }
    }
  };
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  auto begin = [&](int seq) {
    auto a = R.BeginSampling(seq, greedy, {});
    auto b = P.BeginSampling(seq, greedy, {});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*a == *b);
  };

  eval(0, toks(100, 0));  // cuBLAS rows
  eval(1, toks(37, 1));   // int8 tensor cores
  eval(2, toks(1, 2));    // one token: bucket 1's graph, RoPE folded where the model allows
  eval(2, toks(20, 3));
  {  // a packed pass of two sequences
    const std::vector<int32_t> a = toks(5, 4), b = toks(40, 5);
    reach(0, P.n_past(0) + 5);
    reach(1, P.n_past(1) + 40);
    const std::vector<CudaDecoder::SeqChunk> chunks = {{0, a}, {1, b}};
    std::vector<float> lr, lp;
    REQUIRE(R.EvalSeqs(chunks, &lr).ok());
    const absl::Status st = P.EvalSeqs(chunks, &lp);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    CHECK(same(lr, lp));
  }
  for (int s = 0; s < 3; ++s) begin(s);
  step({0, 1, 2}, 5);
  step({2, 0}, 2);  // out of order, bucket 2

  // A copied start: sequence 3 starts with sequence 1's first 50 positions
  // (3 full blocks shared, rows 48..49 copied into a block of its own).
  REQUIRE(R.CopySeqPrefix(3, 1, 50).ok());
  REQUIRE(P.CopySeqPrefix(3, 1, 50).ok());
  CHECK(!P.EvalSeq(3, toks(2, 6), nullptr, nullptr).ok());  // its table is not set yet
  tables[3].assign(tables[1].begin(), tables[1].begin() + 3);
  eval(3, toks(30, 6));
  begin(3);
  {  // a mixed pass: decode rows of 0 and 3, a prompt chunk of 2
    const std::vector<int32_t> c = toks(8, 7);
    const std::vector<int> seqs = {0, 3};
    reach(0, P.n_past(0) + 1);
    reach(3, P.n_past(3) + 1);
    reach(2, P.n_past(2) + 8);
    const std::vector<CudaDecoder::SeqChunk> chunks = {{2, c}};
    std::vector<int32_t> nr(2), np(2);
    std::vector<float> lr, lp;
    REQUIRE(R.StepWithChunks(seqs, absl::MakeSpan(nr), chunks, &lr).ok());
    const absl::Status st = P.StepWithChunks(seqs, absl::MakeSpan(np), chunks, &lp);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    CHECK(nr == np);
    CHECK(same(lr, lp));
  }
  begin(2);
  step({0, 1, 2, 3}, 4);

  // A kept start with a shared partial block: sequence 1 keeps 40
  // positions; its block 2 (positions 32..47) is also sequence 3's, so it
  // writes on into a copy (rows 32..39 copied), and sequence 3 still reads
  // the original.
  REQUIRE(R.RewindSeq(1, 40).ok());
  REQUIRE(P.RewindSeq(1, 40).ok());
  tables[1].resize(3);
  tables[1][2] = free.back();
  free.pop_back();
  eval(1, toks(12, 8));
  begin(1);
  step({3, 1}, 3);
  eval(3, toks(4, 9));

  // Refusals: a pass past the table, a bad table, a region cache's table.
  const std::vector<int32_t> long_chunk = toks(40, 10);
  const absl::Status past = P.EvalSeq(0, long_chunk, nullptr, nullptr);
  CHECK(past.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(!P.SetBlockTable(0, std::vector<int>{80}).ok());
  CHECK(!P.SetBlockTable(0, std::vector<int>{}).ok());  // too short for its rows
  CHECK(!R.SetBlockTable(0, std::vector<int>{1}).ok());
}

}  // namespace
}  // namespace dpl::runtime

// ---------------------------------------------------------------------------
// Mixture of experts (qwen3moe; kernels/matvec/moe.h) on the GPU: the
// llama.cpp oracle, dpl-synth models of every expert type, graph == eager,
// batched rows, packed and mixed passes, and the refusal of expert types
// without a kernel.
namespace dpl::runtime {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string OracleFile(const std::string& name) { return testing::SharedDir() + "/oracle/" + name; }

std::vector<int32_t> OracleTokens(const std::string& name) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(ReadFile(OracleFile(name + ".tokens")), ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    REQUIRE_MESSAGE(absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id), "bad token ", part);
    ids.push_back(id);
  }
  REQUIRE(!ids.empty());
  return ids;
}

// llama.cpp's logits, one row a position.
std::vector<std::vector<double>> OracleLogits(const std::string& name, int n_vocab) {
  const std::string bytes = ReadFile(OracleFile(name + ".logits.f32"));
  REQUIRE(bytes.size() % (4 * static_cast<size_t>(n_vocab)) == 0);
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), bytes.size());
  std::vector<std::vector<double>> rows;
  for (size_t at = 0; at < f.size(); at += n_vocab) rows.emplace_back(f.begin() + at, f.begin() + at + n_vocab);
  return rows;
}

// The CPU reference's logits at every position of `tokens` and, per
// position, its smallest router margin over the layers (the gap between the
// k-th and the (k+1)-th expert probability: ReferenceModel::router_margins).
struct RefRun {
  std::vector<std::vector<double>> logits;
  std::vector<double> margin;
};
RefRun RunReference(const std::string& path, const std::vector<int32_t>& tokens) {
  const std::unique_ptr<reference::ReferenceModel> ref = LoadReference(path, 1024);
  RefRun r;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto row = ref->ForwardF64(tokens[i], static_cast<int64_t>(i));
    REQUIRE_MESSAGE(row.ok(), row.status().ToString());
    r.logits.push_back(*row);
    const std::vector<double>& m = ref->router_margins();
    REQUIRE(!m.empty());
    r.margin.push_back(*std::min_element(m.begin(), m.end()));
  }
  return r;
}

// A router margin below this is a near-tie: float rounding on the GPU (its
// f32 router over its own activations) may pick the other expert there,
// which moves that position's logits by tens of percent (one expert of two
// replaced).
constexpr double kNearTie = 0.02;

// Compares `got` with `want` at every position: each within `per_pos`, and
// the RMS over all positions within `rms`. A position over `per_pos` whose
// router margin (the CPU reference's) is a near-tie is reported and excused
// from the per-position bound, but only a few may be (at most 1 in 10) and
// they stay in the RMS.
void CheckPositions(const std::string& what, const std::vector<std::vector<float>>& got,
                    const std::vector<std::vector<double>>& want, const std::vector<double>& margin,
                    double per_pos, double rms) {
  REQUIRE(got.size() == want.size());
  REQUIRE(margin.size() == want.size());
  double d2 = 0, r2 = 0, worst = 0;
  int excused = 0, near = 0;
  for (size_t p = 0; p < got.size(); ++p) {
    REQUIRE(got[p].size() == want[p].size());
    double pd = 0, pr = 0;
    for (size_t i = 0; i < want[p].size(); ++i) {
      const double d = got[p][i] - want[p][i];
      pd += std::isfinite(got[p][i]) ? d * d : INFINITY;
      pr += want[p][i] * want[p][i];
    }
    d2 += pd;
    r2 += pr;
    const double e = std::sqrt(pd / pr);
    near += margin[p] < kNearTie;
    if (e >= per_pos && margin[p] < kNearTie) {
      ++excused;
      std::printf("%s: position %zu: %.2f%% off, router near-tie (margin %.4f): excused\n", what.c_str(), p,
                  100 * e, margin[p]);
      continue;
    }
    worst = std::max(worst, e);
    CAPTURE(p);
    CAPTURE(margin[p]);
    CHECK_MESSAGE(e < per_pos, what << ": position " << p << " " << 100 * e << "% off");
  }
  const double total = std::sqrt(d2 / r2);
  std::printf("%s: RMS %.3f%% over %zu positions, worst %.3f%% (limits %.1f%%, %.1f%%); %d near-tie "
              "positions, %d excused\n",
              what.c_str(), 100 * total, got.size(), 100 * worst, 100 * rms, 100 * per_pos, near, excused);
  CHECK(excused * 10 <= static_cast<int>(got.size()));
  CHECK(total < rms);
}

// The GPU's logits at every position of `tokens` from one prompt pass
// (GpuStepsRouted, below, takes them one token a step).
std::vector<std::vector<float>> GpuPrompt(CudaDecoder& d, const std::vector<int32_t>& tokens) {
  REQUIRE(d.Rewind(0).ok());
  std::vector<float> last, all;
  const absl::Status s = d.Eval(tokens, &last, &all);
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  const size_t V = d.n_vocab();
  REQUIRE(all.size() == tokens.size() * V);
  std::vector<std::vector<float>> rows;
  for (size_t p = 0; p < tokens.size(); ++p) rows.emplace_back(all.begin() + p * V, all.begin() + (p + 1) * V);
  return rows;
}

std::unique_ptr<CudaDecoder> MustCreate(const std::string& path, const CudaDecoderOptions& o) {
  auto d = CudaDecoder::Create(path, o);
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  return std::move(*d);
}

// One sequence of 512 positions of a MoE model (the unverified path opted
// into), its expert choices recorded.
std::unique_ptr<CudaDecoder> MoeDecoder(const std::string& path) {
  CudaDecoderOptions o;
  o.record_routes = true;
  o.n_ctx = 512;
  return MustCreate(path, o);
}

// A GPU run's logits and, per position, the experts each layer chose
// ((n_layer, k) ids, layer-major): one token a step (the captured graph),
// or one prompt pass.
struct RoutedRun {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> routes;
};
RoutedRun GpuStepsRouted(CudaDecoder& d, const std::vector<int32_t>& tokens) {
  REQUIRE(d.Rewind(0).ok());
  RoutedRun r;
  for (int32_t t : tokens) {
    std::vector<float> a;
    const int32_t one[1] = {t};
    REQUIRE(d.Eval(one, &a, nullptr).ok());
    r.logits.push_back(std::move(a));
    absl::StatusOr<std::vector<int32_t>> ids = d.RecordedRoutes(1);
    REQUIRE_MESSAGE(ids.ok(), ids.status().ToString());
    r.routes.push_back(std::move(*ids));
  }
  return r;
}
// Row p's expert choices ((n_layer, k) ids, layer-major) from a pass's
// RecordedRoutes(n): each layer's n rows of k ids.
std::vector<int32_t> RoutesOfRow(const CudaDecoder& d, const std::vector<int32_t>& ids, int n, int p) {
  const int n_layer = static_cast<int>(d.hparams().n_layer), k = static_cast<int>(d.hparams().n_expert_used);
  std::vector<int32_t> at;
  for (int l = 0; l < n_layer; ++l) {
    at.insert(at.end(), ids.begin() + (static_cast<int64_t>(l) * n + p) * k,
              ids.begin() + (static_cast<int64_t>(l) * n + p + 1) * k);
  }
  return at;
}
RoutedRun GpuPromptRouted(CudaDecoder& d, const std::vector<int32_t>& tokens) {
  RoutedRun r;
  r.logits = GpuPrompt(d, tokens);  // one pass (tokens <= max_batch)
  const int n = static_cast<int>(tokens.size());
  absl::StatusOr<std::vector<int32_t>> ids = d.RecordedRoutes(n);
  REQUIRE_MESSAGE(ids.ok(), ids.status().ToString());
  for (int p = 0; p < n; ++p) r.routes.push_back(RoutesOfRow(d, *ids, n, p));
  return r;
}

// The GPU against the CPU reference made to take the GPU's own expert
// choices (ReferenceModel::ForceExperts), position after position: every
// position within per_pos and the RMS within rms, none excused, since a
// near-tie the GPU resolved the other way now runs the same experts on
// both. And every GPU choice the reference's own top-k would not have made
// must be a near-tie of the reference's (margin < kNearTie): a wrong route
// (a bug, not rounding) differs where the reference's choice is clear.
// Positions before `from` are run on the GPU's routes but not compared
// (gpu.logits holds the compared positions' rows only: tokens.size() - from).
void CheckAgainstForcedReference(const std::string& what, const std::string& path,
                                 const std::vector<int32_t>& tokens, const RoutedRun& gpu, double per_pos,
                                 double rms, size_t from = 0) {
  REQUIRE(gpu.routes.size() == tokens.size());
  REQUIRE(from <= tokens.size());
  REQUIRE(gpu.logits.size() == tokens.size() - from);
  const std::unique_ptr<reference::ReferenceModel> ref = LoadReference(path, 1024);
  const int n_layer = static_cast<int>(ref->hparams().n_layer), k = static_cast<int>(ref->hparams().n_expert_used);
  std::vector<std::vector<double>> want;
  int differ = 0;
  double widest = 0;
  for (size_t p = 0; p < tokens.size(); ++p) {
    REQUIRE(gpu.routes[p].size() == static_cast<size_t>(n_layer * k));
    std::vector<std::vector<int>> forced(static_cast<size_t>(n_layer));
    for (int l = 0; l < n_layer; ++l) {
      forced[l].assign(gpu.routes[p].begin() + l * k, gpu.routes[p].begin() + (l + 1) * k);
    }
    ref->ForceExperts(forced);
    absl::StatusOr<std::vector<double>> row = ref->ForwardF64(tokens[p], static_cast<int64_t>(p));
    REQUIRE_MESSAGE(row.ok(), row.status().ToString());
    if (p >= from) want.push_back(std::move(*row));
    REQUIRE(ref->own_experts().size() == static_cast<size_t>(n_layer));  // every layer a MoE one (qwen3moe)
    for (int l = 0; l < n_layer; ++l) {
      std::vector<int> own = ref->own_experts()[l], gpu_ids = forced[l];
      std::sort(own.begin(), own.end());
      std::sort(gpu_ids.begin(), gpu_ids.end());
      if (own == gpu_ids) continue;
      ++differ;
      widest = std::max(widest, ref->router_margins()[l]);
      CAPTURE(p);
      CAPTURE(l);
      CHECK_MESSAGE(ref->router_margins()[l] < kNearTie,
                    what << ": the GPU chose other experts where the reference's margin is "
                         << ref->router_margins()[l]);
    }
  }
  std::printf("%s: the GPU chose other experts than the reference's own at %d (position, layer) pairs, "
              "the widest margin among them %.4f\n",
              what.c_str(), differ, widest);
  const std::vector<double> none_excused(tokens.size() - from, INFINITY);
  CheckPositions(what + " vs the reference on the GPU's routes", gpu.logits, want, none_excused, per_pos, rms);
}

// Batched steps of a MoE model against the CPU reference made to take the
// batched rows' own expert choices (CheckAgainstForcedReference, from each
// sequence's first step; its prompt, one pass, on that pass's recorded
// routes). Why not against the single-sequence step, as for the dense
// models: a batched row's activations round otherwise than the one-token
// kernel's (int8 blocks of other sums, or f16 where the f16 form runs), and
// at a router's near-tie that moves an expert choice and the row's logits by
// tens of percent (0.179 relative RMS at 12 sequences with q8_0 K/V on the
// f16 form, docs/PERF.md). On its own routes a batched row must follow the
// reference everywhere, and a route that is not the reference's own choice
// must be a near-tie of the reference's.
void CheckBatchedAgainstForcedReference(const std::string& what, const std::string& path, int n_seq,
                                        const Schedule& schedule) {
  CudaDecoderOptions o;
  o.n_ctx = 128;
  o.n_seq = n_seq;
  o.record_routes = true;
  const std::unique_ptr<CudaDecoder> b = MustCreate(path, o);
  CudaDecoder& B = *b;
  std::vector<std::vector<int32_t>> seq_tokens(n_seq);  // prompt, then every sampled token
  std::vector<size_t> prompt_len(n_seq);
  std::vector<RoutedRun> runs(n_seq);  // routes from position 0, logits from the first step on
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> pool = Tokens(64, B.n_vocab());
  for (int s = 0; s < n_seq; ++s) {
    seq_tokens[s].assign(pool.begin() + s, pool.begin() + s + 3 + s % 12);  // 3..14 tokens
    const int n = static_cast<int>(seq_tokens[s].size());
    prompt_len[s] = seq_tokens[s].size();
    REQUIRE(B.EvalSeq(s, seq_tokens[s], nullptr, nullptr).ok());
    absl::StatusOr<std::vector<int32_t>> ids = B.RecordedRoutes(n);
    REQUIRE_MESSAGE(ids.ok(), ids.status().ToString());
    for (int p = 0; p < n; ++p) runs[s].routes.push_back(RoutesOfRow(B, *ids, n, p));
    auto first = B.BeginSampling(s, greedy, seq_tokens[s]);
    REQUIRE(first.ok());
    seq_tokens[s].push_back(*first);
  }
  for (const auto& [seqs, steps] : schedule) {
    for (int i = 0; i < steps; ++i) {
      std::vector<int32_t> next(seqs.size());
      const absl::Status st = B.StepSeqs(seqs, absl::MakeSpan(next));
      REQUIRE_MESSAGE(st.ok(), st.ToString());
      const int rows = static_cast<int>(seqs.size());
      absl::StatusOr<std::vector<int32_t>> ids = B.RecordedRoutes(rows);
      REQUIRE_MESSAGE(ids.ok(), ids.status().ToString());
      for (int r = 0; r < rows; ++r) {
        std::vector<float> row;
        REQUIRE(B.StepLogits(r, &row).ok());
        CHECK(next[r] == std::max_element(row.begin(), row.end()) - row.begin());
        RoutedRun& run = runs[seqs[r]];
        run.logits.push_back(std::move(row));
        run.routes.push_back(RoutesOfRow(B, *ids, rows, r));
        seq_tokens[seqs[r]].push_back(next[r]);
      }
    }
  }
  for (int s = 0; s < n_seq; ++s) {
    // The fed tokens: all but the last sampled one, each at its position.
    const std::vector<int32_t> fed(seq_tokens[s].begin(), seq_tokens[s].end() - 1);
    CheckAgainstForcedReference(absl::StrCat(what, ", sequence ", s), path, fed, runs[s], 0.04, 0.03,
                                prompt_len[s]);
  }
}

std::string MoeOracleDpl() {
  const std::string dpl = testing::TempDir() + "/mini-qwen3moe-q4km.dpl";
  const absl::StatusOr<converter::ConvertStats> s =
      converter::ConvertGgufToDpl(OracleFile("mini-qwen3moe-q4km.gguf"), dpl, {});
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  return dpl;
}

// The bar: within 3% of llama.cpp's logits (RMS over the 48
// positions); at every position within the oracle README's 4% for a Q4_K_M
// file (llama.cpp's own int8 activations alone put exact math ~1.5% away).
// And against the CPU reference on the GPU's own expert choices, no
// position excused.
TEST_CASE("the qwen3moe oracle on the GPU follows llama.cpp and the CPU reference at every position") {
  const std::string name = "mini-qwen3moe-q4km";
  const std::string path = MoeOracleDpl();
  const std::vector<int32_t> tokens = OracleTokens(name);
  std::unique_ptr<CudaDecoder> d = MoeDecoder(path);
  CHECK(d->uses_graph());
  const std::vector<std::vector<double>> llama = OracleLogits(name, d->n_vocab());
  REQUIRE(llama.size() == tokens.size());
  const RefRun ref = RunReference(path, tokens);
  const RoutedRun steps = GpuStepsRouted(*d, tokens);
  // 48 rows: dense products on cuBLAS (DecodeTuning::moe_prompt_mma_max_rows).
  const RoutedRun prompt = GpuPromptRouted(*d, tokens);
  CheckPositions("oracle, GPU steps vs llama.cpp", steps.logits, llama, ref.margin, 0.04, 0.03);
  CheckPositions("oracle, GPU prompt vs llama.cpp", prompt.logits, llama, ref.margin, 0.04, 0.03);
  CheckAgainstForcedReference("oracle, GPU steps", path, tokens, steps, 0.04, 0.03);
  CheckAgainstForcedReference("oracle, GPU prompt", path, tokens, prompt, 0.04, 0.03);
}

// Every expert type the converter emits for the presets: q4_K and q5_K
// (raw), q6_K and q8_0 (dpl, and raw), with 512-column gate/up and
// 256-column (one-block) down experts. Steps (the graph) and a 100-token
// prompt (its attention products on tensor cores, its experts per route).
TEST_CASE("dpl-synth mini-qwen3moe of every expert type follows the CPU reference, steps and prompts") {
  using synth::Ftype;
  using converter::LayoutPolicy;
  const std::pair<Ftype, LayoutPolicy> cases[] = {
      {Ftype::kQ4_K_M, LayoutPolicy::kAuto}, {Ftype::kQ5_K_M, LayoutPolicy::kAuto},
      {Ftype::kQ6_K, LayoutPolicy::kAuto},   {Ftype::kQ6_K, LayoutPolicy::kRaw},
      {Ftype::kQ8_0, LayoutPolicy::kAuto},   {Ftype::kQ8_0, LayoutPolicy::kRaw},
  };
  for (const auto& [f, l] : cases) {
    const std::string what = absl::StrCat("mini-qwen3moe ", std::string(synth::FtypeName(f)), " layout ", static_cast<int>(l));
    CAPTURE(what);
    const std::string path = MakeDpl("mini-qwen3moe", f, l);
    std::unique_ptr<CudaDecoder> d = MoeDecoder(path);
    const std::vector<int32_t> tokens = Tokens(100, d->n_vocab());
    const std::vector<int32_t> first(tokens.begin(), tokens.begin() + 24);
    CheckAgainstForcedReference(what + ", steps", path, first, GpuStepsRouted(*d, first), 0.04, 0.03);
    CheckAgainstForcedReference(what + ", prompt", path, tokens,
                                GpuPromptRouted(*d, tokens), 0.04, 0.03);
  }
}

// A prompt longer than the MoE slice (CudaDecoder::kMoeRows = 256 rows): the
// feed-forward runs in two slices; every position against the reference.
TEST_CASE("a MoE prompt of more rows than one slice follows the CPU reference") {
  const std::string path = MakeDpl("mini-qwen3moe");
  std::unique_ptr<CudaDecoder> d = MoeDecoder(path);
  const std::vector<int32_t> tokens = Tokens(300, d->n_vocab());
  CheckAgainstForcedReference("mini-qwen3moe, 300-token prompt", path, tokens,
                              GpuPromptRouted(*d, tokens), 0.04, 0.03);
}

TEST_CASE("MoE: graph replay and eager steps give identical bits, and so do two prompt passes") {
  const std::string path = MoeOracleDpl();
  CudaDecoderOptions g, e;
  e.eager = true;
  std::unique_ptr<CudaDecoder> graph = MustCreate(path, g), eager = MustCreate(path, e);
  CHECK(graph->uses_graph());
  CHECK(!eager->uses_graph());
  for (int32_t t : Tokens(16, graph->n_vocab())) {
    std::vector<float> a, b;
    const int32_t one[1] = {t};
    REQUIRE(graph->Eval(one, &a, nullptr).ok());
    REQUIRE(eager->Eval(one, &b, nullptr).ok());
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  }
  const std::vector<int32_t> prompt = Tokens(90, graph->n_vocab());
  const std::vector<std::vector<float>> p1 = GpuPrompt(*graph, prompt), p2 = GpuPrompt(*eager, prompt);
  CHECK(p1 == p2);
}

// Rows of a step routed to different experts (and sharing some), every
// bucket; the gate of the dense models' batched tests.
// Four sequences against the single-sequence step (no near-tie met there);
// twelve, whose rows reach the f16 forms, against the reference on their
// own routes (CheckBatchedAgainstForcedReference says why).
TEST_CASE("MoE: batched steps follow the single-sequence step and the reference on their routes") {
  const std::string path = MakeDpl("mini-qwen3moe");
  const double worst4 = WorstBatchedVsSingle(path, 4,
                                             {{{0, 1, 2, 3}, 3}, {{0, 2, 3}, 3}, {{3, 1}, 2}, {{2}, 2}});
  std::printf("MoE batched steps vs the single-sequence step: worst relative RMS %.2e (4 sequences)\n", worst4);
  CHECK(worst4 < 0.04);
  CheckBatchedAgainstForcedReference(
      "MoE batched steps of 12 sequences", path, 12,
      {{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 3}, {{0, 2, 4, 6, 8, 10, 11}, 3}, {{1, 5, 9}, 3}});
}

// A packed prompt pass (EvalSeqs) and a mixed pass (StepWithChunks) of a
// MoE model against each sequence run alone on a twin decoder.
TEST_CASE("MoE: packed and mixed passes follow each sequence alone") {
  const std::string path = MakeDpl("mini-qwen3moe");
  CudaDecoderOptions o;
  o.n_ctx = 256;
  o.n_seq = 3;
  o.max_batch = 128;
  std::unique_ptr<CudaDecoder> made_a = MustCreate(path, o), made_b = MustCreate(path, o);
  CudaDecoder &a = *made_a, &b = *made_b;
  const int V = a.n_vocab();
  std::vector<std::vector<int32_t>> toks(3);
  const int len[3] = {20, 37, 5};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < len[s]; ++i) toks[s].push_back((i * 7919 + 29 + 977 * s) % V);
  }
  // Packed: all three chunks in one pass on a; one at a time on b.
  const std::vector<CudaDecoder::SeqChunk> chunks = {{0, toks[0]}, {1, toks[1]}, {2, toks[2]}};
  generate::SamplerParams greedy;
  greedy.temperature = 0;
  std::vector<float> packed;
  REQUIRE(a.EvalSeqs(chunks, &packed).ok());
  REQUIRE(packed.size() == 3 * static_cast<size_t>(V));
  REQUIRE(a.BeginSampling(0, greedy, toks[0]).ok());
  for (int s = 0; s < 3; ++s) {
    std::vector<float> alone;
    REQUIRE(b.EvalSeq(s, toks[s], &alone, nullptr).ok());
    // Sequence 0 starts sampling from its own prompt's logits, before the
    // next pass replaces them.
    if (s == 0) REQUIRE(b.BeginSampling(0, greedy, toks[0]).ok());
    CAPTURE(s);
    CHECK(RelRms(std::vector<float>(packed.begin() + s * V, packed.begin() + (s + 1) * V), alone) < 0.04);
  }
  // Mixed: sequence 0's decode row with chunks of 1 and 2 on a; a step and
  // a packed pass on b.
  const std::vector<int32_t> more1 = {11, 12, 13}, more2 = {21, 22};
  const std::vector<CudaDecoder::SeqChunk> next_chunks = {{1, more1}, {2, more2}};
  const auto [last_a, last_b] = MixedPassAgainstTwo(a, b, next_chunks);
  CHECK(RelRms(last_a, last_b) < 0.04);
}

// Expert tensors of a type without an expert kernel (q4_0 has a dense one)
// are refused at load, naming the tensor and the types that run.
TEST_CASE("a MoE model whose experts have no expert kernel is refused at load") {
  const std::string path = MakeDpl("mini-qwen3moe", synth::Ftype::kQ4_0);
  auto d = CudaDecoder::Create(path, {});
  REQUIRE(!d.ok());
  CHECK(d.status().code() == absl::StatusCode::kUnimplemented);
  const std::string msg(d.status().message());
  CHECK_MESSAGE(msg.find("_exps.weight' is q4_0, which the CUDA runtime has no expert kernel for") != std::string::npos,
                msg);
}

}  // namespace
}  // namespace dpl::runtime
