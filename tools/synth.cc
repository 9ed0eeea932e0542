#include "tools/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/dequant.h"
#include "formats/output_file.h"
#include "formats/parallel_for.h"

namespace dpl::synth {

using formats::GgmlType;
using formats::MetaValue;

// ------------------------------------------------------------ ftypes ----

namespace {

struct FtypeInfo {
  Ftype ftype;
  const char* name;  // llama-quantize's name, lower case
  GgmlType base;     // llama_ftype_get_default_type
};
constexpr FtypeInfo kFtypes[] = {
    {Ftype::kQ4_K_M, "q4_k_m", GgmlType::kQ4_K},  {Ftype::kQ5_K_M, "q5_k_m", GgmlType::kQ5_K},
    {Ftype::kQ6_K, "q6_k", GgmlType::kQ6_K},      {Ftype::kQ8_0, "q8_0", GgmlType::kQ8_0},
    {Ftype::kQ4_0, "q4_0", GgmlType::kQ4_0},      {Ftype::kQ4_1, "q4_1", GgmlType::kQ4_1},
    {Ftype::kQ5_0, "q5_0", GgmlType::kQ5_0},      {Ftype::kQ5_1, "q5_1", GgmlType::kQ5_1},
    {Ftype::kIQ4_NL, "iq4_nl", GgmlType::kIQ4_NL}, {Ftype::kIQ4_XS, "iq4_xs", GgmlType::kIQ4_XS},
    {Ftype::kQ3_K_M, "q3_k_m", GgmlType::kQ3_K},  {Ftype::kQ2_K, "q2_k", GgmlType::kQ2_K},
    {Ftype::kBF16, "bf16", GgmlType::kBF16},      {Ftype::kF16, "f16", GgmlType::kF16},
    {Ftype::kF32, "f32", GgmlType::kF32},
};

const FtypeInfo& InfoOf(Ftype ftype) {
  for (const FtypeInfo& f : kFtypes) {
    if (f.ftype == ftype) return f;
  }
  return kFtypes[0];  // unreachable: every Ftype has a row
}

}  // namespace

const std::vector<Ftype>& Ftypes() {
  static const std::vector<Ftype>* ftypes = [] {
    auto* v = new std::vector<Ftype>;
    for (const FtypeInfo& f : kFtypes) v->push_back(f.ftype);
    return v;
  }();
  return *ftypes;
}

std::string KnownFtypeNames() {
  std::string names;
  for (const FtypeInfo& f : kFtypes) absl::StrAppend(&names, names.empty() ? "" : ", ", f.name);
  return names;
}

absl::StatusOr<Ftype> ParseFtype(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (const FtypeInfo& f : kFtypes) {
    if (lower == f.name) return f.ftype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown ftype '", std::string(name),
                                                 "' (known: ", KnownFtypeNames(), ")"));
}

std::string_view FtypeName(Ftype ftype) { return InfoOf(ftype).name; }

GgmlType FtypeBaseType(Ftype ftype) { return InfoOf(ftype).base; }

bool UseMoreBits(uint32_t layer, uint32_t n_layer) {
  const int64_t i = layer, n = n_layer;
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

namespace {

// llama.cpp's fallback for a row length that is not a whole number of the
// chosen type's blocks (tensor_type_fallback): a 32-weight type of about the
// same size, else f16. A 32-weight type that does not fit either is left for
// PlanTensors to refuse (llama.cpp gives up there too). q2_K and q3_K go to
// iq4_nl, as in llama.cpp's releases so far; its current master
// (tensor_type_fallback) sends them to q4_0 instead.
GgmlType FallbackType(GgmlType t, uint64_t row_len) {
  if (row_len % formats::TraitsOf(t).block_elems == 0) return t;
  GgmlType f;
  switch (t) {
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kIQ4_XS: f = GgmlType::kIQ4_NL; break;
    case GgmlType::kQ4_K: f = GgmlType::kQ5_0; break;
    case GgmlType::kQ5_K: f = GgmlType::kQ5_1; break;
    case GgmlType::kQ6_K: f = GgmlType::kQ8_0; break;
    default: return t;
  }
  return row_len % formats::TraitsOf(f).block_elems == 0 ? f : GgmlType::kF16;
}

}  // namespace

// The rules of llama_tensor_get_type (src/llama-quant.cpp) that decide the
// types of a dense llama/qwen2/qwen3 model in the ftypes above, with no
// imatrix, no --pure and no type overrides:
//   - the lm head (output.weight, or token_embd when tied): q8_0 for q8_0 or
//     when rows are not whole base-type blocks, otherwise q6_K;
//   - token_embd (untied), attn_q, attn_k, ffn_gate, ffn_up: the base type
//     (llama.cpp changes attn_q/attn_k only for IQ3_XS, IQ3_XXS, IQ2_S/M and
//     8-expert models, ffn_gate/ffn_up only for IQ3_XS);
//   - attn_v: q2_k -> q4_K if n_gqa >= 4 else q3_K; q3_k_m -> q5_K on layers
//     0-1, else q4_K; iq4_nl/iq4_xs -> q5_K if n_gqa >= 4; q4_k_m/q5_k_m ->
//     q6_K where use_more_bits;
//   - ffn_down: q2_k -> q3_K; q3_k_m -> q5_K below n_layer/16, else q4_K;
//     iq4_nl/iq4_xs -> q5_K below n_layer/8; q4_k_m/q5_k_m -> q6_K where
//     use_more_bits;
//   - attn_output: q2_k -> q3_K, q3_k_m -> q4_K;
//   - then FallbackType for rows that are not whole blocks.
// Mixture of experts: the router (ffn_gate_inp) stays f32 (llama.cpp never
// quantizes it); ffn_{gate,up}_exps take the base type and ffn_down_exps the
// ffn_down rule, by block index; in an 8-expert model attn_k and attn_v are
// q8_0 and attn_output q5_K (for q2_K, q3_K_M, q4_K_M, iq4_nl, iq4_xs):
// the types of the oracle mini-qwen3moe-q4km come out tensor for tensor.
// Not modelled (no preset has them): Falcon's rules, the 70B attn_v bump,
// fused attn_qkv. With these rules the tensor types of
// llama-quantize's own mini-llama files (shared/oracle) come out tensor for
// tensor, and the bytes per token of the 7B-14B presets match llama.cpp's
// files within 1% (synth_test: qwen2.5-7b with the qwen2 vocabulary gives
// 4.36 / 5.07 / 5.82 / 7.54 GiB for Q4_K_M / Q5_K_M / Q6_K / Q8_0, the sizes
// of llama.cpp's own files measured on the H200).
GgmlType MatrixType(Ftype ftype, model::TensorKind kind, uint32_t layer, uint64_t row_len,
                    const MixShape& shape) {
  using model::TensorKind;
  const GgmlType base = FtypeBaseType(ftype);
  // llama.cpp runs its rules only when the base type is quantized.
  if (base == GgmlType::kF32 || base == GgmlType::kF16 || base == GgmlType::kBF16) return base;
  const bool more_bits = UseMoreBits(layer, shape.n_layer);
  const bool k_medium = ftype == Ftype::kQ4_K_M || ftype == Ftype::kQ5_K_M;
  const bool iq4 = ftype == Ftype::kIQ4_NL || ftype == Ftype::kIQ4_XS;
  GgmlType t = base;
  const bool eight_experts = shape.n_expert == 8;
  if (kind == TensorKind::kFfnGateInp) return GgmlType::kF32;
  if (kind == TensorKind::kFfnDownExps) kind = TensorKind::kFfnDown;  // the same rule
  if (eight_experts && (kind == TensorKind::kAttnK || kind == TensorKind::kAttnV)) {
    return FallbackType(GgmlType::kQ8_0, row_len);
  }
  if (kind == TensorKind::kOutput || (shape.tied && kind == TensorKind::kTokenEmbd)) {
    const bool whole = row_len % formats::TraitsOf(base).block_elems == 0;
    t = (!whole || base == GgmlType::kQ8_0) ? GgmlType::kQ8_0 : GgmlType::kQ6_K;
  } else if (kind == TensorKind::kAttnV) {
    if (ftype == Ftype::kQ2_K) {
      t = shape.n_gqa >= 4 ? GgmlType::kQ4_K : GgmlType::kQ3_K;
    } else if (ftype == Ftype::kQ3_K_M) {
      t = layer < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
    } else if (iq4 && shape.n_gqa >= 4) {
      t = GgmlType::kQ5_K;
    } else if (k_medium && more_bits) {
      t = GgmlType::kQ6_K;
    }
  } else if (kind == TensorKind::kFfnDown) {
    if (ftype == Ftype::kQ2_K) {
      t = GgmlType::kQ3_K;
    } else if (ftype == Ftype::kQ3_K_M) {
      t = layer < shape.n_layer / 16 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
    } else if (k_medium && more_bits) {
      t = GgmlType::kQ6_K;
    } else if (iq4 && layer < shape.n_layer / 8) {
      t = GgmlType::kQ5_K;
    }
  } else if (kind == TensorKind::kAttnOutput) {
    if (eight_experts) {
      if (ftype == Ftype::kQ2_K || ftype == Ftype::kQ3_K_M || ftype == Ftype::kQ4_K_M || iq4) {
        t = GgmlType::kQ5_K;
      }
    } else {
      if (ftype == Ftype::kQ2_K) t = GgmlType::kQ3_K;
      if (ftype == Ftype::kQ3_K_M) t = GgmlType::kQ4_K;
    }
  }
  return FallbackType(t, row_len);
}

// ------------------------------------------------------------ presets ----

std::vector<float> Llama3RopeFactors(const Llama3RopeScaling& sc, double rope_base,
                                     uint32_t n_rot) {
  // convert_hf_to_gguf.py: inverse frequencies base^(-i/n_rot) in float32
  // (torch), then per pair a wavelength 2 pi / freq compared with the
  // original context over high_freq_factor (shorter: 1) and over
  // low_freq_factor (longer: factor), and in between
  // 1 / ((1 - smooth) / factor + smooth) with
  // smooth = (original_context / wavelength - low) / (high - low).
  // Why the blend is in double: that reproduces llama.cpp's
  // small-llama31-q4km oracle bit for bit (float32 arithmetic there is one
  // ulp off in 3 of its 6 blended factors).
  const double low_wavelen = sc.original_context / sc.low_freq_factor;
  const double high_wavelen = sc.original_context / sc.high_freq_factor;
  const double two_pi = 2.0 * 3.14159265358979323846;
  const double base = static_cast<float>(rope_base);  // a float32 in the file and in torch
  std::vector<float> out;
  out.reserve(n_rot / 2);
  for (uint32_t i = 0; i < n_rot; i += 2) {
    const float exponent = static_cast<float>(i) / static_cast<float>(n_rot);
    // The float32 power, rounded once from the double one.
    const float power = static_cast<float>(std::pow(base, static_cast<double>(exponent)));
    const float inv_freq = 1.0f / power;
    const double wavelen = two_pi / static_cast<double>(inv_freq);
    double f;
    if (wavelen < high_wavelen) {
      f = 1.0;
    } else if (wavelen > low_wavelen) {
      f = sc.factor;
    } else {
      const double smooth = (sc.original_context / wavelen - sc.low_freq_factor) /
                            (sc.high_freq_factor - sc.low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / sc.factor + smooth);
    }
    out.push_back(static_cast<float>(f));
  }
  return out;
}

namespace {

// The preset as the model description reads it.
model::Hparams PresetHparams(const Preset& p) {
  model::Hparams hp;
  hp.arch = p.arch;
  hp.arch_name = std::string(model::ArchName(p.arch));
  hp.n_embd = p.n_embd;
  hp.n_layer = p.n_layer;
  hp.n_ff = p.n_ff;
  hp.n_head = p.n_head;
  hp.n_head_kv = p.n_head_kv;
  hp.head_dim = p.head_dim;
  hp.n_rot = p.head_dim;
  hp.n_vocab = p.n_vocab;
  hp.n_ctx_train = p.n_ctx;
  hp.rope_freq_base = p.rope_base;
  hp.rms_eps = p.rms_eps;
  hp.n_expert = p.n_expert;
  hp.n_expert_used = p.n_expert_used;
  hp.n_ff_exp = p.n_ff_exp;
  return hp;
}

// Of the optional tensors, a preset has the QKV biases (qwen2) and
// rope_freqs.weight (Llama 3.1), or none.
bool PresetHas(const Preset& p, const model::TensorSpec& s) {
  using model::TensorKind;
  if (!s.optional) return true;
  if (s.kind == TensorKind::kRopeFreqs) return p.llama3_rope.has_value();
  return p.qkv_bias && (s.kind == TensorKind::kAttnQBias || s.kind == TensorKind::kAttnKBias ||
                        s.kind == TensorKind::kAttnVBias);
}

TensorRole RoleOf(const model::TensorSpec& s) {
  using model::TensorKind;
  if (s.matrix) return TensorRole::kMatrix;
  if (s.kind == TensorKind::kRopeFreqs) return TensorRole::kFixed;
  const bool norm = s.kind == TensorKind::kAttnNorm || s.kind == TensorKind::kFfnNorm ||
                    s.kind == TensorKind::kOutputNorm || s.kind == TensorKind::kAttnQNorm ||
                    s.kind == TensorKind::kAttnKNorm;
  return norm ? TensorRole::kNorm : TensorRole::kBias;
}

}  // namespace

absl::StatusOr<std::vector<PlannedTensor>> PlanTensors(const Preset& p, Ftype ftype) {
  if (p.n_embd == 0 || p.n_layer == 0 || p.n_head == 0 || p.n_head_kv == 0 ||
      p.head_dim == 0 || p.n_ff == 0 || p.n_vocab == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("preset ", p.name, ": every dimension must be positive"));
  }
  if (p.n_head % p.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("preset ", p.name, ": n_head ", p.n_head,
                                                   " not a multiple of n_head_kv ", p.n_head_kv));
  }
  const MixShape mix{p.n_layer, p.n_head / p.n_head_kv, p.tied, p.n_expert};
  std::vector<PlannedTensor> plan;
  for (const model::TensorSpec& s : model::TensorSpecs(PresetHparams(p), p.tied)) {
    if (!PresetHas(p, s)) continue;
    const uint64_t ne0 = static_cast<uint64_t>(s.n_cols);
    if (!s.matrix) {
      PlannedTensor t{{s.name, {ne0}, GgmlType::kF32}, RoleOf(s), {}};
      if (t.role == TensorRole::kFixed) {  // rope_freqs.weight [n_rot / 2]
        t.values = Llama3RopeFactors(*p.llama3_rope, p.rope_base, p.head_dim);
        if (t.values.size() != ne0) {
          return absl::InternalError(absl::StrCat("preset ", p.name, ": ", t.values.size(),
                                                  " rope factors for ", s.name, " [", ne0, "]"));
        }
      }
      plan.push_back(std::move(t));
      continue;
    }
    const GgmlType type = MatrixType(ftype, s.kind, std::max(s.layer, 0), ne0, mix);
    const formats::GgmlTypeTraits tr = formats::TraitsOf(type);
    if (ne0 % tr.block_elems != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset ", p.name, ": tensor ", s.name, " has rows of ", ne0,
                       " weights, not a whole number of ", std::string(tr.name), " blocks"));
    }
    std::vector<uint64_t> ne = {ne0, static_cast<uint64_t>(s.n_rows)};
    if (s.n_mats > 1) ne.push_back(static_cast<uint64_t>(s.n_mats));
    plan.push_back({{s.name, ne, type}, TensorRole::kMatrix, {}});
  }
  return plan;
}

uint64_t PlanDataBytes(const std::vector<PlannedTensor>& plan, uint64_t alignment) {
  uint64_t total = 0;
  for (const PlannedTensor& t : plan) {
    const formats::GgmlTypeTraits tr = formats::TraitsOf(t.spec.type);
    uint64_t bytes = t.spec.ne[0] / tr.block_elems * tr.block_bytes;
    for (size_t d = 1; d < t.spec.ne.size(); ++d) bytes *= t.spec.ne[d];
    total += (bytes + alignment - 1) / alignment * alignment;
  }
  return total;
}

// ----------------------------------------------------------- metadata ----

absl::StatusOr<Vocab> LoadVocab(const std::string& path) {
  const absl::StatusOr<formats::GgufFile> file = formats::GgufFile::Open(path);
  DPL_RETURN_IF_ERROR(dpl::Annotate(file.status(), "cannot read vocab file"));
  Vocab vocab;
  for (const formats::MetaKV& kv : file->metadata().entries()) {
    if (absl::StartsWith(kv.key, "tokenizer.")) vocab.tokenizer.Set(kv.key, kv.value);
  }
  const MetaValue* tokens = file->metadata().Find("tokenizer.ggml.tokens");
  if (tokens == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab file ", path, " has no tokenizer.ggml.tokens"));
  }
  if (tokens->type != formats::GgufValueType::kArray ||
      tokens->elem_type != formats::GgufValueType::kString || tokens->count == 0 ||
      tokens->count > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab file ", path, ": tokenizer.ggml.tokens is not a non-empty string array (",
        tokens->DebugString(2), ")"));
  }
  vocab.n_vocab = static_cast<uint32_t>(tokens->count);
  return vocab;
}

formats::Metadata BuildMetadata(const Preset& p, Ftype ftype, const Vocab* vocab) {
  formats::Metadata m;
  const std::string arch(model::ArchName(p.arch));
  const std::string a = arch + ".";
  m.Set("general.architecture", MetaValue::String(arch));
  if (vocab != nullptr) {
    for (const formats::MetaKV& kv : vocab->tokenizer.entries()) m.Set(kv.key, kv.value);
  } else {
    m.Set("tokenizer.ggml.model", MetaValue::String("none"));
    m.Set(a + "vocab_size", MetaValue::U32(p.n_vocab));
  }
  m.Set("general.name", MetaValue::String("synthetic-" + p.name));
  m.Set(a + "block_count", MetaValue::U32(p.n_layer));
  m.Set(a + "context_length", MetaValue::U32(p.n_ctx));
  m.Set(a + "embedding_length", MetaValue::U32(p.n_embd));
  m.Set(a + "feed_forward_length", MetaValue::U32(p.n_ff));
  m.Set(a + "attention.head_count", MetaValue::U32(p.n_head));
  m.Set(a + "attention.head_count_kv", MetaValue::U32(p.n_head_kv));
  m.Set(a + "rope.freq_base", MetaValue::F32(p.rope_base));
  m.Set(a + "attention.layer_norm_rms_epsilon", MetaValue::F32(p.rms_eps));
  if (uint64_t{p.head_dim} * p.n_head != p.n_embd) {
    // llama.cpp assumes n_embd / n_head unless told otherwise; its converter
    // writes these after the epsilon (as small-qwen3-q4km has them).
    m.Set(a + "attention.key_length", MetaValue::U32(p.head_dim));
    m.Set(a + "attention.value_length", MetaValue::U32(p.head_dim));
  }
  if (p.sliding_window != 0) {
    m.Set(a + "attention.sliding_window", MetaValue::U32(p.sliding_window));
  }
  if (p.n_expert != 0) {
    m.Set(a + "expert_count", MetaValue::U32(p.n_expert));
    m.Set(a + "expert_used_count", MetaValue::U32(p.n_expert_used));
    m.Set(a + "expert_feed_forward_length", MetaValue::U32(p.n_ff_exp));
  }
  m.Set("general.file_type", MetaValue::U32(static_cast<uint32_t>(ftype)));
  return m;
}

// --------------------------------------------------------- generation ----

namespace {

// splitmix64 (Steele, Lea, Flood 2014): one add and three xor-shift-multiply
// steps per 64 random bits; good enough for weights, and trivially seekable.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() { return Mix64(s_ += 0x9E3779B97F4A7C15ull); }
  void Fill(uint8_t* out, size_t n) {  // n random bytes
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const uint64_t r = Next();
      std::memcpy(out + i, &r, 8);
    }
    if (i < n) {
      const uint64_t r = Next();
      std::memcpy(out + i, &r, n - i);
    }
  }
  // Uniform in [0, 1).
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  // Approximately standard normal: a sum of four uniform 16-bit values
  // (Irwin-Hall; variance 4/12, rescaled to 1). One draw per value.
  float Normal() {
    const uint64_t r = Next();
    const float s = static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) +
                                       ((r >> 32) & 0xffff) + (r >> 48) + 2);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }

 private:
  uint64_t s_;
};

uint64_t NameHash(std::string_view name) {  // FNV-1a 64
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Mean of k^2 for k uniform in [lo, hi].
constexpr double MeanSquare(int lo, int hi) {
  double s = 0;
  for (int k = lo; k <= hi; ++k) s += double(k) * k;
  return s / (hi - lo + 1);
}

// Every block scale is the tensor's base scale times a factor uniform in
// [0.75, 1.25] (so blocks differ, as in real files); E[f^2] = 1 + 0.5^2/12.
constexpr double kBlockJitterMs = 1.0 + 0.25 / 12.0;
inline float BlockJitter(Rng& rng) { return 0.75f + 0.5f * rng.Uniform(); }

// Value ranges of the sub-block scales drawn below.
constexpr int kQ4KScLo = 32, kQ4KScHi = 63;    // 6-bit, top bit set (q4_K, q5_K)
constexpr int kQ6KScLo = 64, kQ6KScHi = 127;   // |int8|, random sign
constexpr int kQ3KScLo = 16, kQ3KScHi = 31;    // |signed 6-bit|, random sign (q3_K, iq4_xs)
constexpr int kQ2KScLo = 8, kQ2KScHi = 15;     // 4-bit, top bit set

inline void PutHalf(uint8_t* p, float v) {
  const uint16_t h = formats::F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// A random sign and block jitter on d_base, for the 32-weight types whose
// quants have a nonzero mean (q4_0, q5_0, q8_0, iq4_nl).
float SignedScale(Rng& rng, float d_base) {
  const uint64_t r = rng.Next();
  const float d = d_base * (0.75f + 0.5f * static_cast<float>(r >> 40) / 16777216.0f);
  return (r & 1) ? -d : d;
}

// The 12 scale bytes of q4_K and q5_K with scale sc[j] and min m_j = sc[j]
// for each sub-block j (the packing quant-blocks.md documents).
void PackKScalesMinsEqual(const uint8_t sc[8], uint8_t* s) {
  for (int k = 0; k < 4; ++k) {
    const uint8_t hi = sc[k + 4];
    s[k] = static_cast<uint8_t>(sc[k] | ((hi >> 4) << 6));      // sc_k, top of sc_{k+4}
    s[k + 4] = static_cast<uint8_t>(sc[k] | ((hi >> 4) << 6));  // m_k = sc_k, top of m_{k+4}
    s[k + 8] = static_cast<uint8_t>((hi & 0xF) | ((hi & 0xF) << 4));  // low sc/m_{k+4}
  }
}

// q4_K: w = d * sc_j * q - dmin * m_j with q uniform in 0..15 (random
// nibbles). With m_j = sc_j and dmin = 7.5 d, w = d * sc_j * (q - 7.5):
// zero mean, E[w^2] = d^2 E[sc^2] (16^2 - 1)/12.
void FillQ4K(Rng& rng, float d_base, uint8_t* blk) {  // 144 bytes
  const float d = d_base * BlockJitter(rng);
  PutHalf(blk, d);
  PutHalf(blk + 2, 7.5f * formats::F16ToF32(formats::F32ToF16(d)));
  uint8_t sc[8];
  const uint64_t r = rng.Next();
  for (int j = 0; j < 8; ++j) sc[j] = static_cast<uint8_t>(kQ4KScLo + ((r >> (5 * j)) & 31));
  PackKScalesMinsEqual(sc, blk + 4);  // scales[12]
  rng.Fill(blk + 16, 128);
}

// q5_K: as q4_K with a fifth bit per weight (qh): q uniform in 0..31, m_j =
// sc_j, dmin = 15.5 d, so w = d * sc_j * (q - 15.5) and E[w^2] = d^2 E[sc^2]
// (32^2 - 1)/12.
void FillQ5K(Rng& rng, float d_base, uint8_t* blk) {  // 176 bytes
  const float d = d_base * BlockJitter(rng);
  PutHalf(blk, d);                                                    // d
  PutHalf(blk + 2, 15.5f * formats::F16ToF32(formats::F32ToF16(d)));  // dmin
  uint8_t sc[8];
  const uint64_t r = rng.Next();
  for (int j = 0; j < 8; ++j) sc[j] = static_cast<uint8_t>(kQ4KScLo + ((r >> (5 * j)) & 31));
  PackKScalesMinsEqual(sc, blk + 4);  // scales[12]
  rng.Fill(blk + 16, 32 + 128);       // qh[32], qs[128]
}

// q3_K: q = (2 low bits) - (high bit ? 0 : 4), uniform in -4..3 (random
// hmask and qs): E[q^2] = 5.5. Sub-block scales |sc| in 16..31 with a random
// sign (zero mean, as the -0.5 mean of q cancels across sub-blocks).
void FillQ3K(Rng& rng, float d_base, uint8_t* blk) {  // 110 bytes
  rng.Fill(blk, 32 + 64);  // hmask[32], qs[64]
  uint8_t* scales = blk + 96;  // 16 signed 6-bit scales, stored as sc + 32
  std::memset(scales, 0, 12);
  const uint64_t mags = rng.Next(), signs = rng.Next();
  for (int k = 0; k < 16; ++k) {
    const int mag = kQ3KScLo + static_cast<int>((mags >> (4 * k)) & 15);
    const int sc = ((signs >> k) & 1) ? -mag : mag;
    const int u = sc + 32;  // 1..16 or 48..63
    scales[k % 8] |= static_cast<uint8_t>((u & 0xF) << (4 * (k / 8)));
    scales[8 + k % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (k / 4)));
  }
  PutHalf(blk + 108, d_base * BlockJitter(rng));  // d
}

// q2_K: q uniform in 0..3 (random qs), sub-block scale sc in 8..15 and min
// m = sc with dmin = 1.5 d: w = d * sc * (q - 1.5), E[(q - 1.5)^2] = 1.25.
void FillQ2K(Rng& rng, float d_base, uint8_t* blk) {  // 84 bytes
  const uint64_t r = rng.Next();
  for (int k = 0; k < 16; ++k) {
    const int sc = kQ2KScLo + static_cast<int>((r >> (3 * k)) & 7);
    blk[k] = static_cast<uint8_t>(sc | (sc << 4));  // scales[16]: sc low nibble, m high
  }
  rng.Fill(blk + 16, 64);  // qs[64]
  const float d = d_base * BlockJitter(rng);
  PutHalf(blk + 80, d);                                               // d
  PutHalf(blk + 82, 1.5f * formats::F16ToF32(formats::F32ToF16(d)));  // dmin
}

// q4_0 / iq4_nl: random nibbles, random sign of d. q4_0: w = d (q - 8),
// E[(q - 8)^2] = 21.5; iq4_nl: w = d kvalues[q], E = MeanSquareIq4Nl().
void FillQ4_0(Rng& rng, float d_base, uint8_t* blk) {  // 18 bytes, also iq4_nl
  PutHalf(blk, SignedScale(rng, d_base));
  rng.Fill(blk + 2, 16);
}

// q4_1 / q5_1: w = d q + m with m = -(2^bits - 1)/2 d, zero mean:
// E[w^2] = d^2 (4^bits - 1)/12 (21.25 and 85.25).
template <int kBits>
void FillQ4_1Q5_1(Rng& rng, float d_base, uint8_t* blk) {  // 20 or 24 bytes
  const float d = d_base * BlockJitter(rng);
  PutHalf(blk, d);
  PutHalf(blk + 2, -0.5f * ((1 << kBits) - 1) * formats::F16ToF32(formats::F32ToF16(d)));
  rng.Fill(blk + 4, kBits == 5 ? 4 + 16 : 16);  // [qh[4]], qs[16]
}

// iq4_xs: 8 sub-blocks, signed 6-bit scales |ls| in 16..31 with random
// signs, random nibbles: w = d ls kvalues[q], E = E[ls^2] MeanSquareIq4Nl().
void FillIQ4XS(Rng& rng, float d_base, uint8_t* blk) {  // 136 bytes
  PutHalf(blk, d_base * BlockJitter(rng));  // d
  uint16_t scales_h = 0;
  uint8_t* scales_l = blk + 4;
  std::memset(scales_l, 0, 4);
  const uint64_t r = rng.Next();
  for (int j = 0; j < 8; ++j) {
    const int mag = kQ3KScLo + static_cast<int>((r >> (4 * j)) & 15);
    const int ls = ((r >> (32 + j)) & 1) ? -mag : mag;
    const int u = ls + 32;
    scales_l[j / 2] |= static_cast<uint8_t>((u & 0xF) << (4 * (j % 2)));
    scales_h = static_cast<uint16_t>(scales_h | ((u >> 4) << (2 * j)));
  }
  blk[2] = static_cast<uint8_t>(scales_h & 0xFF);  // little-endian u16
  blk[3] = static_cast<uint8_t>(scales_h >> 8);
  rng.Fill(blk + 8, 128);  // qs[128]
}

// Mean of kvalues[q]^2 for q uniform in 0..15.
constexpr double MeanSquareIq4Nl() {
  double s = 0;
  for (int8_t v : formats::kIq4NlValues) s += double(v) * v;
  return s / 16;
}

// q6_K: w = d * sc * (q - 32), q uniform in 0..63 (random bytes); random
// sign of each sub-block scale makes the mean zero. E[(q-32)^2] = 341.5.
void FillQ6K(Rng& rng, float d_base, uint8_t* blk) {  // 210 bytes
  rng.Fill(blk, 128 + 64 + 16);  // ql, qh, and one random byte per scale
  for (int j = 0; j < 16; ++j) {
    const uint8_t b = blk[192 + j];
    const int mag = kQ6KScLo + (b & 63);  // 6 random bits: 64..127
    blk[192 + j] = static_cast<uint8_t>(static_cast<int8_t>((b & 64) ? -mag : mag));
  }
  PutHalf(blk + 208, d_base * BlockJitter(rng));
}

// q5_0 / q8_0: random quants, random sign of d. E[(q-16)^2] = 85.5 for
// q5_0 (q in 0..31), E[q^2] = 5461.5 for q8_0 (q in -128..127).
void FillQ5_0(Rng& rng, float d_base, uint8_t* blk) {  // 22 bytes
  PutHalf(blk, SignedScale(rng, d_base));
  rng.Fill(blk + 2, 20);
}
void FillQ8_0(Rng& rng, float d_base, uint8_t* blk) {  // 34 bytes
  PutHalf(blk, SignedScale(rng, d_base));
  rng.Fill(blk + 2, 32);
}

// Base block scale giving a dequantized std of `sigma`.
float BaseScale(GgmlType type, double sigma) {
  switch (type) {
    case GgmlType::kQ4_K:
      return static_cast<float>(
          sigma / std::sqrt(21.25 * MeanSquare(kQ4KScLo, kQ4KScHi) * kBlockJitterMs));
    case GgmlType::kQ6_K: {
      // Magnitudes are kQ6KScLo + (6 random bits), i.e. 64..127.
      return static_cast<float>(
          sigma / std::sqrt(341.5 * MeanSquare(kQ6KScLo, kQ6KScHi) * kBlockJitterMs));
    }
    case GgmlType::kQ5_K:
      return static_cast<float>(
          sigma / std::sqrt(85.25 * MeanSquare(kQ4KScLo, kQ4KScHi) * kBlockJitterMs));
    case GgmlType::kQ3_K:
      return static_cast<float>(
          sigma / std::sqrt(5.5 * MeanSquare(kQ3KScLo, kQ3KScHi) * kBlockJitterMs));
    case GgmlType::kQ2_K:
      return static_cast<float>(
          sigma / std::sqrt(1.25 * MeanSquare(kQ2KScLo, kQ2KScHi) * kBlockJitterMs));
    case GgmlType::kIQ4_XS:
      return static_cast<float>(
          sigma / std::sqrt(MeanSquareIq4Nl() * MeanSquare(kQ3KScLo, kQ3KScHi) * kBlockJitterMs));
    case GgmlType::kQ4_0: return static_cast<float>(sigma / std::sqrt(21.5 * kBlockJitterMs));
    case GgmlType::kQ4_1: return static_cast<float>(sigma / std::sqrt(21.25 * kBlockJitterMs));
    case GgmlType::kQ5_0: return static_cast<float>(sigma / std::sqrt(85.5 * kBlockJitterMs));
    case GgmlType::kQ5_1: return static_cast<float>(sigma / std::sqrt(85.25 * kBlockJitterMs));
    case GgmlType::kQ8_0: return static_cast<float>(sigma / std::sqrt(5461.5 * kBlockJitterMs));
    case GgmlType::kIQ4_NL:
      return static_cast<float>(sigma / std::sqrt(MeanSquareIq4Nl() * kBlockJitterMs));
    default: return static_cast<float>(sigma);  // f32, f16, bf16: N(0, 1) times sigma
  }
}

}  // namespace

void FillRows(const PlannedTensor& t, uint64_t seed, uint64_t row_begin, uint64_t n_rows,
              uint8_t* out) {
  const GgmlType type = t.spec.type;
  const formats::GgmlTypeTraits tr = formats::TraitsOf(type);
  const uint64_t ne0 = t.spec.ne[0];
  const uint64_t n_blocks = ne0 / tr.block_elems;
  const uint64_t row_bytes = n_blocks * tr.block_bytes;
  // Matrices: std 0.5/sqrt(fan-in) (activations keep their scale through
  // a layer). Norm weights: 1 + 0.1 N(0,1). Biases: 0.02 N(0,1).
  const double sigma = t.role == TensorRole::kMatrix ? 0.5 / std::sqrt(double(ne0))
                       : t.role == TensorRole::kNorm ? 0.1
                                                     : 0.02;
  const float center = t.role == TensorRole::kNorm ? 1.0f : 0.0f;
  const float base = BaseScale(type, sigma);
  const uint64_t tensor_key = Mix64(seed ^ Mix64(NameHash(t.spec.name)));

  if (t.role == TensorRole::kFixed) {  // f32 values given by the plan
    std::memcpy(out, t.values.data() + row_begin * ne0, n_rows * ne0 * sizeof(float));
    return;
  }
  // One filler per block type, for blocks of block_bytes at a base scale.
  void (*fill_block)(Rng&, float, uint8_t*) = nullptr;
  switch (type) {
    case GgmlType::kQ4_K: fill_block = FillQ4K; break;
    case GgmlType::kQ5_K: fill_block = FillQ5K; break;
    case GgmlType::kQ6_K: fill_block = FillQ6K; break;
    case GgmlType::kQ3_K: fill_block = FillQ3K; break;
    case GgmlType::kQ2_K: fill_block = FillQ2K; break;
    case GgmlType::kQ4_0:
    case GgmlType::kIQ4_NL: fill_block = FillQ4_0; break;
    case GgmlType::kQ4_1: fill_block = FillQ4_1Q5_1<4>; break;
    case GgmlType::kQ5_0: fill_block = FillQ5_0; break;
    case GgmlType::kQ5_1: fill_block = FillQ4_1Q5_1<5>; break;
    case GgmlType::kQ8_0: fill_block = FillQ8_0; break;
    case GgmlType::kIQ4_XS: fill_block = FillIQ4XS; break;
    default: break;  // f32, f16, bf16 below (PlanTensors makes no other type)
  }

  for (uint64_t r = 0; r < n_rows; ++r) {
    // One generator per row, so any split of the rows gives the same bytes.
    Rng rng(Mix64(tensor_key + (row_begin + r) * 0xD1B54A32D192ED03ull));
    uint8_t* row = out + r * row_bytes;  // (n_blocks, block_bytes)
    if (fill_block != nullptr) {
      for (uint64_t b = 0; b < n_blocks; ++b) fill_block(rng, base, row + b * tr.block_bytes);
      continue;
    }
    switch (type) {
      case GgmlType::kF16:
        for (uint64_t i = 0; i < ne0; ++i) {
          const uint16_t h = formats::F32ToF16(center + base * rng.Normal());
          std::memcpy(row + 2 * i, &h, 2);
        }
        break;
      case GgmlType::kBF16:
        for (uint64_t i = 0; i < ne0; ++i) {
          const uint16_t h = formats::F32ToBf16(center + base * rng.Normal());
          std::memcpy(row + 2 * i, &h, 2);
        }
        break;
      default:  // kF32
        for (uint64_t i = 0; i < ne0; ++i) {
          const float v = center + base * rng.Normal();
          std::memcpy(row + 4 * i, &v, 4);
        }
        break;
    }
  }
}

// ------------------------------------------------------------- writer ----

namespace {

// Rows [row_begin, row_begin + n_rows) of plan[tensor]: about kChunkBytes.
struct WorkItem {
  size_t tensor;
  uint64_t row_begin;
  uint64_t n_rows;
};

uint64_t RowBytes(const formats::GgufTensorSpec& s) {
  const formats::GgmlTypeTraits tr = formats::TraitsOf(s.type);
  return s.ne[0] / tr.block_elems * tr.block_bytes;
}

std::vector<WorkItem> MakeWorkItems(const std::vector<PlannedTensor>& plan) {
  std::vector<WorkItem> items;
  for (size_t i = 0; i < plan.size(); ++i) {
    const formats::GgufTensorSpec& s = plan[i].spec;
    uint64_t n_rows = 1;
    for (size_t d = 1; d < s.ne.size(); ++d) n_rows *= s.ne[d];
    const uint64_t per = std::max<uint64_t>(1, kChunkBytes / RowBytes(s));
    for (uint64_t r = 0; r < n_rows; r += per) items.push_back({i, r, std::min(per, n_rows - r)});
  }
  return items;
}

// Generates every tensor in chunks on `threads` threads and writes each chunk
// at its place in the data section (which starts at header.bytes.size()).
absl::Status WriteTensors(const std::vector<PlannedTensor>& plan, const formats::GgufHeader& header,
                          uint64_t seed, unsigned threads, const formats::OutputFile& out) {
  const std::vector<WorkItem> items = MakeWorkItems(plan);
  const unsigned n_threads = threads ? threads : std::thread::hardware_concurrency();
  return formats::ParallelFor(static_cast<int>(n_threads), items.size(), [&](size_t k) {
    const WorkItem& it = items[k];
    const PlannedTensor& t = plan[it.tensor];
    const uint64_t row_bytes = RowBytes(t.spec);
    std::vector<uint8_t> buf(it.n_rows * row_bytes);
    FillRows(t, seed, it.row_begin, it.n_rows, buf.data());
    const uint64_t off = header.bytes.size() + header.offsets[it.tensor] + it.row_begin * row_bytes;
    return out.Write(buf.data(), buf.size(), off);
  });
}

}  // namespace

absl::StatusOr<SynthResult> WriteSyntheticModel(const SynthOptions& opts,
                                                const std::string& out_path) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opts.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", opts.threads,
                                                   " out of range (0 = all cores, or 1..",
                                                   kMaxThreads, ")"));
  }
  Preset preset = opts.preset;
  std::optional<Vocab> vocab;
  if (opts.vocab_path) {
    DPL_ASSIGN_OR_RETURN(vocab, LoadVocab(*opts.vocab_path));
    preset.n_vocab = vocab->n_vocab;
  }
  DPL_ASSIGN_OR_RETURN(const std::vector<PlannedTensor> plan, PlanTensors(preset, opts.ftype));
  const formats::Metadata meta = BuildMetadata(preset, opts.ftype, vocab ? &*vocab : nullptr);
  std::vector<formats::GgufTensorSpec> specs;
  specs.reserve(plan.size());
  for (const PlannedTensor& t : plan) specs.push_back(t.spec);
  DPL_ASSIGN_OR_RETURN(const formats::GgufHeader header, formats::BuildGgufHeader(meta, specs));
  const uint64_t file_bytes = header.bytes.size() + header.data_bytes;

  formats::OutputOptions out_opt;
  if (opts.vocab_path) out_opt.inputs = {*opts.vocab_path};
  DPL_ASSIGN_OR_RETURN(formats::OutputFile out, formats::OutputFile::Create(out_path, out_opt));
  DPL_RETURN_IF_ERROR(out.Resize(file_bytes));  // holes: the alignment padding reads as zeros
  DPL_RETURN_IF_ERROR(out.Write(header.bytes.data(), header.bytes.size(), 0));
  DPL_RETURN_IF_ERROR(WriteTensors(plan, header, opts.seed, opts.threads, out));
  DPL_RETURN_IF_ERROR(out.Commit());
  SynthResult res;
  res.n_tensors = plan.size();
  res.file_bytes = file_bytes;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace dpl::synth
