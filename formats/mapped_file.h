// Read-only memory mapping of a whole regular file (POSIX mmap), and reads of
// it that survive the file shrinking underneath. Movable, not copyable.
//
// The mapping is MAP_SHARED (PROT_READ: nothing can write through it, so
// it reads as a private one would) because a GPU can copy straight from its
// pages once they are pinned: cudaHostRegister (read-only) pins a shared
// file mapping's pages at ~26 GB/s, where on a MAP_PRIVATE one the call
// did not return within 25 s (H100 box, driver 580, Linux 6.18; docs/PERF.md
// "Start-up").
//
// Opening: the path is opened O_RDONLY | O_NONBLOCK | O_CLOEXEC and fstat'ed
// before anything is read, so a FIFO, a device or a directory is refused at
// once ("PATH: not a regular file (a FIFO)") instead of blocking in open() or
// read(); O_NONBLOCK is then cleared. The descriptor stays open so the size
// can be checked again after a read.
//
// Truncation while mapped: a page of a mapping past the end of the file
// raises SIGBUS when touched (a file truncated while it is converted,
// checksummed or loaded). Every mapping with data is registered with one
// process-wide SIGBUS handler (sigaction, SA_SIGINFO, installed on the first
// Open; faults outside every mapping go to the previous handler, or kill as
// before). For a fault inside a mapping the handler maps anonymous zero pages
// over the rest of that mapping (from the faulting page to its end, one mmap
// with MAP_FIXED), records the offset and returns: the faulting load is
// retried and reads zeros, and so does every later read of that range.
// Intact() then reports the fault, and SafeRead(fn) returns fn's result only
// when no fault happened and the file is still as large as the mapping.
//
// Why zero pages and not sigsetjmp/siglongjmp: the code that reads mappings
// is zstd, XXH3 and C++ with destructors (vectors, strings, Status) in the
// frames between the read and any setjmp point; a longjmp over them skips
// those destructors (undefined behaviour in C++) and leaves zstd contexts
// half-used. Patching the mapping lets every frame unwind normally; the
// reader finishes on zeros (at most the rest of the file's bytes) and the
// caller turns the recorded fault into an error naming the file.
//
// The registry has kMaxGuardedMappings slots; a mapping opened while all are
// taken is still read correctly but a truncation under it kills the process
// as before (SafeRead still compares the size afterwards).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"

namespace dpl::formats {

inline constexpr int kMaxGuardedMappings = 256;

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to size 0 with a null data().
  // Errors name the path: missing, not a regular file, mmap failure.
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Reads bytes [offset, offset + len) of the mapping into this process's
  // page tables now (madvise MADV_POPULATE_READ, Linux 5.14+; MADV_WILLNEED,
  // a readahead hint, before), so that later reads of them take no page
  // faults; from the file when it is not in the page cache. A hint: true
  // when the pages are mapped, false when the kernel could not (too old, or
  // the range is past a truncated end: no SIGBUS, the reads that follow
  // find it). Thread-safe; disjoint ranges populate in parallel.
  // Why (issue 33, H100 box, 14B, docs/PERF.md "Start-up"): 16 threads
  // copying from a fresh mapping move 38.8 GB/s, from a populated one 46.3;
  // populating it takes 7 ms, alongside the CUDA context's ~200.
  bool Populate(uint64_t offset, uint64_t len) const;

  // OK while every byte read so far came from the file and the file is still
  // at least size() bytes long; otherwise DataLoss naming the path, the
  // offset of the first failed read and the file's size now.
  absl::Status Intact() const;
  // Runs fn (which may read this mapping from any thread), then Intact():
  // fn's status when the mapping stayed intact, the truncation error when not
  // (whatever fn said, since it may have read zeros).
  absl::Status SafeRead(const std::function<absl::Status()>& fn) const;

 private:
  MappedFile(std::string path, int fd, const uint8_t* data, uint64_t size, int slot)
      : path_(std::move(path)), fd_(fd), data_(data), size_(size), slot_(slot) {}
  std::string path_;
  int fd_;
  const uint8_t* data_;
  uint64_t size_;
  int slot_;  // registry slot of the SIGBUS guard; -1: unguarded
};

// SafeRead through `m`, or fn alone when there is no mapping (an image in
// memory).
absl::Status SafeReadOf(const MappedFile* m, const std::function<absl::Status()>& fn);

// Parses a mapped file with T::Parse(data, size, owner) under SafeRead, the
// result keeping the mapping alive (and reading through it safely with its
// own SafeRead); errors are prefixed with the file's path.
template <typename T>
absl::StatusOr<T> ParseMapped(const std::shared_ptr<MappedFile>& m) {
  absl::StatusOr<T> parsed = absl::UnknownError("not parsed");
  DPL_RETURN_IF_ERROR(m->SafeRead([&] {  // a truncation error names the path
    parsed = T::Parse(m->data(), m->size(), m);
    return absl::OkStatus();
  }));
  DPL_RETURN_IF_ERROR(dpl::Annotate(dpl::StatusOf(parsed), m->path()));
  parsed->mapping_ = m;
  return parsed;
}

// Maps `path` and parses it as above.
template <typename T>
absl::StatusOr<T> OpenMapped(const std::string& path) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<MappedFile> m, MappedFile::Open(path));
  return ParseMapped<T>(m);
}

}  // namespace dpl::formats
