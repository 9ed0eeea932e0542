#include "cli/cli.h"

#include <cstdio>
#include <exception>
#include <iostream>
#include <utility>

namespace dpl::cli {

Command::Command(std::string name, std::string description)
    : name_(std::move(name)), options_(name_, std::move(description)) {
  options_.add_options()("h,help", "show this help");
}

bool Command::Parse(int argc, const char* const* argv) {
  std::vector<const char*> renamed(argv, argv + argc);
  for (const char*& a : renamed) {
    for (const auto& [from, to] : aliases_) {
      if (from == a) a = to.c_str();
    }
  }
  try {
    args_ = options_.parse(argc, renamed.data());
  } catch (const std::exception& e) {
    exit_code_ = Fail(e.what());
    return false;
  }
  if (args_.count("help")) {
    std::cout << options_.help() << "\n";
    exit_code_ = 0;
    return false;
  }
  if (!args_.unmatched().empty()) {
    exit_code_ = Fail("unexpected argument '" + args_.unmatched()[0] + "'");
    return false;
  }
  return true;
}

int Command::Fail(absl::string_view message) const {
  std::fprintf(stderr, "%s: error: %.*s\n", name_.c_str(), static_cast<int>(message.size()),
               message.data());
  return 1;
}

int Command::Usage(absl::string_view message) const {
  std::fprintf(stderr, "%s\n", options_.help().c_str());
  return Fail(message);
}

}  // namespace dpl::cli
