// Output files that appear whole or not at all: the one way dpl-convert,
// dpl-synth and dpl-run (--dump-logits) write a file.
//
//   OutputOptions opt;
//   opt.inputs = {in_path};                            // never replace the input
//   DPL_ASSIGN_OR_RETURN(OutputFile out, OutputFile::Create(path, opt));
//   DPL_RETURN_IF_ERROR(out.Write(bytes, n, offset));   // any order, any thread
//   DPL_RETURN_IF_ERROR(out.Commit());                  // path now holds the bytes
//   // any return before Commit (an error, an exception) removes the temp file
//
// The bytes go to a hidden temporary file next to `path`
// (`DIR/.NAME.dpl-tmp-PID-N`; NAME shortened and hashed when the whole would
// exceed the file system's NAME_MAX, so any valid `path` works). Commit
// fsyncs it, renames it over `path` and fsyncs the directory.
//
// Signals. The first Create installs, for every catchable signal whose
// default action ends the process and that is not ignored (SIGINT, SIGTERM,
// SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM, SIGABRT, SIGXCPU,
// SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT and the real-time signals),
// a handler that unlinks every live temporary file of the process (a fixed
// table of paths; unlink and write only, async-signal-safe), says so on
// stderr and then ends the process by that same signal (default action). A
// signal before the rename in Commit therefore means: killed by the signal,
// no output, an existing file at `path` untouched. One that lands after the
// rename leaves the finished file. Signals a program handles itself or that
// its parent ignored (nohup) are left alone. SIGXFSZ is ignored instead, so
// that exceeding RLIMIT_FSIZE is a write error (EFBIG) like a full disk.
// Programs that want a closed stdout to be an EPIPE error rather than a
// SIGPIPE death ignore SIGPIPE before their first Create.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dpl::formats {

struct OutputOptions {
  // Files the output must never replace: the program's inputs. Create (and
  // Commit again) refuses when `path` is one of them: the same device and
  // inode, so a symlink or a hard link to an input is refused too.
  std::vector<std::string> inputs;
  // When set, Write and Commit refuse (kCancelled) and the temp file goes.
  const std::atomic<bool>* cancel = nullptr;
};

class OutputFile {
 public:
  // Starts `path`. Refused (kInvalidArgument / kFailedPrecondition, nothing
  // created) when `path` is empty or names a directory, exists as something
  // other than a regular file, exists without write permission (read-only:
  // never replaced silently), or is one of `options.inputs`. An existing
  // regular file's permission bits carry over to the new file.
  static absl::StatusOr<OutputFile> Create(const std::string& path,
                                           const OutputOptions& options = {});

  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();  // Abandon() unless committed

  // Writes all `n` bytes at `offset` (pwrite, retried on short writes and
  // EINTR). Safe from several threads for disjoint ranges. Errors (ENOSPC,
  // EFBIG, EIO) name `path` and the temp file; the caller returns the error
  // and the destructor removes the temp file.
  absl::Status Write(const void* data, uint64_t n, uint64_t offset) const;
  // Sets the temp file's size (ftruncate): holes read as zeros.
  absl::Status Resize(uint64_t bytes) const;

  // fsync, the checks again (cancelled or signalled: refused; `path` still
  // not an input, not read-only), rename over `path`, fsync the directory.
  // On any error the temp file is removed and `path` is left as it was.
  absl::Status Commit();
  // Closes and removes the temp file now (the destructor's job, earlier).
  void Abandon();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

 private:
  OutputFile() = default;
  absl::Status Interrupted() const;
  absl::Status Fail(absl::Status error);  // Abandon(), then the error
  // "cannot write PATH (OP TEMP [at AT]): strerror(errno)".
  absl::Status SysError(const char* op, int64_t at = -1) const;

  std::string path_;
  std::string temp_;
  std::vector<std::string> inputs_;
  const std::atomic<bool>* cancel_ = nullptr;
  int fd_ = -1;
  int slot_ = -1;  // in the process-wide table of live temp files
  bool done_ = true;  // committed, abandoned or moved from
};

// Create + Write(bytes at 0) + Commit: `path` holds exactly `bytes`, or is
// untouched and no temp file is left (dpl-run --dump-logits uses this).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 const OutputOptions& options = {});

// Installs the signal cleanup described above on every listed signal that is
// at its default action now. Create calls it; idempotent; a program calls it
// itself only to have it in place before its first Create.
void InstallSignalCleanup();

// The hidden temporary name Create uses for `path` with counter `n`: at most
// `name_max` bytes in its last component. Exposed for tests.
std::string TempPathFor(const std::string& path, uint64_t n, size_t name_max);

}  // namespace dpl::formats
