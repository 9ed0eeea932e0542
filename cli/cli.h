// What every command-line program (dpl-convert, dpl-inspect, dpl-run,
// dpl-tokenize, dpl-bench) shares: cxxopts parsing with -h/--help, and one
// way to fail: "NAME: error: MESSAGE" on stderr, exit status 1.
//
//   dpl::cli::Command cmd("dpl-inspect", "Describe a GGUF or .dpl model file");
//   cmd.options().add_options()("json", "machine-readable output") ...;
//   if (!cmd.Parse(argc, argv)) return cmd.exit_code();
//   if (!cmd.args().count("file")) return cmd.Usage("expected one FILE");
//   absl::Status s = Run(...);
//   if (!s.ok()) return cmd.Fail(s);
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <cxxopts.hpp>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dpl::cli {

class Command {
 public:
  // `name` starts every error line; `description` heads --help. An option
  // "h,help" is added.
  Command(std::string name, std::string description);

  // Add options and positional arguments here before Parse.
  cxxopts::Options& options() { return options_; }
  // llama.cpp spells some long options with one dash (-cnv, -ub); cxxopts
  // would read "-ub" as "-u b". Parse rewrites an argument equal to
  // `single_dash` to "--" + long_name first.
  void AddSingleDashAlias(std::string single_dash, std::string long_name) {
    aliases_.emplace_back(std::move(single_dash), "--" + long_name);
  }
  const cxxopts::ParseResult& args() const { return args_; }

  // Parses argv. False when main should return exit_code() now: 0 after
  // printing --help, 1 after reporting a parse error or an argument that no
  // option or positional takes.
  bool Parse(int argc, const char* const* argv);
  int exit_code() const { return exit_code_; }

  // Prints "NAME: error: MESSAGE" to stderr; returns 1, main's exit status.
  int Fail(absl::string_view message) const;
  int Fail(const absl::Status& status) const { return Fail(status.message()); }
  // The same after printing the --help text.
  int Usage(absl::string_view message) const;

 private:
  std::string name_;
  cxxopts::Options options_;
  cxxopts::ParseResult args_;
  std::vector<std::pair<std::string, std::string>> aliases_;
  int exit_code_ = 0;
};

}  // namespace dpl::cli
