// dpl-convert IN.gguf OUT.dpl [--verify] [--compress] ...
// Rewrites a GGUF model into the .dpl layout (docs/FORMAT.md).
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>

#include <cxxopts.hpp>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "cli/cli.h"
#include "converter/convert.h"
#include "formats/model_file.h"
#include "model/model.h"

namespace {

std::atomic<bool> g_cancel{false};

void OnSignal(int) { g_cancel = true; }

// The converter rewrites any GGUF; the runtime runs what model::BindModel
// accepts (architecture, hyperparameters, tensor set and shapes).
absl::Status CheckRunnable(const std::string& path) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<dpl::formats::ModelFile> file,
                       dpl::formats::ModelFile::OpenIndex(path));
  return dpl::model::BindModel(*file).status();
}

// Prints the conversion summary; then --verify proves the result.
absl::Status Convert(const cxxopts::ParseResult& args) {
  dpl::converter::ConvertOptions opt;
  opt.compress = args.count("compress") > 0;
  opt.compress_level = args["level"].as<int>();
  opt.frame_bytes = args["frame-mib"].as<uint64_t>() << 20;
  opt.threads = args["threads"].as<int>();
  opt.log = args.count("quiet") ? nullptr : &std::cout;
  opt.cancel = &g_cancel;
  const std::string in = args["in"].as<std::string>();
  const std::string out = args["out"].as<std::string>();
  DPL_ASSIGN_OR_RETURN(const dpl::converter::ConvertStats stats,
                       dpl::converter::ConvertGgufToDpl(in, out, opt));
  std::cout << absl::StrFormat(
      "converted %d tensors (%d q6_K -> dpl): %.1f MB in, %.1f MB out (data %.1f MB) in %.2f s, %.0f MB/s\n",
      stats.n_tensors, stats.n_dpl_tensors, stats.input_bytes / 1e6, stats.output_bytes / 1e6,
      stats.data_bytes / 1e6, stats.seconds, stats.input_bytes / 1e6 / std::max(stats.seconds, 1e-9));
  if (opt.compress) {
    std::cout << absl::StrFormat("compressed: data region %.1f MB -> %.1f MB file, ratio %.3f\n",
                                 stats.data_bytes / 1e6, stats.output_bytes / 1e6,
                                 static_cast<double>(stats.data_bytes) / stats.output_bytes);
  }
  if (const absl::Status s = CheckRunnable(out); !s.ok()) {
    std::cout << "note: the runtime cannot run this model yet: " << s.message() << "\n";
  }
  if (!args.count("verify")) return absl::OkStatus();
  DPL_ASSIGN_OR_RETURN(const dpl::formats::GgufFile gguf, dpl::formats::GgufFile::Open(in));
  DPL_ASSIGN_OR_RETURN(const dpl::formats::DplFile dpl, dpl::formats::DplFile::Open(out));
  absl::StatusOr<dpl::converter::VerifyStats> vs = dpl::converter::VerifyConversion(gguf, dpl);
  DPL_RETURN_IF_ERROR(dpl::Annotate(vs.status(), "verify failed"));
  std::cout << absl::StrFormat(
      "verify: OK: metadata identical, %d tensors, %d q6_K rows restored bit for bit from dpl, "
      "%.1f MB compared, all checksums match\n",
      vs->n_tensors, vs->n_dpl_rows, vs->bytes_compared / 1e6);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  dpl::cli::Command cmd("dpl-convert", "Convert a GGUF model into a .dpl file");
  cxxopts::Options& options = cmd.options();
  options.positional_help("IN.gguf OUT.dpl");
  options.add_options()
      ("verify", "read the result back and prove it restores the GGUF bit for bit")
      ("compress", "store the data region as independent zstd frames (shipping form)")
      ("level", "zstd level for --compress", cxxopts::value<int>()->default_value("3"))
      ("frame-mib", "uncompressed MiB per zstd frame for --compress",
       cxxopts::value<uint64_t>()->default_value("4"))
      ("threads", "compression threads (0: all cores)", cxxopts::value<int>()->default_value("0"))
      ("q,quiet", "no per-tensor lines")
      ("in", "input GGUF", cxxopts::value<std::string>())
      ("out", "output .dpl", cxxopts::value<std::string>());
  options.parse_positional({"in", "out"});
  if (!cmd.Parse(argc, argv)) return cmd.exit_code();
  if (!cmd.args().count("in") || !cmd.args().count("out")) {
    return cmd.Usage("expected IN.gguf and OUT.dpl");
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const absl::Status s = Convert(cmd.args());
  return s.ok() ? 0 : cmd.Fail(s);
}
