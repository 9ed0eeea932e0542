// dpl-bench: llama-bench's shape for the CUDA runtime.
//   dpl-bench -m MODEL.dpl [-p 512] [-n 128] [-d 0,3254] [-r 3] [-ub 2048] [-o md|json]
//             [-npl 1,4,16,64 [-npp 128] [--shared 2000]]
// Rows, per depth D as llama-bench orders them: ppP (a P-token prompt, in
// chunks of -ub tokens, from an empty cache), tgN (N decode steps, graph
// replays back to back), and ppP @ dD / tgN @ dD (the same after a D-token
// prompt, which is not timed). With -npl, batched rows as
// llama-batched-bench counts S_TG: for each B, B sequences each hold an
// -npp-token prompt (not timed), then N steps decode all B together;
// tgN xB is B * N tokens over the steps' time (aggregate t/s). With
// --shared S, the batched rows are prompt rows instead (llama-batched-bench
// -pps, as the server meets a shared system prompt): B sequences share an
// S-token start (not timed) and ppP xB @ sS times their -npp new tokens each,
// packed into passes of at most -ub tokens.
// Each row: mean and standard deviation of tokens/s over -r runs, plus for
// decode rows the fraction of the HBM roofline: (weight bytes read per step
// / read bandwidth measured in this run) over the measured time per step,
// and for prompt rows the TFLOP/s of the layers' products (2 x
// ModelDesc::prompt_macs_per_token x tokens/s; attention's not counted).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <string>
#include <iostream>
#include <vector>

#include <cuda_profiler_api.h>
#include <cxxopts.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "cli/cli.h"
#include "kernels/cuda_check.h"
#include "kernels/device_tuning.h"
#include "kernels/matvec/matvec_geometry.h"
#include "kernels/membw/membw.h"
#include "runtime/cuda/cuda_decoder.h"

namespace {

struct Row {
  std::string test;
  std::vector<double> tps;  // tokens/s per repetition
  bool decode = false;      // roofline applies to decode rows
  int batch = 1;            // sequences per step (tokens/s counts all of them)
};

std::pair<double, double> MeanStd(const std::vector<double>& v) {
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= v.size();
  for (double x : v) s += (x - m) * (x - m);
  return {m, v.size() > 1 ? std::sqrt(s / (v.size() - 1)) : 0.0};
}

// Deterministic, non-trivial prompt tokens.
std::vector<int32_t> Tokens(int n, int salt, int n_vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + salt * 104729 + 1) % n_vocab);
  return t;
}

// Per depth: the pp row then the tg row, each `reps` runs after one warm-up
// (r == 0). The depth's prompt is evaluated untimed before each run.
absl::StatusOr<std::vector<Row>> MeasureRows(dpl::runtime::CudaDecoder& dec, int n_prompt,
                                             int n_gen, const std::vector<int>& depths, int reps) {
  std::vector<Row> rows;
  std::vector<float> last;
  const auto at_depth = [](std::string test, int depth) {
    return depth > 0 ? absl::StrCat(test, " @ d", depth) : test;
  };
  for (int depth : depths) {
    if (n_prompt > 0) {
      Row row{at_depth(absl::StrCat("pp", n_prompt), depth), {}, false};
      for (int r = 0; r <= reps; ++r) {
        DPL_RETURN_IF_ERROR(dec.Rewind(0));
        if (depth > 0) DPL_RETURN_IF_ERROR(dec.Eval(Tokens(depth, r + 17, dec.n_vocab()), &last, nullptr));
        // The last run's pass alone under `ncu --profile-from-start off`
        // (not the load's warm-ups, the depth's prompt or the other runs).
        if (r == reps) DPL_CUDA_CHECK(cudaProfilerStart());
        const auto t0 = std::chrono::steady_clock::now();
        DPL_RETURN_IF_ERROR(dec.Eval(Tokens(n_prompt, r, dec.n_vocab()), &last, nullptr));
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r == reps) DPL_CUDA_CHECK(cudaProfilerStop());
        if (r > 0) row.tps.push_back(n_prompt / sec);
      }
      rows.push_back(row);
    }
    if (n_gen > 0) {
      Row row{at_depth(absl::StrCat("tg", n_gen), depth), {}, true};
      for (int r = 0; r <= reps; ++r) {
        DPL_RETURN_IF_ERROR(dec.Rewind(0));
        DPL_RETURN_IF_ERROR(dec.Eval(Tokens(std::max(depth, 1), r, dec.n_vocab()), &last, nullptr));
        DPL_ASSIGN_OR_RETURN(const double sec, dec.TimeDecodeSteps(n_gen));
        if (r > 0) row.tps.push_back(n_gen / sec);
      }
      rows.push_back(row);
    }
  }
  return rows;
}

// Per B in `batches`: B sequences each get an n_prompt-token prompt, then
// n_gen steps decode all of them at once (dec has n_seq >= max B).
absl::StatusOr<std::vector<Row>> MeasureBatchedRows(dpl::runtime::CudaDecoder& dec, int n_prompt,
                                                    int n_gen, const std::vector<int>& batches,
                                                    int reps) {
  std::vector<Row> rows;
  for (int batch : batches) {
    Row row{absl::StrCat("tg", n_gen, " x", batch, " (pp", n_prompt, ")"), {}, true, batch};
    for (int r = 0; r <= reps; ++r) {
      for (int seq = 0; seq < batch; ++seq) {
        DPL_RETURN_IF_ERROR(dec.RewindSeq(seq, 0));
        DPL_RETURN_IF_ERROR(dec.EvalSeq(seq, Tokens(n_prompt, r * 1000 + seq, dec.n_vocab()), nullptr, nullptr));
      }
      // The last run's steps alone under `ncu --profile-from-start off`.
      if (r == reps) DPL_CUDA_CHECK(cudaProfilerStart());
      DPL_ASSIGN_OR_RETURN(const double sec, dec.TimeDecodeSteps(n_gen, batch));
      if (r == reps) DPL_CUDA_CHECK(cudaProfilerStop());
      if (r > 0) row.tps.push_back(static_cast<double>(batch) * n_gen / sec);
    }
    rows.push_back(row);
  }
  return rows;
}

// Per B: B sequences share an n_shared-token start (sequence 0 evaluates it,
// the others copy it, as the server starts a request from a cached system
// prompt; not timed), then each gets n_prompt new tokens over it, evaluated
// as the server packs them: passes of whole chunks, at most max_batch tokens
// a pass (EvalSeqs). ppP xB @ sN is B * P tokens over those passes' time.
absl::StatusOr<std::vector<Row>> MeasureSharedStartRows(dpl::runtime::CudaDecoder& dec, int n_shared,
                                                        int n_prompt, const std::vector<int>& batches,
                                                        int reps) {
  std::vector<Row> rows;
  const std::vector<int32_t> start = Tokens(n_shared, 99, dec.n_vocab());
  std::vector<std::vector<int32_t>> own;
  std::vector<dpl::runtime::CudaDecoder::SeqChunk> chunks;
  std::vector<float> last;
  for (int batch : batches) {
    Row row{absl::StrCat("pp", n_prompt, " x", batch, " @ s", n_shared), {}, false};
    for (int r = 0; r <= reps; ++r) {
      DPL_RETURN_IF_ERROR(dec.RewindSeq(0, 0));
      DPL_RETURN_IF_ERROR(dec.EvalSeq(0, start, nullptr, nullptr));
      for (int seq = 1; seq < batch; ++seq) DPL_RETURN_IF_ERROR(dec.CopySeqPrefix(seq, 0, n_shared));
      own.clear();
      for (int seq = 0; seq < batch; ++seq) own.push_back(Tokens(n_prompt, r * 1000 + seq, dec.n_vocab()));
      // The last run's passes alone under `ncu --profile-from-start off`.
      if (r == reps) DPL_CUDA_CHECK(cudaProfilerStart());
      const auto t0 = std::chrono::steady_clock::now();
      for (int seq = 0; seq < batch;) {
        chunks.clear();
        int tokens = 0;
        for (; seq < batch && (chunks.empty() || tokens + n_prompt <= dec.max_batch()); ++seq) {
          chunks.push_back({seq, own[static_cast<size_t>(seq)]});
          tokens += n_prompt;
        }
        DPL_RETURN_IF_ERROR(dec.EvalSeqs(chunks, &last));
      }
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r == reps) DPL_CUDA_CHECK(cudaProfilerStop());
      if (r > 0) row.tps.push_back(static_cast<double>(batch) * n_prompt / sec);
    }
    rows.push_back(row);
  }
  return rows;
}

void PrintRows(const std::string& format, const std::string& path, dpl::runtime::CudaDecoder& dec,
               double bw, const std::vector<Row>& rows) {
  const double roof_tps = bw / dec.weight_bytes_per_token();
  const double macs = static_cast<double>(dec.prompt_macs_per_token());
  const double gib = dec.memory().weight_bytes / 1073741824.0;
  if (format == "json") {
    std::printf("{\n  \"model\": \"%s\",\n  \"weights_gib\": %.3f,\n  \"weight_bytes_per_token\": %llu,\n"
                "  \"read_bandwidth_gbs\": %.1f,\n  \"load_gbs\": %.2f,\n  \"rows\": [\n",
                path.c_str(), gib, static_cast<unsigned long long>(dec.weight_bytes_per_token()),
                bw / 1e9, dec.memory().load.gb_per_s());
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto [m, sd] = MeanStd(rows[i].tps);
      std::printf("    {\"test\": \"%s\", \"tokens_per_s\": %.2f, \"stddev\": %.2f%s}%s\n",
                  rows[i].test.c_str(), m, sd,
                  rows[i].decode ? absl::StrFormat(", \"roofline_fraction\": %.4f", m / rows[i].batch / roof_tps).c_str()
                                 : absl::StrFormat(", \"products_tflops\": %.1f", 2e-12 * macs * m).c_str(),
                  i + 1 < rows.size() ? "," : "");
    }
    std::printf("  ]\n}\n");
    return;
  }
  const dpl::kernels::DecodeTuning& t = dec.tuning();
  std::printf("model: %s (%.2f GiB), weight bytes per token %.3f GB, read bandwidth %.0f GB/s "
              "-> roofline %.1f t/s; load %.2f GB/s\n"
              "tuning: %d SMs, q6_K decode CTAs/SM %d, attention <= %d blocks/SM, splits %s, "
              "combine pdl %d, step pdl %d, grouped matvecs %d\n\n",
              path.c_str(), gib, dec.weight_bytes_per_token() / 1e9, bw / 1e9, roof_tps,
              dec.memory().load.gb_per_s(), t.num_sms, t.q6k_ctas_per_sm, t.attn_max_blocks_per_sm,
              t.attn_splits > 0 ? absl::StrCat(t.attn_splits).c_str() : "one wave", t.attn_pdl ? 1 : 0,
              t.pdl ? 1 : 0, t.group_matvecs ? 1 : 0);
  std::printf("| test | t/s | roofline (decode) / products (prompt) |\n|---|---:|---:|\n");
  for (const Row& r : rows) {
    const auto [m, sd] = MeanStd(r.tps);
    std::printf("| %s | %.2f ± %.2f | %s |\n", r.test.c_str(), m, sd,
                r.decode ? absl::StrFormat("%.1f%%", 100 * m / r.batch / roof_tps).c_str()
                         : absl::StrFormat("%.0f TFLOP/s", 2e-12 * macs * m).c_str());
  }
}

// A/B switches (environment, documented in README): DPL_ATTN_PDL=0 launches
// the attention combine plainly, DPL_ATTN_EARLY=0 makes every attention split
// wait on RoPE before its first K/V loads, DPL_ATTN_QUANT=0 quantizes the
// attention output in its own launch, DPL_ATTN_SPLITS=N forces N splits per kv
// head, DPL_PDL=0|1 the decode step's kernels as programmatic dependent
// launches or not, DPL_GROUP=0 one matvec launch per matrix instead of one
// per group (Q/K/V, gate/up), DPL_MMA_MAX=N: a q4_K/q5_K/q6_K/q8_0 model's products of
// more than N tokens (and at least gemm_min_tokens) dequantize to f16 for a
// cuBLAS GEMM instead of the int8 mma matvec (default 64), DPL_MMA_F16_MIN=N:
// q4_K products of N or more of those tokens take the f16 mma form instead
// of the int8 one (65: never; default 9), DPL_MMA_F16_MIN_Q6K=N the same for
// q6_K dpl (default 4), DPL_MMA_F16_MIN_Q5K=N and DPL_MMA_F16_MIN_Q8_0=N for
// q5_K and q8_0 dpl (default 17 and 9), DPL_MMA_F16_MAX=N: products of 65
// to N tokens on the f16 form's wide launch (kernels/tuning.h),
// DPL_F16_WIDE_SPLIT=0|1 its k split in clusters,
// DPL_ROPE_FOLD=0
// runs the RoPE kernel instead of folding RoPE into the Q/K/V matvec,
// DPL_MATVEC_GEOM=KERNEL:ROWSxCOLS=KSPLIT,DEPTH,PIPE[;...] forces a
// single-token geometry on the launches of that kernel and shape (in-graph
// geometry sweeps, e.g. "q4_K:3584x3584=4,4,0").
absl::StatusOr<std::vector<dpl::kernels::DecodeTuning::MatVecGeometryOverride>> GeometryOverrides(
    absl::string_view text) {
  std::vector<dpl::kernels::DecodeTuning::MatVecGeometryOverride> out;
  for (absl::string_view item : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    const std::vector<std::string> a = absl::StrSplit(item, absl::ByAnyChar(":x=,"));
    dpl::kernels::DecodeTuning::MatVecGeometryOverride o;
    int pipe = 0;
    if (a.size() != 6 || !absl::SimpleAtoi(a[1], &o.n_rows) || !absl::SimpleAtoi(a[2], &o.n_cols) ||
        !absl::SimpleAtoi(a[3], &o.ksplit) || !absl::SimpleAtoi(a[4], &o.depth) ||
        !absl::SimpleAtoi(a[5], &pipe)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DPL_MATVEC_GEOM: bad item '", item, "' (expected KERNEL:ROWSxCOLS=KSPLIT,DEPTH,PIPE)"));
    }
    o.kernel = a[0];
    o.pipe = pipe != 0;
    const dpl::kernels::MatVecGeometry g{1, o.ksplit, o.depth, o.pipe};
    if (!dpl::kernels::IsCompiledGeometry(g)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DPL_MATVEC_GEOM: geometry of '", item, "' is not compiled"));
    }
    out.push_back(o);
  }
  return out;
}

absl::StatusOr<dpl::kernels::DecodeTuning> TuningFromEnv() {
  DPL_ASSIGN_OR_RETURN(dpl::kernels::DecodeTuning t, dpl::kernels::DecodeTuningForDevice());
  auto flag = [](const char* name, auto* field) {
    if (const char* e = std::getenv(name); e != nullptr && *e != '\0') {
      *field = static_cast<std::remove_pointer_t<decltype(field)>>(std::atoi(e));
    }
  };
  flag("DPL_ATTN_PDL", &t.attn_pdl);
  flag("DPL_ATTN_EARLY", &t.attn_early_kv);
  flag("DPL_ATTN_QUANT", &t.attn_quantize_output);
  flag("DPL_ATTN_SPLITS", &t.attn_splits);
  flag("DPL_ATTN_MIN_CHUNK", &t.attn_min_chunk);
  flag("DPL_ATTN_COMBINE_PARTS", &t.attn_combine_parts);
  flag("DPL_PDL", &t.pdl);
  flag("DPL_GROUP", &t.group_matvecs);
  flag("DPL_MMA_MAX", &t.mma_max_tokens);
  flag("DPL_MMA_F16_MIN", &t.mma_f16_min_tokens);
  flag("DPL_MMA_F16_MIN_Q6K", &t.mma_f16_min_tokens_q6k);
  flag("DPL_MMA_F16_MIN_Q5K", &t.mma_f16_min_tokens_q5k);
  flag("DPL_MMA_F16_MIN_Q8_0", &t.mma_f16_min_tokens_q8_0);
  flag("DPL_MMA_F16_MAX", &t.mma_f16_max_tokens);
  flag("DPL_F16_WIDE_SPLIT", &t.mma_f16_wide_split);
  flag("DPL_WIDE_GEMM_QKV", &t.wide_gemm_qkv_rows);
  flag("DPL_WIDE_GEMM_O", &t.wide_gemm_o_rows);
  flag("DPL_WIDE_GEMM_DOWN6", &t.wide_gemm_q6k_down_rows);
  flag("DPL_F16_CTAS", &t.mma_f16_small_ctas_per_sm);
  flag("DPL_F16_CLUSTER", &t.mma_f16_cluster_sum);
  flag("DPL_F16_TARGET", &t.mma_f16_target_ctas);
  flag("DPL_F16_TARGET_WIDE", &t.mma_f16_target_ctas_wide);
  flag("DPL_ROPE_FOLD", &t.rope_in_matvec);
  flag("DPL_GEMM_AHEAD", &t.gemm_dequant_ahead);
  flag("DPL_GEMM_SMS", &t.gemm_ahead_sm_target);
  flag("DPL_GEMM_AHEAD_CTAS", &t.gemm_ahead_dequant_ctas);
  flag("DPL_GEMM_AHEAD_SIDE_FIRST", &t.gemm_ahead_side_first);
  flag("DPL_MOE_GROUPED", &t.moe_grouped_min_fill_pct);
  flag("DPL_MOE_PROMPT_MMA", &t.moe_prompt_mma_max_rows);
  flag("DPL_F32_WIDE_TILE", &t.f32_wide_tile);
  if (const char* e = std::getenv("DPL_MATVEC_GEOM"); e != nullptr) {
    DPL_ASSIGN_OR_RETURN(t.matvec_geometry, GeometryOverrides(e));
  }
  return t;
}

absl::Status Bench(const cxxopts::ParseResult& args) {
  if (!args.count("model")) return absl::InvalidArgumentError("no model: use -m MODEL.dpl");
  const int n_prompt = args["n-prompt"].as<int>();
  const int n_gen = args["n-gen"].as<int>();
  const int reps = std::max(1, args["repetitions"].as<int>());
  const std::string format = args["output"].as<std::string>();
  if (format != "md" && format != "json") return absl::InvalidArgumentError("-o must be md or json");
  // A comma-separated list of ints in [lo, hi] ("" : none).
  auto int_list = [](const std::string& flag, const std::string& text, int lo,
                     int hi) -> absl::StatusOr<std::vector<int>> {
    std::vector<int> out;
    for (absl::string_view d : absl::StrSplit(text, ',', absl::SkipEmpty())) {
      int v;
      if (!absl::SimpleAtoi(d, &v) || v < lo || v > hi) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": bad value '", d, "' (expected integers in [", lo, ", ", hi, "])"));
      }
      out.push_back(v);
    }
    return out;
  };
  DPL_ASSIGN_OR_RETURN(const std::vector<int> depths,
                       int_list("-d", args["n-depth"].as<std::string>(), 0, 1 << 24));
  DPL_ASSIGN_OR_RETURN(const std::vector<int> batches,
                       int_list("-npl", args["npl"].as<std::string>(), 1, 1024));
  const int n_batch_prompt = args["npp"].as<int>();
  if (n_batch_prompt < 1 || n_batch_prompt > 1 << 20) {
    return absl::InvalidArgumentError(absl::StrCat("-npp ", n_batch_prompt, " is out of range"));
  }
  const int n_shared = args["shared"].as<int>();
  if (n_shared < 0 || n_shared > 1 << 20) {
    return absl::InvalidArgumentError(absl::StrCat("--shared ", n_shared, " is out of range"));
  }
  if (n_shared > 0 && batches.empty()) return absl::InvalidArgumentError("--shared needs -npl");
  if (!batches.empty() && n_gen < 1 && n_shared == 0) {
    return absl::InvalidArgumentError("-npl needs -n >= 1");
  }
  int64_t need = 0;
  for (int d : depths) need = std::max<int64_t>(need, d + std::max(n_prompt, std::max(n_gen, 1)));
  dpl::runtime::CudaDecoderOptions opt;
  opt.n_ctx = args["ctx-size"].as<int64_t>() > 0 ? args["ctx-size"].as<int64_t>() : need + 1;
  opt.max_batch = args["ubatch-size"].as<int>();
  if (opt.max_batch < 1 || opt.max_batch > 8192) {
    return absl::InvalidArgumentError(absl::StrCat("-ub ", opt.max_batch, " is out of range [1, 8192]"));
  }
  DPL_ASSIGN_OR_RETURN(opt.tuning, TuningFromEnv());
  const std::string path = args["model"].as<std::string>();
  DPL_ASSIGN_OR_RETURN(auto dec, dpl::runtime::CudaDecoder::Create(path, opt));
  DPL_ASSIGN_OR_RETURN(const double bw, dpl::kernels::MeasureReadBandwidth(4ull << 30, 10));
  DPL_ASSIGN_OR_RETURN(std::vector<Row> rows, MeasureRows(*dec, n_prompt, n_gen, depths, reps));
  if (!batches.empty()) {
    // Its own decoder: max(B) cache regions of just the positions a batched
    // row needs (the depth rows' context times 64 would waste gigabytes).
    dec.reset();
    opt.n_seq = *std::max_element(batches.begin(), batches.end());
    opt.n_ctx = n_shared > 0 ? n_shared + n_batch_prompt : n_batch_prompt + n_gen + 1;
    DPL_ASSIGN_OR_RETURN(dec, dpl::runtime::CudaDecoder::Create(path, opt));
    DPL_ASSIGN_OR_RETURN(std::vector<Row> batched,
                         n_shared > 0 ? MeasureSharedStartRows(*dec, n_shared, n_batch_prompt, batches, reps)
                                      : MeasureBatchedRows(*dec, n_batch_prompt, n_gen, batches, reps));
    rows.insert(rows.end(), batched.begin(), batched.end());
  }
  PrintRows(format, path, *dec, bw, rows);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  dpl::cli::Command cmd("dpl-bench", "Benchmark the CUDA runtime (llama-bench's rows)");
  cmd.options().add_options()
      ("m,model", ".dpl model", cxxopts::value<std::string>())
      ("p,n-prompt", "prompt tokens (0: skip)", cxxopts::value<int>()->default_value("512"))
      ("n,n-gen", "generated tokens (0: skip)", cxxopts::value<int>()->default_value("128"))
      ("d,n-depth", "comma-separated depths for the tg rows", cxxopts::value<std::string>()->default_value("0,3254"))
      ("r,repetitions", "runs per row", cxxopts::value<int>()->default_value("3"))
      ("o,output", "md or json", cxxopts::value<std::string>()->default_value("md"))
      ("c,ctx-size", "KV cache positions (0: what the rows need)", cxxopts::value<int64_t>()->default_value("0"))
      ("ubatch-size", "prompt tokens per forward pass (-ub)", cxxopts::value<int>()->default_value("2048"))
      ("npl", "comma-separated sequence counts for batched tg rows (llama-batched-bench's -npl)",
       cxxopts::value<std::string>()->default_value(""))
      ("npp", "prompt tokens per sequence of a batched row", cxxopts::value<int>()->default_value("128"))
      ("shared", "with -npl: the batched rows time -npp new tokens a sequence over a start of this many "
       "tokens that all share (packed passes of at most -ub tokens), instead of decode steps",
       cxxopts::value<int>()->default_value("0"));
  cmd.AddSingleDashAlias("-ub", "ubatch-size");
  cmd.AddSingleDashAlias("-npl", "npl");
  cmd.AddSingleDashAlias("-npp", "npp");
  if (!cmd.Parse(argc, argv)) return cmd.exit_code();
  const absl::Status s = Bench(cmd.args());
  return s.ok() ? 0 : cmd.Fail(s);
}
