// dpl-inspect FILE [--json] [--verify-checksums]: describe a GGUF or .dpl file.
#include <iostream>
#include <string>

#include "cli/cli.h"
#include "converter/inspect.h"

int main(int argc, char** argv) {
  dpl::cli::Command cmd("dpl-inspect", "Describe a GGUF or .dpl model file");
  cmd.options().positional_help("FILE");
  cmd.options().add_options()
      ("json", "machine-readable output")
      ("verify-checksums", "recompute every tensor checksum (.dpl files)")
      ("array-elems", "array elements shown before summarizing",
       cxxopts::value<size_t>()->default_value("8"))
      ("file", "GGUF or .dpl file", cxxopts::value<std::string>());
  cmd.options().parse_positional({"file"});
  if (!cmd.Parse(argc, argv)) return cmd.exit_code();
  const cxxopts::ParseResult& args = cmd.args();
  if (!args.count("file")) return cmd.Usage("expected one FILE");
  dpl::converter::InspectOptions opt;
  opt.json = args.count("json") > 0;
  opt.verify_checksums = args.count("verify-checksums") > 0;
  opt.max_array_elems = args["array-elems"].as<size_t>();
  const absl::Status s = dpl::converter::Inspect(args["file"].as<std::string>(), opt, std::cout);
  return s.ok() ? 0 : cmd.Fail(s);
}
