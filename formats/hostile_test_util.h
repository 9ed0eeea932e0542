// The hostile-file table both reader tests run (gguf_test, dpl_file_test):
// each named corrupt file must be rejected with a message that names the
// problem, and its twin, the closest valid file, must parse; and RunBounded,
// which runs a parse in a child process under issue 11's memory and time
// bounds. Include only from a doctest test.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
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

// What a bounded run ended with.
struct BoundedRun {
  bool exited = false;     // fn returned (not killed, not timed out)
  int signal = 0;          // the signal that killed the child, if any
  bool timed_out = false;  // killed by the time bound
  bool ok = false;         // fn's status was OK
  std::string message;     // fn's status message
  double seconds = 0;

  std::string Describe() const {
    if (timed_out) return "timed out after " + std::to_string(seconds) + " s";
    if (!exited) return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
    return (ok ? "OK" : "error: " + message) + " in " + std::to_string(seconds) + " s";
  }
};

// Runs fn in a forked child under an address-space limit (RLIMIT_AS) and a
// CPU/wall time bound (alarm), so that a crash, a runaway allocation or a
// hang fails the test instead of taking it down. fn must not use doctest's
// macros (it runs in the child).
inline BoundedRun RunBounded(const std::function<absl::Status()>& fn, uint64_t max_address_bytes,
                             unsigned max_seconds) {
  BoundedRun run;
  int fds[2];
  if (::pipe(fds) != 0) return run;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    struct rlimit rl = {max_address_bytes, max_address_bytes};
    ::setrlimit(RLIMIT_AS, &rl);
    ::alarm(max_seconds);
    const absl::Status s = fn();
    const std::string out = std::string(s.ok() ? "1" : "0") + std::string(s.message());
    for (size_t at = 0; at < out.size();) {
      const ssize_t w = ::write(fds[1], out.data() + at, out.size() - at);
      if (w <= 0) break;
      at += static_cast<size_t>(w);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.exited = WIFEXITED(status) && !got.empty();
  run.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  run.timed_out = run.signal == SIGALRM;
  run.ok = run.exited && got[0] == '1';
  if (run.exited) run.message = got.substr(1);
  return run;
}

// 3 GB of address space and 10 s: the bounds issue 11 sets for every
// hostile file.
inline constexpr uint64_t kHostileMaxAddressBytes = 3ull << 30;
inline constexpr unsigned kHostileMaxSeconds = 10;

}  // namespace dpl::formats
