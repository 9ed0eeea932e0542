// dpl-synth: random-weight GGUF models with the tensor set, shapes, metadata
// and type mix (Q4_K_M by default, or another of llama.cpp's --ftype mixes)
// that llama.cpp gives real checkpoints, so that file sizes, bytes per token
// and kernel shapes match the real thing without any download. Quantized
// blocks are generated directly (random quants, scales chosen for a
// dequantized std of about 0.5/sqrt(row length)); the output is a pure
// function of (preset, options, seed), whatever the thread count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/ggml_types.h"
#include "formats/gguf.h"
#include "formats/metadata.h"
#include "model/model.h"

namespace dpl::synth {

// Llama 3.1's "llama3" RoPE scaling (config.json's rope_scaling), which
// llama.cpp's convert_hf_to_gguf.py stores as a rope_freqs.weight tensor of
// one factor per rotated pair (Llama3RopeFactors).
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  uint32_t original_context = 8192;  // original_max_position_embeddings
};

// A model shape. Names and key names follow llama.cpp (`{arch}.*`).
struct Preset {
  std::string name;         // "qwen2.5-7b", "tiny-llama", ...
  model::Arch arch = model::Arch::kLlama;  // general.architecture
  uint32_t n_embd = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;    // usually n_embd / n_head
  uint32_t n_ff = 0;
  uint32_t n_vocab = 0;     // used when no vocab file is given
  uint32_t n_ctx = 0;
  float rope_base = 0;
  float rms_eps = 0;
  bool tied = false;        // no output.weight; the lm head is token_embd
  bool qkv_bias = false;    // qwen2: attn_{q,k,v}.bias
  uint32_t sliding_window = 0;  // {arch}.attention.sliding_window; 0: not written
  std::optional<Llama3RopeScaling> llama3_rope;  // writes rope_freqs.weight
  // Mixture of experts (qwen3moe): expert_count, expert_used_count and
  // expert_feed_forward_length; 0 for dense presets.
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint32_t n_ff_exp = 0;
  std::string note;         // one line for --list
};

// Every preset, in --list order.
const std::vector<Preset>& Presets();
// The preset of that name, or NotFound listing the known names.
absl::StatusOr<Preset> FindPreset(std::string_view name);

// rope_freqs.weight for a rotary width of n_rot: n_rot / 2 factors, 1 for the
// fast pairs, `factor` for the slow ones and a smooth blend between them, as
// convert_hf_to_gguf.py computes them (LlamaModel.generate_extra_tensors).
std::vector<float> Llama3RopeFactors(const Llama3RopeScaling& scaling, double rope_base,
                                     uint32_t n_rot);

// What the matrices become: llama.cpp's `llama-quantize` file types, each
// with its LLAMA_FTYPE id (llama.h), which dpl-synth writes as
// general.file_type.
enum class Ftype : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 7,
  kQ5_0 = 8,
  kQ5_1 = 9,
  kQ2_K = 10,
  kQ3_K_M = 12,
  kQ4_K_M = 15,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kIQ4_NL = 25,
  kIQ4_XS = 30,
  kBF16 = 32,
};
// Every ftype, in --help order (q4_k_m, the default, first).
const std::vector<Ftype>& Ftypes();
// "q4_k_m, q5_k_m, ...": the names of Ftypes(), for help and error texts.
std::string KnownFtypeNames();
// A name of FtypeName's (any case: "Q4_K_M" too), or InvalidArgument
// listing the known ones.
absl::StatusOr<Ftype> ParseFtype(std::string_view name);
std::string_view FtypeName(Ftype ftype);
// The type most matrices get (llama.cpp's llama_ftype_get_default_type).
formats::GgmlType FtypeBaseType(Ftype ftype);

// What a tensor holds; decides how its values are drawn.
enum class TensorRole {
  kMatrix,  // random weights, std 0.5/sqrt(row length)
  kNorm,    // RMSNorm weights around 1
  kBias,    // small random biases
  kFixed,   // exactly PlannedTensor::values (rope_freqs.weight)
};

struct PlannedTensor {
  formats::GgufTensorSpec spec;  // name, ne (ne[0] = row length), type
  TensorRole role = TensorRole::kMatrix;
  std::vector<float> values;     // kFixed only: every element, row after row
};

// What llama.cpp's choice of a matrix's type depends on besides the ftype,
// the matrix's kind, its layer and its row length.
struct MixShape {
  uint32_t n_layer = 0;
  uint32_t n_gqa = 1;   // n_head / n_head_kv
  bool tied = false;    // no output.weight: token_embd is the lm head
  uint32_t n_expert = 0;  // llama.cpp bumps attention types of 8-expert models
};

// llama.cpp's type for one weight matrix of an `ftype` file
// (llama_tensor_get_type in src/llama-quant.cpp, without an imatrix); see
// synth.cc for the rules modelled. f32, f16 and bf16 put every matrix in
// that type.
formats::GgmlType MatrixType(Ftype ftype, model::TensorKind kind, uint32_t layer,
                             uint64_t row_len, const MixShape& shape);

// True for the layers llama.cpp gives more bits:
// i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2.
bool UseMoreBits(uint32_t layer, uint32_t n_layer);

// The tensor list of model::TensorSpecs (names, shapes, llama.cpp's order)
// with, of the optional tensors, the QKV biases and rope_freqs.weight where
// the preset has them, each matrix of MatrixType's type. Errors on shapes
// that the chosen types cannot hold (row length not a whole number of blocks).
absl::StatusOr<std::vector<PlannedTensor>> PlanTensors(const Preset& p, Ftype ftype);

// Data section bytes of a plan: every tensor padded to `alignment`.
uint64_t PlanDataBytes(const std::vector<PlannedTensor>& plan,
                       uint64_t alignment = formats::kGgufDefaultAlignment);

// The tokenizer of a vocab-only GGUF: every `tokenizer.*` key in file order,
// and n_vocab = length of tokenizer.ggml.tokens.
struct Vocab {
  formats::Metadata tokenizer;
  uint32_t n_vocab = 0;
};
absl::StatusOr<Vocab> LoadVocab(const std::string& path);

// The metadata of a synthetic model, keys in the order of llama.cpp's files
// (general.architecture, tokenizer.*, [{arch}.vocab_size], general.name,
// hyper-parameters, [key_length, value_length], [sliding_window],
// general.file_type). Without a vocab:
// tokenizer.ggml.model = "none" and {arch}.vocab_size = p.n_vocab.
formats::Metadata BuildMetadata(const Preset& p, Ftype ftype, const Vocab* vocab);

// Fills `n_rows` rows of a tensor, starting at row `row_begin`, into `out`
// (n_rows * row_bytes bytes). Deterministic in (seed, tensor name, rows):
// every chunk of rows seeds its own generator, so any split gives the same
// bytes as long as the chunk grid is the same (see kRowsChunkBytes).
void FillRows(const PlannedTensor& t, uint64_t seed, uint64_t row_begin, uint64_t n_rows,
              uint8_t* out);

// Target size of one generation chunk; chunk boundaries are a function of the
// tensor shape only, so the output does not depend on the thread count.
inline constexpr uint64_t kChunkBytes = 4ull << 20;

// Generator threads: 0 (all cores) or 1..kMaxThreads.
inline constexpr unsigned kMaxThreads = 1024;

struct SynthOptions {
  Preset preset;                      // after --tied / --no-vocab overrides
  Ftype ftype = Ftype::kQ4_K_M;
  std::optional<std::string> vocab_path;
  uint64_t seed = 0;
  unsigned threads = 0;               // 0: hardware concurrency
};

struct SynthResult {
  uint64_t n_tensors = 0;
  uint64_t file_bytes = 0;
  double seconds = 0;
};

// Writes the model to `out_path` through formats::OutputFile: builds the
// header, generates the tensors in parallel and writes them into a hidden
// temporary file, then fsync + rename. On an error or a signal the temporary
// file is removed and `out_path` is left untouched; `out_path` being the
// vocab file, a read-only file or not a regular file is refused.
absl::StatusOr<SynthResult> WriteSyntheticModel(const SynthOptions& opts,
                                                const std::string& out_path);

}  // namespace dpl::synth
