// The model shapes dpl-synth knows. Real shapes follow the published configs
// (config.json of Qwen2.5, Qwen3, Meta-Llama-3/3.1 and Mistral-7B-v0.1); the
// small ones are those of the llama.cpp oracle files in shared/oracle (see
// its README table).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/synth.h"

namespace dpl::synth {
namespace {

Preset Qwen2(std::string name, uint32_t n_embd, uint32_t n_layer, uint32_t n_head,
             uint32_t n_head_kv, uint32_t head_dim, uint32_t n_ff, uint32_t n_vocab,
             uint32_t n_ctx, bool tied, std::string note) {
  Preset p;
  p.name = std::move(name);
  p.arch = model::Arch::kQwen2;
  p.n_embd = n_embd;
  p.n_layer = n_layer;
  p.n_head = n_head;
  p.n_head_kv = n_head_kv;
  p.head_dim = head_dim;
  p.n_ff = n_ff;
  p.n_vocab = n_vocab;
  p.n_ctx = n_ctx;
  p.rope_base = 1000000.0f;
  p.rms_eps = 1e-6f;
  p.tied = tied;
  p.qkv_bias = true;
  p.note = std::move(note);
  return p;
}

// qwen3: no biases, per-head q/k RMSNorm (model/model.cc), head_dim given
// apart from n_embd / n_head; rope base 1e6 and eps 1e-6 in every Qwen3.
Preset Qwen3(std::string name, uint32_t n_embd, uint32_t n_layer, uint32_t n_head,
             uint32_t n_head_kv, uint32_t head_dim, uint32_t n_ff, uint32_t n_vocab,
             uint32_t n_ctx, bool tied, std::string note) {
  Preset p = Qwen2(std::move(name), n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab,
                   n_ctx, tied, std::move(note));
  p.arch = model::Arch::kQwen3;
  p.qkv_bias = false;
  return p;
}

// qwen3moe: Qwen3 with a mixture of experts in every layer.
Preset Qwen3Moe(std::string name, uint32_t n_embd, uint32_t n_layer, uint32_t n_head,
                uint32_t n_head_kv, uint32_t head_dim, uint32_t n_ff, uint32_t n_expert,
                uint32_t n_expert_used, uint32_t n_ff_exp, uint32_t n_vocab, uint32_t n_ctx,
                std::string note) {
  Preset p = Qwen3(std::move(name), n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab,
                   n_ctx, /*tied=*/false, std::move(note));
  p.arch = model::Arch::kQwen3Moe;
  p.n_expert = n_expert;
  p.n_expert_used = n_expert_used;
  p.n_ff_exp = n_ff_exp;
  return p;
}

Preset Llama(std::string name, uint32_t n_embd, uint32_t n_layer, uint32_t n_head,
             uint32_t n_head_kv, uint32_t n_ff, uint32_t n_vocab, uint32_t n_ctx,
             std::string note) {
  Preset p;
  p.name = std::move(name);
  p.arch = model::Arch::kLlama;
  p.n_embd = n_embd;
  p.n_layer = n_layer;
  p.n_head = n_head;
  p.n_head_kv = n_head_kv;
  p.head_dim = n_embd / n_head;
  p.n_ff = n_ff;
  p.n_vocab = n_vocab;
  p.n_ctx = n_ctx;
  p.rope_base = 500000.0f;
  p.rms_eps = 1e-5f;
  p.tied = false;
  p.qkv_bias = false;
  p.note = std::move(note);
  return p;
}

// Llama 3.1: Llama 3's shape with rope_freqs.weight from its rope_scaling
// ("llama3": factor 8, low_freq_factor 1, high_freq_factor 4, original
// context 8192) and a 131072 context.
Preset Llama31(std::string name, uint32_t n_embd, uint32_t n_layer, uint32_t n_head,
               uint32_t n_head_kv, uint32_t n_ff, uint32_t n_vocab, std::string note) {
  Preset p = Llama(std::move(name), n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, 131072,
                   std::move(note));
  p.llama3_rope = Llama3RopeScaling{8.0, 1.0, 4.0, 8192};
  return p;
}

// Mistral-7B-v0.1 as llama.cpp files it: arch llama, rope base 10000, every
// layer attending to the last 4096 positions (sliding_window).
Preset Mistral(std::string name, uint32_t n_embd, uint32_t n_layer, uint32_t n_head,
               uint32_t n_head_kv, uint32_t n_ff, uint32_t n_vocab, uint32_t n_ctx,
               uint32_t window, std::string note) {
  Preset p = Llama(std::move(name), n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx,
                   std::move(note));
  p.rope_base = 10000.0f;
  p.sliding_window = window;
  return p;
}

// The real shapes, checked against each model's config.json (Hugging Face):
//   Qwen/Qwen3-8B:  hidden 4096, 36 layers, 32 heads, 8 kv heads, head_dim
//     128, intermediate 12288, vocab 151936, rope_theta 1e6, rms_norm_eps
//     1e-6, max_position_embeddings 40960, tie_word_embeddings false;
//   Qwen/Qwen3-30B-A3B: hidden 2048, 48 layers, 32 heads, 4 kv heads,
//     head_dim 128, intermediate 6144, 128 experts, 8 a token, expert
//     intermediate 768, vocab 151936, rope_theta 1e6, eps 1e-6, 40960
//     positions, untied;
//   Qwen/Qwen3-14B: hidden 5120, 40 layers, 40 heads, 8 kv heads, head_dim
//     128, intermediate 17408, vocab 151936, the rest as 8B;
//   meta-llama/Llama-3.1-8B: hidden 4096, 32 layers, 32 / 8 heads,
//     intermediate 14336, vocab 128256, rope_theta 500000, eps 1e-5, max
//     positions 131072, rope_scaling llama3 (8, 1, 4, 8192), untied;
//   mistralai/Mistral-7B-v0.1: hidden 4096, 32 layers, 32 / 8 heads,
//     intermediate 14336, vocab 32000, rope_theta 10000, eps 1e-5, max
//     positions 32768, sliding_window 4096, untied.
std::vector<Preset> MakePresets() {
  return {
      Qwen2("qwen2.5-0.5b", 896, 24, 14, 2, 64, 4864, 151936, 32768, /*tied=*/true,
            "Qwen2.5-0.5B shapes (tied; 896-wide rows take 32-weight fallbacks)"),
      Qwen2("qwen2.5-7b", 3584, 28, 28, 4, 128, 18944, 152064, 32768, /*tied=*/false,
            "Qwen2.5-7B shapes (llama.cpp Q4_K_M: 4.36 GiB)"),
      Qwen2("qwen2.5-14b", 5120, 48, 40, 8, 128, 13824, 152064, 32768, /*tied=*/false,
            "Qwen2.5-14B shapes (llama.cpp Q4_K_M: 8.36 GiB)"),
      Qwen3("qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, 40960, /*tied=*/false,
            "Qwen3-8B shapes (llama.cpp Q4_K_M: 4.68 GiB)"),
      Qwen3("qwen3-14b", 5120, 40, 40, 8, 128, 17408, 151936, 40960, /*tied=*/false,
            "Qwen3-14B shapes"),
      Qwen3Moe("qwen3-30b-a3b", 2048, 48, 32, 4, 128, 6144, 128, 8, 768, 151936, 40960,
               "Qwen3-30B-A3B shapes (128 experts, 8 a token, expert ffn 768)"),
      Llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, "Meta-Llama-3-8B shapes"),
      Llama31("llama3.1-8b", 4096, 32, 32, 8, 14336, 128256,
              "Llama-3.1-8B shapes, rope_freqs.weight (llama3 scaling)"),
      Mistral("mistral-7b", 4096, 32, 32, 8, 14336, 32000, 32768, 4096,
              "Mistral-7B-v0.1 shapes (arch llama, sliding_window 4096)"),
      Llama("tiny-llama", 256, 2, 4, 2, 512, 2048, 4096,
            "test shape: 256 / 2 layers / 4 (2) heads / ffn 512"),
      Qwen2("tiny-qwen2", 256, 2, 4, 2, 64, 512, 2048, 4096, /*tied=*/true,
            "test shape of oracle tiny-qwen2-vocab-q4km (use --vocab for its tokenizer)"),
      Qwen3("tiny-qwen3", 256, 2, 4, 2, 128, 512, 2048, 4096, /*tied=*/true,
            "test shape: qwen3, 256 / 2 layers / 4 (2) heads of 128 / ffn 512"),
      Qwen2("small-qwen2", 512, 3, 4, 2, 128, 1536, 2048, 4096, /*tied=*/true,
            "test shape of oracle small-qwen2-q4km"),
      Llama("small-llama", 512, 4, 8, 2, 1792, 2048, 4096, "test shape of oracle small-llama-q4km"),
      Qwen3("small-qwen3", 512, 3, 8, 2, 128, 1536, 2048, 40960, /*tied=*/true,
            "test shape of oracle small-qwen3-q4km"),
      Llama31("small-llama31", 512, 3, 4, 2, 1536, 2048, "test shape of oracle small-llama31-q4km"),
      Qwen3Moe("mini-qwen3moe", 512, 2, 8, 2, 64, 1024, 8, 2, 256, 2048, 40960,
               "test shape of oracle mini-qwen3moe-q4km (8 experts, 2 a token)"),
      Llama("mini-llama", 512, 2, 8, 2, 1024, 2048, 4096,
            "test shape of the oracle mini-llama-* files (llama-quantize's type mixes)"),
      Llama("ora-llama", 256, 2, 4, 2, 768, 2048, 4096,
            "test shape of oracle ora-llama-f32 (--ftype f32)"),
      Qwen2("ora-qwen2", 256, 2, 2, 1, 128, 768, 2048, 4096, /*tied=*/true,
            "test shape of oracle ora-qwen2-f32 (--ftype f32)"),
      // The smallest file with every Q4_K_M tensor kind (~0.3 MB): fuzzer seeds.
      Qwen2("micro-qwen2", 256, 1, 4, 2, 64, 256, 256, 256, /*tied=*/false,
            "fuzzer seed shape: 256 / 1 layer / 4 (2) heads / ffn 256 / vocab 256"),
  };
}

}  // namespace

const std::vector<Preset>& Presets() {
  static const std::vector<Preset>* presets = new std::vector<Preset>(MakePresets());
  return *presets;
}

absl::StatusOr<Preset> FindPreset(std::string_view name) {
  std::vector<std::string> names;
  for (const Preset& p : Presets()) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  return absl::NotFoundError(absl::StrCat("unknown preset '", std::string(name),
                                          "' (known: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace dpl::synth
