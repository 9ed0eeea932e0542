// One description of a llama-family decoder: its hyperparameters, the tensor
// set of the file (names, shapes, which are optional) and those tensors bound
// from a formats::ModelFile. The CPU reference, the CUDA decoder, dpl-synth
// and the converter's check all read the model through this package, so a
// tensor name or shape is spelled here and nowhere else.
//
// Adding an architecture is one row of the architecture table (model.cc),
// plus any tensor kinds and math it does not share with llama.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/model_file.h"
#include "model/hparams.h"

namespace dpl::model {

// general.architecture of `arch` ("llama", "qwen2", "qwen3", "qwen3moe").
absl::string_view ArchName(Arch arch);
// The architecture called `name`, or Unimplemented naming it and the
// supported ones.
absl::StatusOr<Arch> ArchFromName(absl::string_view name);

// Reads and validates the hyperparameters. Errors name the key or tensor and
// the offending value: unsupported architecture, missing keys, n_head not
// divisible by n_head_kv, odd head size, unsupported RoPE scaling, MoE, ...
absl::StatusOr<Hparams> ReadHparams(const formats::ModelFile& model);

// One line: "arch=qwen2 n_embd=512 ... rope=neox".
std::string HparamsDebugString(const Hparams& hp);

// Every tensor a decoder file may hold.
enum class TensorKind {
  // Global (layer -1).
  kTokenEmbd,   // token_embd.weight   [n_embd, n_vocab]
  kOutputNorm,  // output_norm.weight  [n_embd]
  kOutput,      // output.weight       [n_embd, n_vocab]; absent when tied
  kRopeFreqs,   // rope_freqs.weight   [n_rot / 2]: llama 3.1 frequency factors
  // Per layer ("blk.N." in front).
  kAttnNorm,        // attn_norm.weight    [n_embd]
  kAttnQ,           // attn_q.weight       [n_embd, q_dim]
  kAttnK,           // attn_k.weight       [n_embd, kv_dim]
  kAttnV,           // attn_v.weight       [n_embd, kv_dim]
  kAttnOutput,      // attn_output.weight  [q_dim, n_embd]
  kAttnQBias,       // attn_q.bias         [q_dim]
  kAttnKBias,       // attn_k.bias         [kv_dim]
  kAttnVBias,       // attn_v.bias         [kv_dim]
  kAttnOutputBias,  // attn_output.bias    [n_embd]
  kFfnNorm,         // ffn_norm.weight     [n_embd]
  kFfnGate,         // ffn_gate.weight     [n_embd, n_ff]
  kFfnUp,           // ffn_up.weight       [n_embd, n_ff]
  kFfnDown,         // ffn_down.weight     [n_ff, n_embd]
  kAttnQNorm,       // attn_q_norm.weight  [head_dim]: qwen3's per-head q RMSNorm
  kAttnKNorm,       // attn_k_norm.weight  [head_dim]: qwen3's per-head k RMSNorm
  // Mixture of experts (qwen3moe), in place of ffn_gate, ffn_up, ffn_down:
  kFfnGateInp,    // ffn_gate_inp.weight   [n_embd, n_expert]: the router
  kFfnGateExps,   // ffn_gate_exps.weight  [n_embd, n_ff_exp, n_expert]
  kFfnUpExps,     // ffn_up_exps.weight    [n_embd, n_ff_exp, n_expert]
  kFfnDownExps,   // ffn_down_exps.weight  [n_ff_exp, n_embd, n_expert]
};

// llama.cpp's GGUF name: "token_embd.weight", "blk.3.attn_q.weight".
// `layer` is ignored for global kinds and must be >= 0 for per-layer ones.
std::string TensorName(TensorKind kind, int layer);

struct TensorSpec {
  TensorKind kind;
  int layer;           // -1: global
  std::string name;    // TensorName(kind, layer)
  int64_t n_cols;      // ne[0]: the row length (a matrix's input width)
  int64_t n_rows;      // ne[1]: a matrix's output width; 1 for vectors
  bool matrix;         // else an f32 vector of n_cols elements
  bool optional;       // the architecture allows it; a file may omit it
  int64_t n_mats = 1;  // ne[2]: the experts of a 3-D expert tensor, each (n_rows, n_cols)
};

// The tensor set of a model of these hyperparameters, in llama.cpp's file
// order: token_embd; per layer attn_norm, attn_q, attn_k, attn_v,
// attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down (a MoE layer: ffn_gate_inp,
// ffn_gate_exps, ffn_up_exps, ffn_down_exps), then the optional biases and
// qwen3's q/k norms; output_norm, rope_freqs (optional), output (unless
// `tied`).
// Optional tensors are listed where the architecture allows them.
std::vector<TensorSpec> TensorSpecs(const Hparams& hp, bool tied);

// One layer's tensors; the biases are null when the file has none.
struct LayerTensors {
  const formats::TensorView* attn_norm = nullptr;  // [n_embd] f32
  const formats::TensorView* wq = nullptr;         // [n_embd, q_dim]
  const formats::TensorView* wk = nullptr;         // [n_embd, kv_dim]
  const formats::TensorView* wv = nullptr;         // [n_embd, kv_dim]
  const formats::TensorView* wo = nullptr;         // [q_dim, n_embd]
  const formats::TensorView* bq = nullptr;         // [q_dim] f32 or null
  const formats::TensorView* bk = nullptr;         // [kv_dim] f32 or null
  const formats::TensorView* bv = nullptr;         // [kv_dim] f32 or null
  const formats::TensorView* bo = nullptr;         // [n_embd] f32 or null
  const formats::TensorView* ffn_norm = nullptr;   // [n_embd] f32
  const formats::TensorView* w_gate = nullptr;     // [n_embd, n_ff]; null in a MoE layer
  const formats::TensorView* w_up = nullptr;       // [n_embd, n_ff]; null in a MoE layer
  const formats::TensorView* w_down = nullptr;     // [n_ff, n_embd]; null in a MoE layer
  const formats::TensorView* router = nullptr;     // [n_embd, n_expert] (MoE) or null
  const formats::TensorView* gate_exps = nullptr;  // [n_embd, n_ff_exp, n_expert] (MoE) or null
  const formats::TensorView* up_exps = nullptr;    // [n_embd, n_ff_exp, n_expert] (MoE) or null
  const formats::TensorView* down_exps = nullptr;  // [n_ff_exp, n_embd, n_expert] (MoE) or null
  const formats::TensorView* q_norm = nullptr;     // [head_dim] f32 (qwen3) or null
  const formats::TensorView* k_norm = nullptr;     // [head_dim] f32 (qwen3) or null
};

// A model file bound to its description. The views point into the
// ModelFile, which must outlive this.
struct ModelDesc {
  Hparams hp;
  const formats::TensorView* token_embd = nullptr;   // [n_embd, n_vocab]
  const formats::TensorView* output_norm = nullptr;  // [n_embd] f32
  const formats::TensorView* output = nullptr;       // [n_embd, n_vocab]; == token_embd when tied
  const formats::TensorView* rope_freqs = nullptr;   // [n_rot / 2] f32, or null
  bool tied = false;                                 // no output.weight in the file
  std::vector<LayerTensors> layers;                  // n_layer of them
  // Bytes of every tensor a decode step reads: all of them but token_embd
  // (one row of it is gathered) unless it is also the lm head, and but
  // rope_freqs (folded into the rotation angles once, at load); of an expert
  // tensor the n_expert_used experts a token reads.
  uint64_t bytes_per_token = 0;
  // Multiply-adds a prompt token costs in the layers' matrix products
  // (rows x cols of each layer matrix, the router included; of an expert
  // tensor the n_expert_used experts a token reads): not the lm head (a
  // prompt pass takes the logits of its last token only) and not attention's
  // scores, which grow with the depth. dpl-bench's prompt rows report
  // 2 x this x tokens/s as the products' TFLOP/s.
  uint64_t prompt_macs_per_token = 0;
};

// ReadHparams, then every TensorSpec looked up and checked: present unless
// optional, shape [n_cols, n_rows] (errors name the tensor and both shapes),
// vectors f32. A tensor the architecture does not have is an error too (it
// would mean semantics no backend implements). Matrix types are not checked:
// each backend checks what it can run.
absl::StatusOr<ModelDesc> BindModel(const formats::ModelFile& model);

// The weight types the CUDA runtime has kernels for (a decode matvec, the
// prompt path's f16 dequantization and the embedding gather): f32, f16, bf16,
// q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs.
// The one list: dpl-convert warns about a tensor of any other type, and its
// closing note (the runtime cannot run this model) says the same.
bool GpuHasKernelFor(formats::GgmlType type);

// OK, or Unimplemented naming the tensor and its type: "tensor 'NAME' is
// iq2_xxs, which the CUDA runtime has no kernel for (it runs f32, f16, ...)".
absl::Status CheckGpuType(absl::string_view tensor, formats::GgmlType type);

// The expert tensor types the CUDA runtime's mixture-of-experts products
// have kernels for (kernels/matvec/moe.h: q4_K, q5_K, q6_K, q8_0, the types
// of Q4_K_M, Q5_K_M, Q6_K and Q8_0 files); a subset of GpuHasKernelFor's.
bool GpuHasExpertKernelFor(formats::GgmlType type);

// Whether the CUDA runtime runs the bound model as a whole, beyond each
// tensor's type (CheckGpuType): a mixture of experts (qwen3moe) runs when
// every expert tensor (ffn_{gate,up,down}_exps) has an expert kernel
// (GpuHasExpertKernelFor); otherwise Unimplemented naming the first such
// tensor, its type, the types that run and --device cpu.
absl::Status CheckGpuArch(const ModelDesc& desc);

}  // namespace dpl::model
