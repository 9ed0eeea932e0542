// dpl-inspect FILE [--json] [--verify-checksums]: describe a GGUF or .dpl file.
#include <cstdio>
#include <iostream>

#include <cxxopts.hpp>

#include "converter/inspect.h"

int main(int argc, char** argv) {
  cxxopts::Options options("dpl-inspect", "Describe a GGUF or .dpl model file");
  options.positional_help("FILE");
  options.add_options()
      ("json", "machine-readable output")
      ("verify-checksums", "recompute every tensor checksum (.dpl files)")
      ("array-elems", "array elements shown before summarizing",
       cxxopts::value<size_t>()->default_value("8"))
      ("h,help", "show this help")
      ("file", "GGUF or .dpl file", cxxopts::value<std::string>());
  options.parse_positional({"file"});
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpl-inspect: error: %s\n", e.what());
    return 1;
  }
  if (args.count("help")) {
    std::cout << options.help() << "\n";
    return 0;
  }
  if (!args.count("file") || !args.unmatched().empty()) {
    std::fprintf(stderr, "%s\ndpl-inspect: error: expected one FILE\n", options.help().c_str());
    return 1;
  }
  dpl::converter::InspectOptions opt;
  opt.json = args.count("json") > 0;
  opt.verify_checksums = args.count("verify-checksums") > 0;
  opt.max_array_elems = args["array-elems"].as<size_t>();
  const absl::Status s = dpl::converter::Inspect(args["file"].as<std::string>(), opt, std::cout);
  if (!s.ok()) {
    std::fprintf(stderr, "dpl-inspect: error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
