#include "runtime/reference/hparams.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dpl::reference {
namespace {

// Reads a positive integer key; `dflt` < 0 means the key is required.
absl::StatusOr<int64_t> PositiveInt(const formats::Metadata& meta, const std::string& key,
                                    int64_t dflt) {
  uint64_t v = 0;
  if (dflt < 0) {
    absl::StatusOr<uint64_t> r = meta.GetUint(key);
    if (!r.ok()) return r.status();
    v = *r;
  } else {
    absl::StatusOr<uint64_t> r = meta.GetUintOr(key, static_cast<uint64_t>(dflt));
    if (!r.ok()) return r.status();
    v = *r;
  }
  if (v == 0 || v > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", key, " = ", v, " is out of range"));
  }
  return static_cast<int64_t>(v);
}

}  // namespace

absl::StatusOr<Hparams> ReadHparams(const formats::ModelFile& model) {
  const formats::Metadata& meta = model.metadata();
  Hparams hp;
  absl::StatusOr<absl::string_view> arch = meta.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  hp.arch = std::string(*arch);
  if (hp.arch == "llama") {
    hp.rope_style = RopeStyle::kAdjacent;
  } else if (hp.arch == "qwen2") {
    hp.rope_style = RopeStyle::kNeox;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "unsupported architecture '", hp.arch, "' (the CPU reference runs llama and qwen2)"));
  }
  const std::string p = hp.arch + ".";

#define DPL_ASSIGN_OR_RETURN_INT(lhs, expr) \
  do {                                      \
    absl::StatusOr<int64_t> r_ = (expr);    \
    if (!r_.ok()) return r_.status();       \
    lhs = *r_;                              \
  } while (0)
  DPL_ASSIGN_OR_RETURN_INT(hp.n_embd, PositiveInt(meta, p + "embedding_length", -1));
  DPL_ASSIGN_OR_RETURN_INT(hp.n_layer, PositiveInt(meta, p + "block_count", -1));
  DPL_ASSIGN_OR_RETURN_INT(hp.n_ff, PositiveInt(meta, p + "feed_forward_length", -1));
  DPL_ASSIGN_OR_RETURN_INT(hp.n_head, PositiveInt(meta, p + "attention.head_count", -1));
  DPL_ASSIGN_OR_RETURN_INT(hp.n_head_kv,
                           PositiveInt(meta, p + "attention.head_count_kv", hp.n_head));
  if (hp.n_head % hp.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        p, "attention.head_count = ", hp.n_head, " is not divisible by ", p,
        "attention.head_count_kv = ", hp.n_head_kv));
  }
  int64_t dflt_head_dim = hp.n_embd / hp.n_head;
  if (meta.Find(p + "attention.key_length") == nullptr && hp.n_embd % hp.n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "embedding_length = ", hp.n_embd, " is not divisible by ", p,
                     "attention.head_count = ", hp.n_head, " and no key_length is given"));
  }
  DPL_ASSIGN_OR_RETURN_INT(hp.head_dim,
                           PositiveInt(meta, p + "attention.key_length", dflt_head_dim));
  int64_t value_length = 0;
  DPL_ASSIGN_OR_RETURN_INT(value_length,
                           PositiveInt(meta, p + "attention.value_length", hp.head_dim));
  if (value_length != hp.head_dim) {
    return absl::UnimplementedError(absl::StrCat(p, "attention.value_length = ", value_length,
                                                 " differs from key_length = ", hp.head_dim));
  }
  if (hp.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head size ", hp.head_dim, " is odd (RoPE rotates pairs)"));
  }
  DPL_ASSIGN_OR_RETURN_INT(hp.n_rot, PositiveInt(meta, p + "rope.dimension_count", hp.head_dim));
  if (hp.n_rot % 2 != 0 || hp.n_rot > hp.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.dimension_count = ", hp.n_rot,
                                                   " must be even and <= head size ",
                                                   hp.head_dim));
  }
  {
    absl::StatusOr<uint64_t> ctx = meta.GetUintOr(p + "context_length", 0);
    if (!ctx.ok()) return ctx.status();
    hp.n_ctx_train = static_cast<int64_t>(*ctx);
  }
#undef DPL_ASSIGN_OR_RETURN_INT

  {
    absl::StatusOr<uint64_t> experts = meta.GetUintOr(p + "expert_count", 0);
    if (!experts.ok()) return experts.status();
    if (*experts != 0) {
      return absl::UnimplementedError(
          absl::StrCat(p, "expert_count = ", *experts, ": mixture-of-experts is not supported"));
    }
  }
  absl::StatusOr<double> base = meta.GetFloatOr(p + "rope.freq_base", 10000.0);
  if (!base.ok()) return base.status();
  if (!(*base > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(p, "rope.freq_base = ", *base));
  }
  hp.rope_freq_base = *base;
  absl::StatusOr<double> eps = meta.GetFloat(p + "attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.status();
  if (!(*eps > 0 && *eps < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, "attention.layer_norm_rms_epsilon = ", *eps, " is out of range"));
  }
  hp.rms_eps = *eps;

  // RoPE scaling as llama.cpp reads it: the type defaults to linear, whose
  // factor (rope.scaling.factor, or the older rope.scale_linear; 0 means 1)
  // divides every rotation angle. "none" ignores the factor.
  std::string scaling = "linear";
  if (meta.Find(p + "rope.scaling.type") != nullptr) {
    absl::StatusOr<absl::string_view> s = meta.GetString(p + "rope.scaling.type");
    if (!s.ok()) return s.status();
    scaling = std::string(*s);
  }
  if (scaling == "linear") {
    const std::string key = meta.Find(p + "rope.scaling.factor") != nullptr
                                ? p + "rope.scaling.factor"
                                : p + "rope.scale_linear";
    absl::StatusOr<double> factor = meta.GetFloatOr(key, 0.0);
    if (!factor.ok()) return factor.status();
    if (*factor < 0 || !(*factor == *factor)) {
      return absl::InvalidArgumentError(absl::StrCat(key, " = ", *factor));
    }
    hp.rope_freq_scale = *factor == 0.0 ? 1.0 : 1.0 / *factor;
  } else if (scaling != "none") {
    return absl::UnimplementedError(
        absl::StrCat(p, "rope.scaling.type '", scaling, "' is not supported (none, linear)"));
  }

  absl::StatusOr<const formats::TensorView*> embd = model.Require("token_embd.weight");
  if (!embd.ok()) return embd.status();
  if ((*embd)->ne[0] != static_cast<uint64_t>(hp.n_embd) || (*embd)->ne[1] == 0 ||
      (*embd)->ne[1] > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("token_embd.weight has shape [",
                                                   (*embd)->ne[0], ", ", (*embd)->ne[1],
                                                   "], expected [", hp.n_embd, ", n_vocab]"));
  }
  hp.n_vocab = static_cast<int64_t>((*embd)->ne[1]);
  return hp;
}

std::string HparamsDebugString(const Hparams& hp) {
  return absl::StrFormat(
      "arch=%s n_embd=%d n_layer=%d n_ff=%d n_head=%d n_head_kv=%d head_dim=%d n_rot=%d "
      "n_vocab=%d n_ctx_train=%d rope_base=%g rope_scale=%g rms_eps=%g rope=%s",
      hp.arch, hp.n_embd, hp.n_layer, hp.n_ff, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot,
      hp.n_vocab, hp.n_ctx_train, hp.rope_freq_base, hp.rope_freq_scale, hp.rms_eps,
      hp.rope_style == RopeStyle::kNeox ? "neox" : "adjacent");
}

}  // namespace dpl::reference
