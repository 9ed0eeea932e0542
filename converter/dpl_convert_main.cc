// dpl-convert IN.gguf OUT.dpl [--verify] [--compress] ...
// Rewrites a GGUF model into the .dpl layout (docs/FORMAT.md).
#include <csignal>
#include <cstdio>
#include <iostream>

#include <cxxopts.hpp>

#include "absl/strings/str_format.h"
#include "converter/convert.h"

namespace {

std::atomic<bool> g_cancel{false};

void OnSignal(int) { g_cancel = true; }

int Fail(const std::string& message) {
  std::fprintf(stderr, "dpl-convert: error: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("dpl-convert", "Convert a GGUF model into a .dpl file");
  options.positional_help("IN.gguf OUT.dpl");
  options.add_options()
      ("verify", "read the result back and prove it restores the GGUF bit for bit")
      ("compress", "store the data region as independent zstd frames (shipping form)")
      ("level", "zstd level for --compress", cxxopts::value<int>()->default_value("3"))
      ("frame-mib", "uncompressed MiB per zstd frame for --compress",
       cxxopts::value<uint64_t>()->default_value("4"))
      ("threads", "compression threads (0: all cores)", cxxopts::value<int>()->default_value("0"))
      ("q,quiet", "no per-tensor lines")
      ("h,help", "show this help")
      ("in", "input GGUF", cxxopts::value<std::string>())
      ("out", "output .dpl", cxxopts::value<std::string>());
  options.parse_positional({"in", "out"});
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
  if (!args.count("in") || !args.count("out")) {
    std::fprintf(stderr, "%s\n", options.help().c_str());
    return Fail("expected IN.gguf and OUT.dpl");
  }
  if (!args.unmatched().empty()) return Fail("unexpected argument '" + args.unmatched()[0] + "'");

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  dpl::converter::ConvertOptions opt;
  opt.compress = args.count("compress") > 0;
  opt.compress_level = args["level"].as<int>();
  opt.frame_bytes = args["frame-mib"].as<uint64_t>() << 20;
  opt.threads = args["threads"].as<int>();
  opt.log = args.count("quiet") ? nullptr : &std::cout;
  opt.cancel = &g_cancel;
  const std::string in = args["in"].as<std::string>();
  const std::string out = args["out"].as<std::string>();

  auto stats = dpl::converter::ConvertGgufToDpl(in, out, opt);
  if (!stats.ok()) return Fail(std::string(stats.status().message()));
  std::cout << absl::StrFormat(
      "converted %d tensors (%d q6_K -> dpl): %.1f MB in, %.1f MB out (data %.1f MB) in %.2f s, %.0f MB/s\n",
      stats->n_tensors, stats->n_dpl_tensors, stats->input_bytes / 1e6, stats->output_bytes / 1e6,
      stats->data_bytes / 1e6, stats->seconds, stats->input_bytes / 1e6 / std::max(stats->seconds, 1e-9));
  if (opt.compress) {
    std::cout << absl::StrFormat("compressed: data region %.1f MB -> %.1f MB file, ratio %.3f\n",
                                 stats->data_bytes / 1e6, stats->output_bytes / 1e6,
                                 static_cast<double>(stats->data_bytes) / stats->output_bytes);
  }
  if (args.count("verify")) {
    auto gguf = dpl::formats::GgufFile::Open(in);
    if (!gguf.ok()) return Fail(std::string(gguf.status().message()));
    auto dpl = dpl::formats::DplFile::Open(out);
    if (!dpl.ok()) return Fail(std::string(dpl.status().message()));
    auto vs = dpl::converter::VerifyConversion(*gguf, *dpl);
    if (!vs.ok()) return Fail("verify failed: " + std::string(vs.status().message()));
    std::cout << absl::StrFormat(
        "verify: OK: metadata identical, %d tensors, %d q6_K rows restored bit for bit from dpl, "
        "%.1f MB compared, all checksums match\n",
        vs->n_tensors, vs->n_dpl_rows, vs->bytes_compared / 1e6);
  }
  return 0;
}
