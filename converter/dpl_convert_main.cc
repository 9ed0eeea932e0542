// dpl-convert IN.gguf OUT.dpl [--layout auto|raw|dpl] [--verify] [--compress] ...
// Rewrites a GGUF model into the .dpl layout (docs/FORMAT.md).
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "cli/cli.h"
#include "converter/convert.h"
#include "formats/output_file.h"

namespace {

constexpr char kDescription[] =
    "Convert a GGUF model into a .dpl file.\n\n"
    "OUT.dpl appears whole or not at all: the bytes go to a hidden temporary file next to it,\n"
    "which is fsynced and renamed over OUT.dpl at the end. An error, Ctrl-C or any terminating\n"
    "signal (SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, ...) before that removes the temporary file,\n"
    "leaves an existing OUT.dpl as it was, and ends the program (exit 1, or killed by the\n"
    "signal). --verify reads the temporary file back before the rename: a failed or interrupted\n"
    "verify writes nothing. A closed standard output (dpl-convert ... | head) does not stop\n"
    "the conversion. Refused: OUT.dpl being the input (also through a link), an existing\n"
    "read-only OUT.dpl, a directory or device there, and option values out of range.\n\n"
    "--layout picks the tensors that get the dense split-plane (dpl) layout: auto (default)\n"
    "the per-type choice of the kernel bench (every type with planes but iq4_xs),\n"
    "raw none, dpl every tensor whose type has one (docs/FORMAT.md's table; a file with dpl\n"
    "on any type but q6_K is format version 2). A tensor whose type the CUDA runtime has no\n"
    "kernel for is converted with a warning on stderr.";

absl::StatusOr<dpl::converter::ConvertOptions> OptionsFrom(const cxxopts::ParseResult& args) {
  dpl::converter::ConvertOptions opt;
  DPL_ASSIGN_OR_RETURN(opt.layout,
                       dpl::converter::LayoutPolicyFromName(args["layout"].as<std::string>()));
  opt.compress = args.count("compress") > 0;
  opt.compress_level = args["level"].as<int>();
  const uint64_t frame_mib = args["frame-mib"].as<uint64_t>();
  if (frame_mib < 1 || frame_mib > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--frame-mib ", frame_mib, " out of range (1..1024)"));
  }
  opt.frame_bytes = frame_mib << 20;
  opt.threads = args["threads"].as<int>();
  opt.verify = args.count("verify") > 0;
  opt.log = args.count("quiet") ? nullptr : &std::cout;
  opt.warn = &std::cerr;
  return opt;
}

// "q6_K 7, q8_0 14", or "none".
std::string DplTypes(const dpl::converter::ConvertStats& stats) {
  std::vector<std::string> parts;
  for (const auto& [type, n] : stats.n_dpl_by_type) {
    parts.push_back(absl::StrCat(dpl::formats::TraitsOf(type).name, " ", n));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

void PrintSummary(const dpl::converter::ConvertStats& stats, bool compress) {
  std::cout << absl::StrFormat(
      "converted %d tensors (%d -> dpl: %s; format version %d): %.1f MB in, %.1f MB out (data %.1f MB) in %.2f s, %.0f MB/s\n",
      stats.n_tensors, stats.n_dpl_tensors, DplTypes(stats), stats.version,
      stats.input_bytes / 1e6, stats.output_bytes / 1e6, stats.data_bytes / 1e6, stats.seconds,
      stats.input_bytes / 1e6 / std::max(stats.seconds, 1e-9));
  if (compress) {
    std::cout << absl::StrFormat("compressed: data region %.1f MB -> %.1f MB file, ratio %.3f (%d threads)\n",
                                 stats.data_bytes / 1e6, stats.output_bytes / 1e6,
                                 static_cast<double>(stats.data_bytes) / stats.output_bytes,
                                 stats.threads);
  }
  if (stats.verify) {
    std::cout << absl::StrFormat(
        "verify: OK: metadata identical, %d tensors, %d rows restored bit for bit from dpl, "
        "%.1f MB compared, all checksums match\n",
        stats.verify->n_tensors, stats.verify->n_dpl_rows, stats.verify->bytes_compared / 1e6);
  }
}

absl::Status Convert(const cxxopts::ParseResult& args) {
  DPL_ASSIGN_OR_RETURN(const dpl::converter::ConvertOptions opt, OptionsFrom(args));
  const std::string in = args["in"].as<std::string>();
  const std::string out = args["out"].as<std::string>();
  DPL_ASSIGN_OR_RETURN(const dpl::converter::ConvertStats stats,
                       dpl::converter::ConvertGgufToDpl(in, out, opt));
  PrintSummary(stats, opt.compress);
  if (const absl::Status s = dpl::converter::CheckRunnable(out); !s.ok()) {
    std::cout << "note: the runtime cannot run this model yet: " << s.message() << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  dpl::cli::Command cmd("dpl-convert", kDescription);
  cxxopts::Options& options = cmd.options();
  options.positional_help("IN.gguf OUT.dpl");
  options.add_options()
      ("layout", "which tensors get the dpl layout: auto (the bench's per-type choice), raw, dpl",
       cxxopts::value<std::string>()->default_value("auto"))
      ("verify", "prove the result restores the GGUF bit for bit before it is written")
      ("compress", "store the data region as independent zstd frames (shipping form)")
      ("level", "zstd level for --compress (zstd's range)", cxxopts::value<int>()->default_value("3"))
      ("frame-mib", "uncompressed MiB per zstd frame for --compress (1..1024)",
       cxxopts::value<uint64_t>()->default_value("4"))
      ("threads", "compression threads (0: all cores that fit in memory; 1..1024)",
       cxxopts::value<int>()->default_value("0"))
      ("q,quiet", "no per-tensor lines")
      ("in", "input GGUF", cxxopts::value<std::string>())
      ("out", "output .dpl", cxxopts::value<std::string>());
  options.parse_positional({"in", "out"});
  if (!cmd.Parse(argc, argv)) return cmd.exit_code();
  if (!cmd.args().count("in") || !cmd.args().count("out")) {
    return cmd.Usage("expected IN.gguf and OUT.dpl");
  }
  // A closed stdout is an EPIPE on a log line, not a death; every other
  // terminating signal removes the unfinished output (formats/output_file.h).
  std::signal(SIGPIPE, SIG_IGN);
  dpl::formats::InstallSignalCleanup();
  const absl::Status s = Convert(cmd.args());
  return s.ok() ? 0 : cmd.Fail(s);
}
