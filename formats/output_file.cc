#include "formats/output_file.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace dpl::formats {
namespace {

// ------------------------------------------- the table of live temp files ----
// Fixed storage the signal handler can read without allocating. A slot is
// kFree, kFilling (being written by Register), or kLive (the handler unlinks
// its path).
constexpr int kSlots = 16;
enum : int { kFree = 0, kFilling = 1, kLive = 2 };
struct Slot {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};
Slot g_slots[kSlots];
std::atomic<int> g_signal{0};  // the first cleanup signal received, or 0

int Register(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(kLive);
    return i;
  }
  return -1;
}

void Unregister(int slot) {
  if (slot >= 0) g_slots[slot].state.store(kFree);
}

// ---------------------------------------------------------- the handler ----

// Signals whose default action ends the process, that a program may catch,
// and that are not the crash signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL belong
// to sanitizers and fault handlers). SIGXFSZ is ignored instead (see .h).
constexpr int kCleanupSignals[] = {SIGHUP,  SIGINT,    SIGQUIT, SIGABRT, SIGPIPE, SIGALRM,
                                   SIGTERM, SIGUSR1,   SIGUSR2, SIGXCPU, SIGVTALRM,
                                   SIGPROF, SIGIO,     SIGPWR,  SIGSTKFLT};

const char* SignalName(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGABRT: return "SIGABRT";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGXCPU: return "SIGXCPU";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    case SIGIO: return "SIGIO";
    case SIGPWR: return "SIGPWR";
    case SIGSTKFLT: return "SIGSTKFLT";
    default: return "a real-time signal";
  }
}

void WriteStderr(const char* s) {
  const ssize_t ignored = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

sigset_t CleanupSet() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kCleanupSignals) sigaddset(&set, sig);
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig) sigaddset(&set, sig);
  return set;
}

// Every other cleanup signal is blocked while this runs (sa_mask).
void OnCleanupSignal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  bool removed = false;
  for (Slot& s : g_slots) {
    if (s.state.load() == kLive && ::unlink(s.path) == 0) removed = true;
  }
  if (removed) {
    WriteStderr(program_invocation_short_name);
    WriteStderr(": interrupted by ");
    WriteStderr(SignalName(sig));
    WriteStderr("; the unfinished output was removed\n");
  }
  // End by the same signal: default action, raised while blocked, then
  // unblocked so that it is delivered here and now.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
}

// Installs `handler` on `sig` if it is at its default action now.
void InstallIfDefault(int sig, void (*handler)(int), const sigset_t& mask) {
  struct sigaction old = {};
  if (::sigaction(sig, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sa.sa_mask = mask;
  sa.sa_flags = SA_RESTART;
  ::sigaction(sig, &sa, nullptr);
}

// Blocks the cleanup signals in this thread for its lifetime (Commit's
// rename and its bookkeeping happen together, or not at all).
class BlockCleanupSignals {
 public:
  BlockCleanupSignals() {
    const sigset_t set = CleanupSet();
    ::pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockCleanupSignals() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

// ---------------------------------------------------------------- paths ----

// `err` is errno, read by the caller before anything could change it.
absl::Status ErrnoError(int err, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT: return absl::NotFoundError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG: return absl::ResourceExhaustedError(msg);
    default: return absl::InternalError(msg);
  }
}

// "dir/" (with its slash, "" for the current directory) and the last name.
std::pair<std::string, std::string> SplitPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {"", path};
  return {path.substr(0, slash + 1), path.substr(slash + 1)};
}

size_t NameMax(const std::string& dir) {
  const long n = ::pathconf(dir.empty() ? "." : dir.c_str(), _PC_NAME_MAX);
  return n >= 14 && n <= NAME_MAX ? static_cast<size_t>(n) : NAME_MAX;
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Write permission on an existing file, as the rename would not ask it.
// root may write anything, so for root "read-only" means no write bit at all.
bool Writable(const std::string& path, const struct stat& st) {
  if (::geteuid() == 0) return (st.st_mode & 0222) != 0;
  return ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) == 0;
}

// Why `path` must not be (re)placed; OK when it may. `*existing` gets the
// stat of what is there (st_nlink 0 when nothing is).
absl::Status CheckOutputPath(const std::string& path, const std::vector<std::string>& inputs,
                             struct stat* existing) {
  *existing = {};
  if (path.empty()) return absl::InvalidArgumentError("empty output path");
  const std::string name = SplitPath(path).second;
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("output ", path, " names a directory, not a file"));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return absl::OkStatus();  // new file (or a dangling link)
    return ErrnoError(err, absl::StrCat("output ", path));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("output ", path, " is a directory"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output ", path, " exists and is not a regular file (device, FIFO or socket); not replacing it"));
  }
  for (const std::string& in : inputs) {
    struct stat ist;
    if (::stat(in.c_str(), &ist) == 0 && SameFile(st, ist)) {
      return absl::InvalidArgumentError(absl::StrCat("output ", path, " is the input ", in,
                                                     " (the same file); choose another output name"));
    }
  }
  if (!Writable(path, st)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output ", path, " exists and is read-only; not replacing it (remove it or make it writable)"));
  }
  *existing = st;
  return absl::OkStatus();
}

// Cuts `s` to at most `n` bytes without splitting a UTF-8 sequence.
std::string Utf8Prefix(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

std::string TempPathFor(const std::string& path, uint64_t n, size_t name_max) {
  const auto [dir, name] = SplitPath(path);
  const std::string suffix = absl::StrCat(".dpl-tmp-", ::getpid(), "-", n);
  const size_t room = name_max > suffix.size() + 1 ? name_max - suffix.size() - 1 : 0;
  std::string stem = name;
  if (stem.size() > room) {
    // Shortened names stay distinct: a hash of the whole name replaces the cut.
    const std::string hash = absl::StrFormat("~%08x", static_cast<uint32_t>(absl::HashOf(name)));
    stem = Utf8Prefix(name, room > hash.size() ? room - hash.size() : 0) + hash;
  }
  return absl::StrCat(dir, ".", stem, suffix);
}

void InstallSignalCleanup() {
  const sigset_t mask = CleanupSet();
  for (int sig : kCleanupSignals) InstallIfDefault(sig, OnCleanupSignal, mask);
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig) InstallIfDefault(sig, OnCleanupSignal, mask);
  InstallIfDefault(SIGXFSZ, SIG_IGN, mask);
}

absl::StatusOr<OutputFile> OutputFile::Create(const std::string& path,
                                              const OutputOptions& options) {
  struct stat existing;
  DPL_RETURN_IF_ERROR(CheckOutputPath(path, options.inputs, &existing));
  InstallSignalCleanup();
  OutputFile out;
  out.path_ = path;
  out.inputs_ = options.inputs;
  out.cancel_ = options.cancel;
  DPL_RETURN_IF_ERROR(out.Interrupted());
  const size_t name_max = NameMax(SplitPath(path).first);
  for (int attempt = 0; attempt < 100; ++attempt) {
    out.temp_ = TempPathFor(path, g_temp_counter++, name_max);
    // Registered before it exists: a signal between open and Register would
    // otherwise leave it.
    out.slot_ = Register(out.temp_);
    if (out.slot_ < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot start ", path, ": path too long or too many outputs at once"));
    }
    out.fd_ = ::open(out.temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out.fd_ >= 0) break;
    const int err = errno;
    Unregister(out.slot_);
    out.slot_ = -1;
    if (err != EEXIST) {
      return ErrnoError(err, absl::StrCat("cannot create a temporary file for ", path, " (",
                                          out.temp_, ")"));
    }
  }
  if (out.fd_ < 0) return absl::InternalError(absl::StrCat("no free temporary name for ", path));
  out.done_ = false;
  if (existing.st_nlink > 0 && ::fchmod(out.fd_, existing.st_mode & 0777) != 0) {
    return out.Fail(out.SysError("fchmod"));
  }
  return out;
}

OutputFile::OutputFile(OutputFile&& other) noexcept { *this = std::move(other); }

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this == &other) return *this;
  if (!done_) Abandon();
  path_ = std::move(other.path_);
  temp_ = std::move(other.temp_);
  inputs_ = std::move(other.inputs_);
  cancel_ = other.cancel_;
  fd_ = std::exchange(other.fd_, -1);
  slot_ = std::exchange(other.slot_, -1);
  done_ = std::exchange(other.done_, true);
  return *this;
}

OutputFile::~OutputFile() {
  if (!done_) Abandon();
}

absl::Status OutputFile::Interrupted() const {
  const int sig = g_signal.load();
  if (sig != 0 || (cancel_ != nullptr && cancel_->load())) {
    return absl::CancelledError(absl::StrCat(
        "interrupted", sig != 0 ? absl::StrCat(" by ", SignalName(sig)) : "", "; ", path_,
        " not written"));
  }
  return absl::OkStatus();
}

absl::Status OutputFile::SysError(const char* op, int64_t at) const {
  const int err = errno;  // before anything below can change it
  return ErrnoError(err, absl::StrCat("cannot write ", path_, " (", op, " ", temp_,
                                      at >= 0 ? absl::StrCat(" at ", at) : "", ")"));
}

absl::Status OutputFile::Fail(absl::Status error) {
  Abandon();
  return error;
}

void OutputFile::Abandon() {
  if (done_) return;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_.c_str());
  Unregister(slot_);
  slot_ = -1;
  done_ = true;
}

absl::Status OutputFile::Write(const void* data, uint64_t n, uint64_t offset) const {
  if (done_) return absl::FailedPreconditionError(absl::StrCat(path_, ": write after commit"));
  DPL_RETURN_IF_ERROR(Interrupted());
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return SysError("pwrite", offset);
    if (w == 0) return ErrnoError(EIO, absl::StrCat("cannot write ", path_, ": pwrite wrote nothing"));
    p += w;
    n -= static_cast<uint64_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status OutputFile::Resize(uint64_t bytes) const {
  if (done_) return absl::FailedPreconditionError(absl::StrCat(path_, ": resize after commit"));
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) return SysError("ftruncate", bytes);
  return absl::OkStatus();
}

absl::Status OutputFile::Commit() {
  if (done_) return absl::FailedPreconditionError(absl::StrCat(path_, ": nothing to commit"));
  if (absl::Status s = Interrupted(); !s.ok()) return Fail(s);
  if (::fsync(fd_) != 0) return Fail(SysError("fsync"));
  if (::close(std::exchange(fd_, -1)) != 0) return Fail(SysError("close"));
  struct stat existing;
  if (absl::Status s = CheckOutputPath(path_, inputs_, &existing); !s.ok()) return Fail(s);
  {
    BlockCleanupSignals block;  // a signal now lands after the rename, or before this
    if (absl::Status s = Interrupted(); !s.ok()) return Fail(s);
    if (::rename(temp_.c_str(), path_.c_str()) != 0) return Fail(SysError("rename"));
    Unregister(slot_);
    slot_ = -1;
    done_ = true;
  }
  const std::string dir = SplitPath(path_).first;
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the rename durable; the data already is
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 const OutputOptions& options) {
  DPL_ASSIGN_OR_RETURN(OutputFile out, OutputFile::Create(path, options));
  DPL_RETURN_IF_ERROR(out.Write(bytes.data(), bytes.size(), 0));
  return out.Commit();
}

}  // namespace dpl::formats
