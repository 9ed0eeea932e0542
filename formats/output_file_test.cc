// OutputFile: whole or nothing. Commit, abandon, long names, refusals (the
// input, read-only, not a file), cancellation, every cleanup signal (in a
// forked child, which must die by that signal and leave no temp file), and
// write errors: EFBIG under RLIMIT_FSIZE, ENOSPC on a 64 KiB tmpfs when a
// private mount namespace can be had.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "formats/output_file.h"
#include "tests/shared_dir.h"

namespace dpl::formats {
namespace {
namespace fs = std::filesystem;

// A fresh empty directory per test case.
std::string Dir(const std::string& name) {
  const fs::path d = fs::path(testing::TempDir()) / ("out-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void Put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Names in `dir` other than `keep`: temp files left behind would show here.
std::vector<std::string> Others(const std::string& dir, std::vector<std::string> keep) {
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (std::find(keep.begin(), keep.end(), n) == keep.end()) left.push_back(n);
  }
  return left;
}

bool Has(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// Runs `body` in a forked child; returns its wait status. The child resets
// every signal doctest handles to the default first.
int InChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGABRT, SIGSEGV, SIGILL, SIGFPE}) ::signal(sig, SIG_DFL);
    const struct rlimit no_core = {0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::_exit(body());
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

TEST_CASE("commit: the bytes appear at the path, written in any order, holes read as zeros") {
  const std::string dir = Dir("commit");
  const std::string path = dir + "/m.bin";
  Put(path, "old contents");
  ::chmod(path.c_str(), 0600);
  {
    absl::StatusOr<OutputFile> out = OutputFile::Create(path);
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
    const std::string temp = fs::path(out->temp_path()).filename().string();
    CHECK(temp.rfind(".m.bin.dpl-tmp-", 0) == 0);  // hidden, next to the output
    CHECK(fs::path(out->temp_path()).parent_path() == fs::path(dir));
    REQUIRE(out->Resize(12).ok());
    REQUIRE(out->Write("world", 5, 7).ok());
    REQUIRE(out->Write("hello", 5, 0).ok());
    CHECK(Read(path) == "old contents");  // untouched until Commit
    REQUIRE(out->Commit().ok());
    CHECK(!out->Commit().ok());
    CHECK(!out->Write("x", 1, 0).ok());
  }
  CHECK(Read(path) == std::string("hello\0\0world", 12));
  CHECK((fs::status(path).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));
  CHECK(Others(dir, {"m.bin"}).empty());
  REQUIRE(WriteFileAtomically(dir + "/n.bin", "abc").ok());
  CHECK(Read(dir + "/n.bin") == "abc");
}

TEST_CASE("abandon: an uncommitted file vanishes and the old file stays") {
  const std::string dir = Dir("abandon");
  const std::string path = dir + "/keep.bin";
  Put(path, "previous");
  {
    absl::StatusOr<OutputFile> out = OutputFile::Create(path);
    REQUIRE(out.ok());
    REQUIRE(out->Write("new bytes", 9, 0).ok());
    CHECK(fs::exists(out->temp_path()));
    OutputFile moved = std::move(*out);  // moving hands the file over
    CHECK(fs::exists(moved.temp_path()));
  }
  CHECK(Read(path) == "previous");
  CHECK(Others(dir, {"keep.bin"}).empty());
  absl::StatusOr<OutputFile> out = OutputFile::Create(path);
  REQUIRE(out.ok());
  out->Abandon();
  CHECK(Others(dir, {"keep.bin"}).empty());
  CHECK(!out->Commit().ok());
}

TEST_CASE("long names: a 255-byte output name works; shortened temp names stay distinct") {
  const std::string dir = Dir("long");
  for (size_t len : {200, 240, 254, 255}) {
    CAPTURE(len);
    const std::string path = dir + "/" + std::string(len - 4, 'n') + ".dpl";
    REQUIRE(WriteFileAtomically(path, "x").ok());
    CHECK(Read(path) == "x");
    CHECK(Others(dir, {fs::path(path).filename().string()}).empty());
    fs::remove(path);
  }
  const std::string a = TempPathFor(dir + "/" + std::string(250, 'a') + "1", 7, 255);
  const std::string b = TempPathFor(dir + "/" + std::string(250, 'a') + "2", 7, 255);
  CHECK(fs::path(a).filename().string().size() <= 255);
  CHECK(a != b);
  // Never cut inside a UTF-8 sequence: 2-byte characters, any length.
  std::string utf8;
  for (int i = 0; i < 127; ++i) utf8 += "\xc3\xa9";
  const std::string t = fs::path(TempPathFor(utf8, 0, 255)).filename().string();
  CHECK(t.size() <= 255);
  CHECK(t.find("\xc3~") == std::string::npos);
  CHECK(TempPathFor("x.dpl", 3, 255).rfind(".x.dpl.dpl-tmp-", 0) == 0);
}

TEST_CASE("refusals: the input (also through a symlink or a hard link), read-only, not a file") {
  const std::string dir = Dir("refuse");
  const std::string in = dir + "/in.gguf";
  Put(in, "input bytes");
  ::symlink("in.gguf", (dir + "/link.gguf").c_str());
  ::link(in.c_str(), (dir + "/hard.gguf").c_str());
  OutputOptions opt;
  opt.inputs = {in};
  struct Row {
    std::string name, out, want;
  } rows[] = {
      {"same path", in, "is the input"},
      {"symlink to the input", dir + "/link.gguf", "is the input"},
      {"hard link to the input", dir + "/hard.gguf", "is the input"},
      {"input named through a symlink", dir + "/./in.gguf", "is the input"},
      {"a directory", dir, "is a directory"},
      {"a trailing slash", dir + "/sub/", "names a directory"},
      {"empty", "", "empty output path"},
      {"a device", "/dev/null", "not a regular file"},
  };
  for (const Row& r : rows) {
    CAPTURE(r.name);
    absl::StatusOr<OutputFile> out = OutputFile::Create(r.out, opt);
    REQUIRE(!out.ok());
    CHECK_MESSAGE(Has(out.status(), r.want), out.status().ToString());
  }
  opt.inputs = {dir + "/link.gguf"};  // the input given as a link, the output as the file
  CHECK(Has(OutputFile::Create(in, opt).status(), "is the input"));
  CHECK(Read(in) == "input bytes");
  CHECK(Others(dir, {"in.gguf", "link.gguf", "hard.gguf"}).empty());

  const std::string ro = dir + "/ro.dpl";
  Put(ro, "read-only");
  ::chmod(ro.c_str(), 0444);
  absl::Status s = WriteFileAtomically(ro, "new");
  CHECK_MESSAGE(Has(s, "read-only"), s.ToString());
  CHECK(Read(ro) == "read-only");
  // Clean twins: another name, and the same file once writable.
  CHECK(WriteFileAtomically(dir + "/other.dpl", "ok", opt).ok());
  ::chmod(ro.c_str(), 0644);
  CHECK(WriteFileAtomically(ro, "new").ok());
  CHECK(Read(ro) == "new");
  CHECK(Has(WriteFileAtomically(dir + "/no/such/dir/x", "x"), "cannot create a temporary file"));
}

TEST_CASE("cancellation: Write and Commit refuse and nothing is left") {
  const std::string dir = Dir("cancel");
  const std::string path = dir + "/c.bin";
  Put(path, "before");
  std::atomic<bool> cancel{false};
  OutputOptions opt;
  opt.cancel = &cancel;
  absl::StatusOr<OutputFile> out = OutputFile::Create(path, opt);
  REQUIRE(out.ok());
  REQUIRE(out->Write("after", 5, 0).ok());
  cancel = true;
  CHECK(out->Write("x", 1, 0).code() == absl::StatusCode::kCancelled);
  const absl::Status s = out->Commit();
  CHECK(s.code() == absl::StatusCode::kCancelled);
  CHECK(Has(s, "not written"));
  CHECK(Read(path) == "before");
  CHECK(Others(dir, {"c.bin"}).empty());
  CHECK(OutputFile::Create(path, opt).status().code() == absl::StatusCode::kCancelled);
}

TEST_CASE("every cleanup signal during a write ends the process by that signal, no temp left") {
  const std::string dir = Dir("signals");
  const std::string path = dir + "/s.bin";
  Put(path, "before");
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM, SIGABRT,
                  SIGXCPU, SIGRTMIN + 1}) {
    CAPTURE(sig);
    const int status = InChild([&] {
      absl::StatusOr<OutputFile> out = OutputFile::Create(path);
      if (!out.ok() || !out->Write("partial", 7, 0).ok()) return 3;
      ::raise(sig);
      return 4;  // not reached
    });
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == sig);
    CHECK(Read(path) == "before");
    CHECK(Others(dir, {"s.bin"}).empty());
  }
  // A signal the parent ignored (nohup) stays ignored; the write goes on.
  const int status = InChild([&] {
    ::signal(SIGHUP, SIG_IGN);
    absl::StatusOr<OutputFile> out = OutputFile::Create(path);
    if (!out.ok() || !out->Write("after", 5, 0).ok()) return 3;
    ::raise(SIGHUP);
    return out->Commit().ok() ? 0 : 5;
  });
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(Read(path) == "after");
}

TEST_CASE("a file-size limit is a write error (EFBIG) naming the path; the temp file goes") {
  const std::string dir = Dir("efbig");
  const std::string path = dir + "/big.bin";
  const int status = InChild([&] {
    const struct rlimit limit = {64 << 10, 64 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 2;
    const std::string mib(1 << 20, 'x');
    absl::StatusOr<OutputFile> out = OutputFile::Create(path);
    if (!out.ok()) return 3;
    const absl::Status s = out->Write(mib.data(), mib.size(), 0);
    if (s.ok() || !Has(s, "big.bin") || !Has(s, "File too large")) return 4;
    return 0;  // the destructor removed the temp file
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(Others(dir, {}).empty());
}

TEST_CASE("a full disk (ENOSPC on a 64 KiB tmpfs) is a write error; the temp file goes") {
  const std::string dir = Dir("enospc");
  const int status = InChild([&] {
    // A private mount namespace: the tmpfs is seen by this child only.
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") != 0) {
      return 77;
    }
    const std::string mib(1 << 20, 'x');
    const absl::Status s = WriteFileAtomically(dir + "/full.bin", mib);
    if (s.ok() || !Has(s, "full.bin") || !Has(s, "No space left")) return 4;
    return Others(dir, {}).empty() ? 0 : 5;
  });
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    MESSAGE("no private tmpfs here (not root?): ENOSPC covered by the EFBIG case only");
    return;
  }
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace dpl::formats
