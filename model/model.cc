#include "model/model.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "formats/ggml_types.h"

namespace dpl::model {
namespace {

using formats::TensorView;

// The architecture table: what the supported decoders' files differ in.
// Which tensors may exist follows llama.cpp's loader (llama-model.cpp):
// llama has optional q/k/v/output biases and llama 3.1 frequency factors;
// qwen2 has q/k/v biases (required there, optional here) and neither of the
// others; qwen3 has no biases but a per-head RMSNorm of q and k
// (attn_q_norm, attn_k_norm: [head_dim], required); qwen3moe is qwen3 with a
// mixture of experts for every layer's feed-forward (router ffn_gate_inp,
// 3-D ffn_{gate,up,down}_exps). The math that differs keys off rope_style,
// Hparams::qk_norm and Hparams::moe().
struct ArchInfo {
  Arch arch;
  const char* name;       // general.architecture
  RopeStyle rope_style;
  bool qkv_bias;          // blk.N.attn_{q,k,v}.bias may exist
  bool output_bias;       // blk.N.attn_output.bias may exist
  bool rope_freqs;        // rope_freqs.weight may exist
  bool qk_norm;           // blk.N.attn_{q,k}_norm.weight exist (required)
  bool moe;               // experts instead of one feed-forward (expert_count required)
};
constexpr ArchInfo kArchs[] = {
    {Arch::kLlama, "llama", RopeStyle::kAdjacent, true, true, true, false, false},
    {Arch::kQwen2, "qwen2", RopeStyle::kNeox, true, false, false, false, false},
    {Arch::kQwen3, "qwen3", RopeStyle::kNeox, false, false, false, true, false},
    {Arch::kQwen3Moe, "qwen3moe", RopeStyle::kNeox, false, false, false, true, true},
};

const ArchInfo& InfoOf(Arch arch) {
  for (const ArchInfo& a : kArchs) {
    if (a.arch == arch) return a;
  }
  return kArchs[0];  // unreachable: every Arch has a row
}

// Caps on hyperparameters from untrusted files, each well above every
// released model (largest today: 126 layers, n_embd 16384, n_ff 53248, 128
// heads, head size 256, a 262144-token vocabulary, 10M context) and low
// enough that no size derived from them overflows or asks for absurd memory
// before the tensors are checked. block_count follows llama.cpp's
// LLAMA_MAX_LAYERS.
constexpr int64_t kMaxLayers = 512;
constexpr int64_t kMaxEmbd = 65536;
constexpr int64_t kMaxFf = 1 << 18;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxContext = 1 << 24;
constexpr int64_t kMaxExperts = 1024;  // released: 512 (Qwen3-Next), 256 (DeepSeek V3)

// Reads an integer key in [1, cap]; `dflt` < 0 means the key is required.
absl::StatusOr<int64_t> PositiveInt(const formats::Metadata& meta, const std::string& key,
                                    int64_t dflt, int64_t cap) {
  uint64_t v = 0;
  if (dflt < 0) {
    DPL_ASSIGN_OR_RETURN(v, meta.GetUint(key));
  } else {
    DPL_ASSIGN_OR_RETURN(v, meta.GetUintOr(key, static_cast<uint64_t>(dflt)));
  }
  if (v == 0 || v > static_cast<uint64_t>(cap)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", key, " = ", v, " is out of range (1..", cap, ")"));
  }
  return static_cast<int64_t>(v);
}

// The experts of a MoE architecture: count, used per token, width; a dense
// architecture must not name any.
absl::Status ReadExperts(const formats::Metadata& meta, const std::string& p, bool moe,
                         Hparams* hp) {
  if (!moe) {
    DPL_ASSIGN_OR_RETURN(const uint64_t experts, meta.GetUintOr(p + "expert_count", 0));
    if (experts != 0) {
      return absl::UnimplementedError(absl::StrCat(
          p, "expert_count = ", experts, ": mixture-of-experts is supported for qwen3moe only"));
    }
    return absl::OkStatus();
  }
  DPL_ASSIGN_OR_RETURN(hp->n_expert, PositiveInt(meta, p + "expert_count", -1, kMaxExperts));
  DPL_ASSIGN_OR_RETURN(hp->n_expert_used,
                       PositiveInt(meta, p + "expert_used_count", -1, hp->n_expert));
  DPL_ASSIGN_OR_RETURN(hp->n_ff_exp, PositiveInt(meta, p + "expert_feed_forward_length", -1, kMaxFf));
  return absl::OkStatus();
}

// Widths: embedding, layers, feed-forward, heads, head size, rotary width.
absl::Status ReadWidths(const formats::Metadata& meta, const std::string& p, Hparams* hp) {
  DPL_ASSIGN_OR_RETURN(hp->n_embd, PositiveInt(meta, p + "embedding_length", -1, kMaxEmbd));
  DPL_ASSIGN_OR_RETURN(hp->n_layer, PositiveInt(meta, p + "block_count", -1, kMaxLayers));
  DPL_ASSIGN_OR_RETURN(hp->n_ff, PositiveInt(meta, p + "feed_forward_length", -1, kMaxFf));
  DPL_ASSIGN_OR_RETURN(hp->n_head, PositiveInt(meta, p + "attention.head_count", -1, kMaxHeads));
  DPL_ASSIGN_OR_RETURN(hp->n_head_kv,
                       PositiveInt(meta, p + "attention.head_count_kv", hp->n_head, kMaxHeads));
  if (hp->n_head % hp->n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        p, "attention.head_count = ", hp->n_head, " is not divisible by ", p,
        "attention.head_count_kv = ", hp->n_head_kv));
  }
  if (meta.Find(p + "attention.key_length") == nullptr && hp->n_embd % hp->n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "embedding_length = ", hp->n_embd, " is not divisible by ", p,
                     "attention.head_count = ", hp->n_head, " and no key_length is given"));
  }
  DPL_ASSIGN_OR_RETURN(hp->head_dim, PositiveInt(meta, p + "attention.key_length",
                                                  hp->n_embd / hp->n_head, kMaxHeadDim));
  DPL_ASSIGN_OR_RETURN(const int64_t value_length,
                       PositiveInt(meta, p + "attention.value_length", hp->head_dim, kMaxHeadDim));
  if (value_length != hp->head_dim) {
    return absl::UnimplementedError(absl::StrCat(p, "attention.value_length = ", value_length,
                                                 " differs from key_length = ", hp->head_dim));
  }
  if (hp->head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head size ", hp->head_dim, " is odd (RoPE rotates pairs)"));
  }
  DPL_ASSIGN_OR_RETURN(hp->n_rot,
                       PositiveInt(meta, p + "rope.dimension_count", hp->head_dim, kMaxHeadDim));
  if (hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.dimension_count = ", hp->n_rot,
                                                   " must be even and <= head size ",
                                                   hp->head_dim));
  }
  DPL_ASSIGN_OR_RETURN(const uint64_t ctx, meta.GetUintOr(p + "context_length", 0));
  if (ctx > static_cast<uint64_t>(kMaxContext)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", p, "context_length = ", ctx,
                                                   " is out of range (0..", kMaxContext, ")"));
  }
  hp->n_ctx_train = static_cast<int64_t>(ctx);
  DPL_ASSIGN_OR_RETURN(const uint64_t window, meta.GetUintOr(p + "attention.sliding_window", 0));
  if (window > static_cast<uint64_t>(kMaxContext)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", p, "attention.sliding_window = ",
                                                   window, " is out of range (0..", kMaxContext, ")"));
  }
  hp->sliding_window = static_cast<int64_t>(window);
  return absl::OkStatus();
}

// RoPE base and scaling as llama.cpp reads them: the scaling type defaults to
// linear, whose factor (rope.scaling.factor, or the older rope.scale_linear;
// 0 means 1) divides every rotation angle. "none" ignores the factor.
absl::Status ReadRope(const formats::Metadata& meta, const std::string& p, Hparams* hp) {
  DPL_ASSIGN_OR_RETURN(const double base, meta.GetFloatOr(p + "rope.freq_base", 10000.0));
  if (!(base > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.freq_base = ", base));
  }
  hp->rope_freq_base = base;
  std::string scaling = "linear";
  if (meta.Find(p + "rope.scaling.type") != nullptr) {
    DPL_ASSIGN_OR_RETURN(const absl::string_view s, meta.GetString(p + "rope.scaling.type"));
    scaling = std::string(s);
  }
  if (scaling == "linear") {
    const std::string key = meta.Find(p + "rope.scaling.factor") != nullptr
                                ? p + "rope.scaling.factor"
                                : p + "rope.scale_linear";
    DPL_ASSIGN_OR_RETURN(const double factor, meta.GetFloatOr(key, 0.0));
    if (factor < 0 || !(factor == factor)) {
      return absl::InvalidArgumentError(absl::StrCat(key, " = ", factor));
    }
    hp->rope_freq_scale = factor == 0.0 ? 1.0 : 1.0 / factor;
  } else if (scaling != "none") {
    return absl::UnimplementedError(
        absl::StrCat(p, "rope.scaling.type '", scaling, "' is not supported (none, linear)"));
  }
  return absl::OkStatus();
}

std::string ShapeString(const TensorView& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < std::max<uint32_t>(t.n_dims, 1); ++d) {
    absl::StrAppend(&s, d ? ", " : "", t.ne[d]);
  }
  return s + "]";
}

// The shape (and, for vectors, the type) `spec` asks of `t`.
absl::Status CheckTensor(const TensorSpec& spec, const TensorView& t) {
  if (t.ne[0] != static_cast<uint64_t>(spec.n_cols) ||
      t.ne[1] != static_cast<uint64_t>(spec.n_rows) ||
      t.ne[2] != static_cast<uint64_t>(spec.n_mats) || t.ne[3] != 1) {
    const std::string want =
        !spec.matrix      ? absl::StrCat("[", spec.n_cols, "]")
        : spec.n_mats > 1 ? absl::StrCat("[", spec.n_cols, ", ", spec.n_rows, ", ", spec.n_mats, "]")
                          : absl::StrCat("[", spec.n_cols, ", ", spec.n_rows, "]");
    return absl::InvalidArgumentError(
        absl::StrCat(spec.name, " has shape ", ShapeString(t), ", expected ", want));
  }
  if (!spec.matrix && t.type != formats::GgmlType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.name, " has type ", formats::TraitsOf(t.type).name, ", expected f32"));
  }
  return absl::OkStatus();
}

// Where BindModel keeps the tensor of `spec`.
const TensorView** Slot(ModelDesc& d, const TensorSpec& spec) {
  LayerTensors& L = d.layers[std::max(spec.layer, 0)];
  switch (spec.kind) {
    case TensorKind::kTokenEmbd: return &d.token_embd;
    case TensorKind::kOutputNorm: return &d.output_norm;
    case TensorKind::kOutput: return &d.output;
    case TensorKind::kRopeFreqs: return &d.rope_freqs;
    case TensorKind::kAttnNorm: return &L.attn_norm;
    case TensorKind::kAttnQ: return &L.wq;
    case TensorKind::kAttnK: return &L.wk;
    case TensorKind::kAttnV: return &L.wv;
    case TensorKind::kAttnOutput: return &L.wo;
    case TensorKind::kAttnQBias: return &L.bq;
    case TensorKind::kAttnKBias: return &L.bk;
    case TensorKind::kAttnVBias: return &L.bv;
    case TensorKind::kAttnOutputBias: return &L.bo;
    case TensorKind::kFfnNorm: return &L.ffn_norm;
    case TensorKind::kFfnGate: return &L.w_gate;
    case TensorKind::kFfnUp: return &L.w_up;
    case TensorKind::kFfnDown: return &L.w_down;
    case TensorKind::kAttnQNorm: return &L.q_norm;
    case TensorKind::kAttnKNorm: return &L.k_norm;
    case TensorKind::kFfnGateInp: return &L.router;
    case TensorKind::kFfnGateExps: return &L.gate_exps;
    case TensorKind::kFfnUpExps: return &L.up_exps;
    case TensorKind::kFfnDownExps: return &L.down_exps;
  }
  return nullptr;
}

// A tensor outside the architecture's set means semantics no backend here
// implements (qwen3's attn_q_norm, MoE experts, ...): refuse, never ignore.
absl::Status CheckNoOtherTensors(const formats::ModelFile& file,
                                 const std::vector<TensorSpec>& specs, const Hparams& hp) {
  absl::flat_hash_set<absl::string_view> known;
  for (const TensorSpec& s : specs) known.insert(s.name);
  for (const TensorView& t : file.tensors()) {
    if (!known.contains(t.name)) {
      return absl::UnimplementedError(
          absl::StrCat("tensor '", t.name, "' is not part of the ", hp.arch_name, " graph"));
    }
  }
  return absl::OkStatus();
}

// Before anything is sized by n_layer: the file must hold the tensors of
// that many layers (every layer has kRequiredPerLayer required tensors, and
// the last layer's first one must be there).
absl::Status CheckLayerCount(const formats::ModelFile& file, const Hparams& hp) {
  constexpr uint64_t kRequiredPerLayer = 9;  // norms, q, k, v, o, gate, up, down (MoE: 10)
  const uint64_t need = kRequiredPerLayer * static_cast<uint64_t>(hp.n_layer) + 2;
  const std::string last = TensorName(TensorKind::kAttnNorm, static_cast<int>(hp.n_layer - 1));
  if (file.tensors().size() < need || file.Find(last) == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        hp.arch_name, ".block_count = ", hp.n_layer, " but the file has ", file.tensors().size(),
        " tensors", file.Find(last) == nullptr ? absl::StrCat(" and no '", last, "'") : "",
        " (", hp.n_layer, " layers need at least ", need, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view ArchName(Arch arch) { return InfoOf(arch).name; }

absl::StatusOr<Arch> ArchFromName(absl::string_view name) {
  std::string known;
  for (const ArchInfo& a : kArchs) {
    if (name == a.name) return a.arch;
    absl::StrAppend(&known, known.empty() ? "" : ", ", a.name);
  }
  return absl::UnimplementedError(
      absl::StrCat("unsupported architecture '", name, "' (supported: ", known, ")"));
}

absl::StatusOr<Hparams> ReadHparams(const formats::ModelFile& model) {
  const formats::Metadata& meta = model.metadata();
  Hparams hp;
  DPL_ASSIGN_OR_RETURN(const absl::string_view name, meta.GetString("general.architecture"));
  DPL_ASSIGN_OR_RETURN(hp.arch, ArchFromName(name));
  hp.arch_name = std::string(name);
  hp.rope_style = InfoOf(hp.arch).rope_style;
  hp.qk_norm = InfoOf(hp.arch).qk_norm;
  const std::string p = hp.arch_name + ".";
  DPL_RETURN_IF_ERROR(ReadWidths(meta, p, &hp));
  DPL_RETURN_IF_ERROR(ReadExperts(meta, p, InfoOf(hp.arch).moe, &hp));
  DPL_RETURN_IF_ERROR(ReadRope(meta, p, &hp));
  DPL_ASSIGN_OR_RETURN(const double eps, meta.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  if (!(eps > 0 && eps < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "attention.layer_norm_rms_epsilon = ", eps, " is out of range"));
  }
  hp.rms_eps = eps;

  const std::string embd_name = TensorName(TensorKind::kTokenEmbd, -1);
  DPL_ASSIGN_OR_RETURN(const TensorView* embd, model.Require(embd_name));
  if (embd->ne[0] != static_cast<uint64_t>(hp.n_embd) || embd->ne[1] == 0 ||
      embd->ne[1] > static_cast<uint64_t>(kMaxVocab)) {
    return absl::InvalidArgumentError(absl::StrCat(embd_name, " has shape [", embd->ne[0], ", ",
                                                   embd->ne[1], "], expected [", hp.n_embd,
                                                   ", n_vocab] with n_vocab in 1..", kMaxVocab));
  }
  hp.n_vocab = static_cast<int64_t>(embd->ne[1]);
  return hp;
}

std::string HparamsDebugString(const Hparams& hp) {
  return absl::StrFormat(
      "arch=%s n_embd=%d n_layer=%d n_ff=%d n_head=%d n_head_kv=%d head_dim=%d n_rot=%d "
      "n_vocab=%d n_ctx_train=%d rope_base=%g rope_scale=%g rms_eps=%g rope=%s swa=%d qk_norm=%d%s",
      hp.arch_name, hp.n_embd, hp.n_layer, hp.n_ff, hp.n_head, hp.n_head_kv, hp.head_dim,
      hp.n_rot, hp.n_vocab, hp.n_ctx_train, hp.rope_freq_base, hp.rope_freq_scale, hp.rms_eps,
      hp.rope_style == RopeStyle::kNeox ? "neox" : "adjacent", hp.sliding_window, hp.qk_norm,
      hp.moe() ? absl::StrFormat(" experts=%d used=%d ff_exp=%d", hp.n_expert, hp.n_expert_used,
                                 hp.n_ff_exp)
               : "");
}

std::string TensorName(TensorKind kind, int layer) {
  const auto blk = [layer](absl::string_view base) { return absl::StrCat("blk.", layer, ".", base); };
  switch (kind) {
    case TensorKind::kTokenEmbd: return "token_embd.weight";
    case TensorKind::kOutputNorm: return "output_norm.weight";
    case TensorKind::kOutput: return "output.weight";
    case TensorKind::kRopeFreqs: return "rope_freqs.weight";
    case TensorKind::kAttnNorm: return blk("attn_norm.weight");
    case TensorKind::kAttnQ: return blk("attn_q.weight");
    case TensorKind::kAttnK: return blk("attn_k.weight");
    case TensorKind::kAttnV: return blk("attn_v.weight");
    case TensorKind::kAttnOutput: return blk("attn_output.weight");
    case TensorKind::kAttnQBias: return blk("attn_q.bias");
    case TensorKind::kAttnKBias: return blk("attn_k.bias");
    case TensorKind::kAttnVBias: return blk("attn_v.bias");
    case TensorKind::kAttnOutputBias: return blk("attn_output.bias");
    case TensorKind::kFfnNorm: return blk("ffn_norm.weight");
    case TensorKind::kFfnGate: return blk("ffn_gate.weight");
    case TensorKind::kFfnUp: return blk("ffn_up.weight");
    case TensorKind::kFfnDown: return blk("ffn_down.weight");
    case TensorKind::kAttnQNorm: return blk("attn_q_norm.weight");
    case TensorKind::kAttnKNorm: return blk("attn_k_norm.weight");
    case TensorKind::kFfnGateInp: return blk("ffn_gate_inp.weight");
    case TensorKind::kFfnGateExps: return blk("ffn_gate_exps.weight");
    case TensorKind::kFfnUpExps: return blk("ffn_up_exps.weight");
    case TensorKind::kFfnDownExps: return blk("ffn_down_exps.weight");
  }
  return "";
}

std::vector<TensorSpec> TensorSpecs(const Hparams& hp, bool tied) {
  const ArchInfo& arch = InfoOf(hp.arch);
  const int64_t E = hp.n_embd, F = hp.n_ff, Q = hp.q_dim(), KV = hp.kv_dim(), V = hp.n_vocab;
  std::vector<TensorSpec> specs;
  const auto matrix = [&specs](TensorKind kind, int layer, int64_t n_cols, int64_t n_rows) {
    specs.push_back({kind, layer, TensorName(kind, layer), n_cols, n_rows, true, false});
  };
  const auto vector = [&specs](TensorKind kind, int layer, int64_t n, bool optional) {
    specs.push_back({kind, layer, TensorName(kind, layer), n, 1, false, optional});
  };
  const auto experts = [&specs, &hp](TensorKind kind, int layer, int64_t n_cols, int64_t n_rows) {
    specs.push_back({kind, layer, TensorName(kind, layer), n_cols, n_rows, true, false, hp.n_expert});
  };
  matrix(TensorKind::kTokenEmbd, -1, E, V);
  for (int il = 0; il < hp.n_layer; ++il) {
    vector(TensorKind::kAttnNorm, il, E, false);
    matrix(TensorKind::kAttnQ, il, E, Q);
    matrix(TensorKind::kAttnK, il, E, KV);
    matrix(TensorKind::kAttnV, il, E, KV);
    matrix(TensorKind::kAttnOutput, il, Q, E);
    vector(TensorKind::kFfnNorm, il, E, false);
    if (hp.moe()) {
      matrix(TensorKind::kFfnGateInp, il, E, hp.n_expert);
      experts(TensorKind::kFfnGateExps, il, E, hp.n_ff_exp);
      experts(TensorKind::kFfnUpExps, il, E, hp.n_ff_exp);
      experts(TensorKind::kFfnDownExps, il, hp.n_ff_exp, E);
    } else {
      matrix(TensorKind::kFfnGate, il, E, F);
      matrix(TensorKind::kFfnUp, il, E, F);
      matrix(TensorKind::kFfnDown, il, F, E);
    }
    if (arch.qkv_bias) {
      vector(TensorKind::kAttnQBias, il, Q, true);
      vector(TensorKind::kAttnKBias, il, KV, true);
      vector(TensorKind::kAttnVBias, il, KV, true);
    }
    if (arch.output_bias) vector(TensorKind::kAttnOutputBias, il, E, true);
    if (arch.qk_norm) {
      vector(TensorKind::kAttnQNorm, il, hp.head_dim, false);
      vector(TensorKind::kAttnKNorm, il, hp.head_dim, false);
    }
  }
  vector(TensorKind::kOutputNorm, -1, E, false);
  if (arch.rope_freqs) vector(TensorKind::kRopeFreqs, -1, hp.n_rot / 2, true);
  if (!tied) matrix(TensorKind::kOutput, -1, E, V);
  return specs;
}

absl::StatusOr<ModelDesc> BindModel(const formats::ModelFile& model) {
  ModelDesc d;
  DPL_ASSIGN_OR_RETURN(d.hp, ReadHparams(model));
  DPL_RETURN_IF_ERROR(CheckLayerCount(model, d.hp));
  d.tied = model.Find(TensorName(TensorKind::kOutput, -1)) == nullptr;
  d.layers.resize(d.hp.n_layer);
  const std::vector<TensorSpec> specs = TensorSpecs(d.hp, d.tied);
  for (const TensorSpec& s : specs) {
    const TensorView* t = model.Find(s.name);
    if (t == nullptr) {
      if (s.optional) continue;
      return absl::NotFoundError(absl::StrCat("tensor '", s.name, "' is missing"));
    }
    DPL_RETURN_IF_ERROR(CheckTensor(s, *t));
    *Slot(d, s) = t;
    // What a decode step reads: not the embedding table (one row per token)
    // unless it is also the head, and not rope_freqs (read once, at load).
    if ((s.kind != TensorKind::kTokenEmbd || d.tied) && s.kind != TensorKind::kRopeFreqs) {
      d.bytes_per_token += s.n_mats > 1 ? t->n_bytes / static_cast<uint64_t>(s.n_mats) *
                                              static_cast<uint64_t>(d.hp.n_expert_used)
                                        : t->n_bytes;
    }
    if (s.matrix && s.layer >= 0) {
      d.prompt_macs_per_token += static_cast<uint64_t>(s.n_rows) * static_cast<uint64_t>(s.n_cols) *
                                 static_cast<uint64_t>(s.n_mats > 1 ? d.hp.n_expert_used : 1);
    }
  }
  if (d.tied) d.output = d.token_embd;
  DPL_RETURN_IF_ERROR(CheckNoOtherTensors(model, specs, d.hp));
  return d;
}

namespace {

// GpuHasKernelFor's list, in ggml's id order.
constexpr formats::GgmlType kGpuTypes[] = {
    formats::GgmlType::kF32,  formats::GgmlType::kF16,    formats::GgmlType::kQ4_0,
    formats::GgmlType::kQ4_1, formats::GgmlType::kQ5_0,   formats::GgmlType::kQ5_1,
    formats::GgmlType::kQ8_0, formats::GgmlType::kQ2_K,   formats::GgmlType::kQ3_K,
    formats::GgmlType::kQ4_K, formats::GgmlType::kQ5_K,   formats::GgmlType::kQ6_K,
    formats::GgmlType::kIQ4_NL, formats::GgmlType::kIQ4_XS, formats::GgmlType::kBF16,
};

// GpuHasExpertKernelFor's list (kernels/matvec/moe.h; runtime/cuda:
// gpu_types_test holds it to kernels::MatVecMoeSupports).
constexpr formats::GgmlType kGpuExpertTypes[] = {
    formats::GgmlType::kQ8_0, formats::GgmlType::kQ4_K, formats::GgmlType::kQ5_K,
    formats::GgmlType::kQ6_K,
};

}  // namespace

bool GpuHasKernelFor(formats::GgmlType type) {
  return std::find(std::begin(kGpuTypes), std::end(kGpuTypes), type) != std::end(kGpuTypes);
}

bool GpuHasExpertKernelFor(formats::GgmlType type) {
  return std::find(std::begin(kGpuExpertTypes), std::end(kGpuExpertTypes), type) !=
         std::end(kGpuExpertTypes);
}

absl::Status CheckGpuArch(const ModelDesc& desc) {
  if (!desc.hp.moe()) return absl::OkStatus();
  for (const LayerTensors& L : desc.layers) {
    for (const formats::TensorView* t : {L.gate_exps, L.up_exps, L.down_exps}) {
      if (t == nullptr || GpuHasExpertKernelFor(t->type)) continue;
      std::vector<absl::string_view> names;
      for (formats::GgmlType e : kGpuExpertTypes) names.push_back(formats::TraitsOf(e).name);
      return absl::UnimplementedError(absl::StrCat(
          "tensor '", t->name, "' is ", formats::TraitsOf(t->type).name,
          ", which the CUDA runtime has no expert kernel for (its mixture-of-experts layers run ",
          absl::StrJoin(names, ", "), " experts); the CPU reference runs it (dpl-run --device cpu)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGpuType(absl::string_view tensor, formats::GgmlType type) {
  if (GpuHasKernelFor(type)) return absl::OkStatus();
  std::vector<absl::string_view> names;
  for (formats::GgmlType t : kGpuTypes) names.push_back(formats::TraitsOf(t).name);
  return absl::UnimplementedError(absl::StrCat("tensor '", tensor, "' is ",
                                               formats::TraitsOf(type).name,
                                               ", which the CUDA runtime has no kernel for (it runs ",
                                               absl::StrJoin(names, ", "), ")"));
}

}  // namespace dpl::model
