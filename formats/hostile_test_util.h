// The hostile-file table both reader tests run (gguf_test, dpl_file_test):
// each named corrupt file must be rejected with a message that names the
// problem, and its twin, the closest valid file, must parse. Include only
// from a doctest test.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dpl::formats {

// `Spec` describes a file image field by field (RawGguf, DplSpec).
template <typename Spec>
struct HostileCase {
  const char* name;
  std::function<void(Spec&)> corrupt;  // makes the file invalid
  std::function<void(Spec&)> twin;     // the closest valid file
  const char* expect;                  // substring of the error message
};

// For every case: valid() corrupted must fail parse() with `expect` in the
// message; valid() with the twin applied must pass.
template <typename Spec>
void CheckHostileCases(const std::vector<HostileCase<Spec>>& cases,
                       const std::function<Spec()>& valid,
                       const std::function<absl::Status(const Spec&)>& parse) {
  for (const HostileCase<Spec>& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    Spec bad = valid();
    c.corrupt(bad);
    const absl::Status bad_status = parse(bad);
    CHECK_MESSAGE(!bad_status.ok(), name, " was accepted");
    if (!bad_status.ok()) {
      const std::string msg(bad_status.message());
      CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, name, ": ", msg);
    }
    Spec good = valid();
    c.twin(good);
    const absl::Status good_status = parse(good);
    CHECK_MESSAGE(good_status.ok(), name, " twin: ", good_status.ToString());
  }
}

}  // namespace dpl::formats
