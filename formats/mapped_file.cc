#include "formats/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace dpl::formats {
namespace {

constexpr uint64_t kNoFault = ~uint64_t{0};

// One guarded mapping: [begin, end) in the address space and the offset of
// its first SIGBUS. The handler reads the slots without locks; Register and
// Unregister (under g_registry_mu) publish begin last and clear it first.
struct GuardSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<uint64_t> fault{kNoFault};
};
GuardSlot g_slots[kMaxGuardedMappings];
bool g_slot_used[kMaxGuardedMappings];  // under g_registry_mu
std::mutex g_registry_mu;
std::once_flag g_install_once;
struct sigaction g_previous_action;
uintptr_t g_page_bytes = 4096;

// The handler a fault outside every mapping goes to: the one installed
// before ours, or the default (which kills, as if we were never there).
void ForwardSigbus(int sig, siginfo_t* info, void* ctx) {
  const struct sigaction& prev = g_previous_action;
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, ctx);
    return;
  }
  if ((prev.sa_flags & SA_SIGINFO) == 0 && prev.sa_handler != SIG_DFL &&
      prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  // A fault re-executes the load and dies; a signal sent by kill() must be
  // raised again.
  if (info->si_code <= 0) ::raise(sig);
}

// SIGBUS: a fault inside a guarded mapping maps zero pages from the faulting
// page to the end of that mapping and records the offset (see mapped_file.h).
// Only atomics and mmap(2), a plain system call, run here.
void OnSigbus(int sig, siginfo_t* info, void* ctx) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardSlot& slot : g_slots) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin) continue;
    const uintptr_t end = slot.end.load(std::memory_order_acquire);
    if (addr >= end) continue;
    const uintptr_t page = addr & ~(g_page_bytes - 1);
    void* p = ::mmap(reinterpret_cast<void*>(page), end - page, PROT_READ,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) break;
    uint64_t first = slot.fault.load(std::memory_order_relaxed);
    const uint64_t offset = addr - begin;
    while (offset < first && !slot.fault.compare_exchange_weak(first, offset)) {
    }
    return;
  }
  ForwardSigbus(sig, info, ctx);
}

void InstallSigbusHandler() {
  g_page_bytes = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  struct sigaction sa = {};
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous_action);
}

// A free slot for [data, data + bytes rounded up to pages), or -1.
int Register(const uint8_t* data, uint64_t bytes) {
  std::call_once(g_install_once, InstallSigbusHandler);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = (begin + bytes + g_page_bytes - 1) & ~(g_page_bytes - 1);
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (int i = 0; i < kMaxGuardedMappings; ++i) {
    if (g_slot_used[i]) continue;
    g_slot_used[i] = true;
    g_slots[i].fault.store(kNoFault);
    g_slots[i].end.store(end, std::memory_order_release);
    g_slots[i].begin.store(begin, std::memory_order_release);
    return i;
  }
  return -1;
}

void Unregister(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_registry_mu);
  g_slots[slot].begin.store(0, std::memory_order_release);
  g_slots[slot].end.store(0, std::memory_order_release);
  g_slot_used[slot] = false;
}

absl::string_view KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

absl::Status Errno(const std::string& path, absl::string_view what, int err) {
  const std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
}

// A blocking read-only descriptor of the regular file at `path` and its size.
// Opened non-blocking so that a FIFO cannot block open(), checked with fstat
// before anything is read.
absl::StatusOr<int> OpenRegular(const std::string& path, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Errno(path, "cannot open", errno);
  struct stat st;
  absl::Status error;
  if (::fstat(fd, &st) != 0) {
    error = Errno(path, "fstat", errno);
  } else if (!S_ISREG(st.st_mode)) {
    error = absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file (", KindOf(st.st_mode), ")"));
  } else {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) error = Errno(path, "fcntl", errno);
  }
  if (!error.ok()) {
    ::close(fd);
    return error;
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

}  // namespace

absl::StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  uint64_t size = 0;
  DPL_ASSIGN_OR_RETURN(const int fd, OpenRegular(path, &size));
  const uint8_t* data = nullptr;
  int slot = -1;
  if (size > 0) {
    // MAP_SHARED: read-only either way, and its pages can be pinned for DMA
    // (MappedFile's header says why).
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Errno(path, "mmap", err);
    }
    data = static_cast<const uint8_t*>(p);
    slot = Register(data, size);
  }
  return std::shared_ptr<MappedFile>(new MappedFile(path, fd, data, size, slot));
}

MappedFile::~MappedFile() {
  Unregister(slot_);
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  ::close(fd_);
}

bool MappedFile::Populate(uint64_t offset, uint64_t len) const {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14; older headers lack it
#endif
  if (data_ == nullptr || offset >= size_) return len == 0;
  len = std::min(len, size_ - offset);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (reinterpret_cast<uintptr_t>(data_) + offset) / page * page;
  const uint64_t end = reinterpret_cast<uintptr_t>(data_) + offset + len;
  void* at = reinterpret_cast<void*>(begin);
  if (::madvise(at, end - begin, MADV_POPULATE_READ) == 0) return true;
  if (errno == EINVAL) ::madvise(at, end - begin, MADV_WILLNEED);  // a kernel before 5.14
  return false;
}

absl::Status MappedFile::Intact() const {
  struct stat st;
  const bool stat_ok = ::fstat(fd_, &st) == 0;
  const uint64_t now = stat_ok ? static_cast<uint64_t>(st.st_size) : 0;
  const uint64_t fault = slot_ >= 0 ? g_slots[slot_].fault.load() : kNoFault;
  if (fault != kNoFault) {
    return absl::DataLossError(absl::StrCat(
        path_, ": reading offset ", fault, " failed (bus error): the file was truncated to ", now,
        " bytes while mapped (", size_, " bytes), or its storage failed"));
  }
  if (stat_ok && now < size_) {
    return absl::DataLossError(absl::StrCat(path_, ": the file shrank from ", size_, " to ", now,
                                            " bytes while it was being read"));
  }
  return absl::OkStatus();
}

absl::Status MappedFile::SafeRead(const std::function<absl::Status()>& fn) const {
  absl::Status s = fn();
  DPL_RETURN_IF_ERROR(Intact());
  return s;
}

absl::Status SafeReadOf(const MappedFile* m, const std::function<absl::Status()>& fn) {
  return m == nullptr ? fn() : m->SafeRead(fn);
}

}  // namespace dpl::formats
