// dpl-bench: llama-bench's shape for the CUDA runtime.
//   dpl-bench -m MODEL.dpl [-p 512] [-n 128] [-d 0,3254] [-r 3] [-o md|json]
// Rows: ppP (a P-token prompt from an empty cache), tgN (N decode steps,
// graph replays back to back) and tgN @ dD (the same after a D-token
// prompt). Each row: mean and standard deviation of tokens/s over -r runs,
// plus the fraction of the HBM roofline: (weight bytes read per token /
// read bandwidth measured in this run) over the measured time per token.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include <cxxopts.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kernels/membw/membw.h"
#include "runtime/cuda/cuda_decoder.h"

namespace {

struct Row {
  std::string test;
  std::vector<double> tps;  // tokens/s per repetition
  bool decode = false;      // roofline applies to decode rows
};

int Fail(absl::string_view m) {
  std::fprintf(stderr, "dpl-bench: error: %.*s\n", static_cast<int>(m.size()), m.data());
  return 1;
}

std::pair<double, double> MeanStd(const std::vector<double>& v) {
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= v.size();
  for (double x : v) s += (x - m) * (x - m);
  return {m, v.size() > 1 ? std::sqrt(s / (v.size() - 1)) : 0.0};
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("dpl-bench", "Benchmark the CUDA runtime (llama-bench's rows)");
  options.add_options()
      ("m,model", ".dpl model", cxxopts::value<std::string>())
      ("p,n-prompt", "prompt tokens (0: skip)", cxxopts::value<int>()->default_value("512"))
      ("n,n-gen", "generated tokens (0: skip)", cxxopts::value<int>()->default_value("128"))
      ("d,n-depth", "comma-separated depths for the tg rows", cxxopts::value<std::string>()->default_value("0,3254"))
      ("r,repetitions", "runs per row", cxxopts::value<int>()->default_value("3"))
      ("o,output", "md or json", cxxopts::value<std::string>()->default_value("md"))
      ("c,ctx-size", "KV cache positions (0: what the rows need)", cxxopts::value<int64_t>()->default_value("0"))
      ("h,help", "show this help");
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  if (args.count("help")) {
    std::cout << options.help() << "\n";
    return 0;
  }
  if (!args.count("model")) return Fail("no model: use -m MODEL.dpl");
  const int n_prompt = args["n-prompt"].as<int>();
  const int n_gen = args["n-gen"].as<int>();
  const int reps = std::max(1, args["repetitions"].as<int>());
  const std::string format = args["output"].as<std::string>();
  if (format != "md" && format != "json") return Fail("-o must be md or json");
  std::vector<int> depths;
  for (absl::string_view d : absl::StrSplit(args["n-depth"].as<std::string>(), ',')) {
    int v;
    if (!absl::SimpleAtoi(d, &v) || v < 0) return Fail(absl::StrCat("bad depth '", d, "'"));
    depths.push_back(v);
  }
  int64_t need = n_prompt;
  for (int d : depths) need = std::max<int64_t>(need, d + n_gen);
  const int64_t n_ctx = args["ctx-size"].as<int64_t>() > 0 ? args["ctx-size"].as<int64_t>() : need + 1;

  dpl::runtime::CudaDecoderOptions opt;
  opt.n_ctx = n_ctx;
  opt.max_batch = std::max(1, std::min(n_prompt > 0 ? n_prompt : 256, 512));
  const std::string path = args["model"].as<std::string>();
  auto dec_or = dpl::runtime::CudaDecoder::Create(path, opt);
  if (!dec_or.ok()) return Fail(dec_or.status().message());
  dpl::runtime::CudaDecoder& dec = **dec_or;
  auto bw = dpl::kernels::MeasureReadBandwidth(4ull << 30, 10);
  if (!bw.ok()) return Fail(bw.status().message());

  // Deterministic, non-trivial prompt tokens.
  auto tokens = [&](int n, int salt) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + salt * 104729 + 1) % dec.n_vocab());
    return t;
  };
  std::vector<Row> rows;
  if (n_prompt > 0) {
    Row row{absl::StrCat("pp", n_prompt), {}, false};
    for (int r = 0; r <= reps; ++r) {  // r == 0 warms up
      if (!dec.Rewind(0).ok()) return Fail("rewind");
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<float> last;
      absl::Status s = dec.Eval(tokens(n_prompt, r), &last, nullptr);
      if (!s.ok()) return Fail(s.message());
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) row.tps.push_back(n_prompt / sec);
    }
    rows.push_back(row);
  }
  if (n_gen > 0) {
    for (int depth : depths) {
      Row row{depth > 0 ? absl::StrCat("tg", n_gen, " @ d", depth) : absl::StrCat("tg", n_gen), {}, true};
      for (int r = 0; r <= reps; ++r) {
        if (!dec.Rewind(0).ok()) return Fail("rewind");
        std::vector<float> last;
        absl::Status s = dec.Eval(tokens(std::max(depth, 1), r), &last, nullptr);
        if (!s.ok()) return Fail(s.message());
        auto sec = dec.TimeDecodeSteps(n_gen);
        if (!sec.ok()) return Fail(sec.status().message());
        if (r > 0) row.tps.push_back(n_gen / *sec);
      }
      rows.push_back(row);
    }
  }

  const double roof_tps = *bw / dec.weight_bytes_per_token();
  const double gib = dec.memory().weight_bytes / 1073741824.0;
  if (format == "json") {
    std::printf("{\n  \"model\": \"%s\",\n  \"weights_gib\": %.3f,\n  \"weight_bytes_per_token\": %llu,\n"
                "  \"read_bandwidth_gbs\": %.1f,\n  \"load_gbs\": %.2f,\n  \"rows\": [\n",
                path.c_str(), gib, static_cast<unsigned long long>(dec.weight_bytes_per_token()),
                *bw / 1e9, dec.memory().load.gb_per_s());
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto [m, sd] = MeanStd(rows[i].tps);
      std::printf("    {\"test\": \"%s\", \"tokens_per_s\": %.2f, \"stddev\": %.2f%s}%s\n",
                  rows[i].test.c_str(), m, sd,
                  rows[i].decode ? absl::StrFormat(", \"roofline_fraction\": %.4f", m / roof_tps).c_str() : "",
                  i + 1 < rows.size() ? "," : "");
    }
    std::printf("  ]\n}\n");
    return 0;
  }
  std::printf("model: %s (%.2f GiB), weight bytes per token %.3f GB, read bandwidth %.0f GB/s "
              "-> roofline %.1f t/s; load %.2f GB/s\n\n",
              path.c_str(), gib, dec.weight_bytes_per_token() / 1e9, *bw / 1e9, roof_tps,
              dec.memory().load.gb_per_s());
  std::printf("| test | t/s | roofline |\n|---|---:|---:|\n");
  for (const Row& r : rows) {
    const auto [m, sd] = MeanStd(r.tps);
    std::printf("| %s | %.2f ± %.2f | %s |\n", r.test.c_str(), m, sd,
                r.decode ? absl::StrFormat("%.1f%%", 100 * m / roof_tps).c_str() : "");
  }
  return 0;
}
