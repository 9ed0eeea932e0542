// Hyperparameters of a llama-family decoder (llama, qwen2, qwen3, qwen3moe), as read from
// GGUF-style metadata (identical keys in GGUF and .dpl files) by
// model::ReadHparams (model/model.h).
//
// Header-only and dependency-free on purpose: CUDA translation units include
// it, so it must not pull in absl or formats/.
#pragma once

#include <cstdint>
#include <string>

namespace dpl::model {

// One row of the architecture table in model/model.cc each.
enum class Arch { kLlama, kQwen2, kQwen3, kQwen3Moe };

enum class RopeStyle {
  kAdjacent,  // llama: rotates pairs (x[2i], x[2i+1])
  kNeox,      // qwen2, qwen3: rotates pairs (x[i], x[i + n_rot/2])
};

struct Hparams {
  Arch arch = Arch::kLlama;
  std::string arch_name;    // general.architecture: "llama", "qwen2", "qwen3", "qwen3moe"
  int64_t n_embd = 0;       // {arch}.embedding_length
  int64_t n_layer = 0;      // {arch}.block_count
  int64_t n_ff = 0;         // {arch}.feed_forward_length
  int64_t n_head = 0;       // {arch}.attention.head_count
  int64_t n_head_kv = 0;    // {arch}.attention.head_count_kv (default n_head)
  int64_t head_dim = 0;     // {arch}.attention.key_length (default n_embd / n_head)
  int64_t n_rot = 0;        // {arch}.rope.dimension_count (default head_dim)
  int64_t n_vocab = 0;      // token_embd.weight ne[1]
  int64_t n_ctx_train = 0;  // {arch}.context_length (0 when absent)
  double rope_freq_base = 10000.0;  // {arch}.rope.freq_base
  double rope_freq_scale = 1.0;     // 1 / {arch}.rope.scaling.factor for "linear"
  double rms_eps = 1e-5;            // {arch}.attention.layer_norm_rms_epsilon
  RopeStyle rope_style = RopeStyle::kAdjacent;  // from the architecture
  // {arch}.attention.sliding_window (0 when absent: full causal attention).
  // With W > 0 every layer attends to the last W positions only: query
  // position p sees keys p - W + 1 .. p (llama.cpp's LLAMA_SWA_TYPE_STANDARD,
  // as Mistral 7B v0.1 was trained).
  int64_t sliding_window = 0;
  // Per-head RMSNorm of q and k before RoPE (qwen3: blk.N.attn_{q,k}_norm).
  bool qk_norm = false;
  // Mixture of experts (qwen3moe; 0 for dense models): each layer's
  // feed-forward is n_expert experts of width n_ff_exp, of which a router
  // picks n_expert_used per token ({arch}.expert_count,
  // .expert_used_count, .expert_feed_forward_length).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;

  int64_t q_dim() const { return n_head * head_dim; }      // width of Wq's output
  int64_t kv_dim() const { return n_head_kv * head_dim; }  // width of Wk's, Wv's output
  bool moe() const { return n_expert > 0; }
};

}  // namespace dpl::model
