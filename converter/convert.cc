#include "converter/convert.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "formats/byte_reader.h"
#include "formats/parallel_for.h"
#include "formats/q6k_dpl.h"

namespace dpl::converter {
namespace {

using formats::DplFile;
using formats::DplHeader;
using formats::DplTensorEntry;
using formats::GgmlType;
using formats::GgufFile;
using formats::GgufTensorInfo;
using formats::TensorLayout;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Writes all of buf at offset, retrying short writes.
absl::Status PwriteAll(int fd, const void* buf, uint64_t n, uint64_t offset,
                       const std::string& path) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, std::min<uint64_t>(n, 1ull << 30), offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    p += w;
    n -= w;
    offset += w;
  }
  return absl::OkStatus();
}

// A temporary output file that is unlinked unless committed.
class TempOutput {
 public:
  explicit TempOutput(std::string final_path)
      : final_(std::move(final_path)), temp_(absl::StrCat(final_, ".tmp-", ::getpid())) {}
  ~TempOutput() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
  }
  absl::Status Create() {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Errno("cannot create", temp_);
    return absl::OkStatus();
  }
  int fd() const { return fd_; }
  const std::string& path() const { return temp_; }
  // fsync, rename over the final path, fsync the directory.
  absl::Status Commit(uint64_t size) {
    if (::ftruncate(fd_, size) != 0) return Errno("truncate", temp_);
    if (::fsync(fd_) != 0) return Errno("fsync", temp_);
    if (::close(fd_) != 0) {
      fd_ = -1;
      return Errno("close", temp_);
    }
    fd_ = -1;
    if (::rename(temp_.c_str(), final_.c_str()) != 0) return Errno("rename to", final_);
    committed_ = true;
    const size_t slash = final_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : final_.substr(0, slash + 1);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return absl::OkStatus();
  }

 private:
  std::string final_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Collects the logical data region as a stream of bytes and hands it on in
// fixed-size chunks. Uncompressed: each chunk is written by a background
// thread while the next one fills (reading overlaps writing). Compressed:
// chunks are frames, compressed in parallel batches and written in order.
class RegionSink {
 public:
  RegionSink(int fd, std::string path, uint64_t data_offset, const ConvertOptions& opt)
      : fd_(fd), path_(std::move(path)), write_at_(data_offset), opt_(opt) {
    chunk_bytes_ = opt.compress ? opt.frame_bytes : (64ull << 20);
    threads_ = opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
    batch_frames_ = opt.compress ? static_cast<size_t>(threads_) * 2 : 1;
    fill_.reserve(chunk_bytes_ * batch_frames_);
  }

  absl::Status Append(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      const uint64_t room = chunk_bytes_ * batch_frames_ - fill_.size();
      const uint64_t take = std::min(room, n);
      fill_.insert(fill_.end(), p, p + take);
      p += take;
      n -= take;
      if (fill_.size() == chunk_bytes_ * batch_frames_) {
        absl::Status s = Flush();
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  absl::Status AppendZeros(uint64_t n) {
    static const uint8_t kZeros[4096] = {};
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, sizeof(kZeros));
      absl::Status s = Append(kZeros, take);
      if (!s.ok()) return s;
      n -= take;
    }
    return absl::OkStatus();
  }

  // Flushes what is buffered (the last, possibly short, chunk) and waits for
  // all writes.
  absl::Status Finish() {
    absl::Status s = fill_.empty() ? absl::OkStatus() : Flush();
    absl::Status w = WaitWriter();
    return s.ok() ? w : s;
  }

  uint64_t stored_bytes() const { return stored_; }
  // Compressed form: stored size of each frame, in order.
  const std::vector<uint64_t>& frame_sizes() const { return frame_sizes_; }

 private:
  absl::Status WaitWriter() {
    if (!pending_.valid()) return absl::OkStatus();
    return pending_.get();
  }

  absl::Status Flush() {
    absl::Status s = WaitWriter();  // the previous buffer is free again
    if (!s.ok()) return s;
    if (!opt_.compress) {
      std::swap(fill_, writing_);
      fill_.clear();
      const uint64_t at = write_at_;
      write_at_ += writing_.size();
      stored_ += writing_.size();
      pending_ = std::async(std::launch::async, [this, at] {
        return PwriteAll(fd_, writing_.data(), writing_.size(), at, path_);
      });
      return absl::OkStatus();
    }
    // Compress every frame of the batch in parallel, then write them in order.
    const size_t n_frames = (fill_.size() + chunk_bytes_ - 1) / chunk_bytes_;
    std::vector<std::string> out(n_frames);
    absl::Status compressed = formats::ParallelFor(threads_, n_frames, [&](size_t i) {
      const uint64_t begin = i * chunk_bytes_;
      const uint64_t len = std::min<uint64_t>(chunk_bytes_, fill_.size() - begin);
      out[i].resize(ZSTD_compressBound(len));
      const size_t got = ZSTD_compress(out[i].data(), out[i].size(), fill_.data() + begin, len,
                                       opt_.compress_level);
      if (ZSTD_isError(got)) return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(got)));
      out[i].resize(got);
      return absl::OkStatus();
    });
    if (!compressed.ok()) return compressed;
    for (const std::string& f : out) {
      absl::Status w = PwriteAll(fd_, f.data(), f.size(), write_at_, path_);
      if (!w.ok()) return w;
      write_at_ += f.size();
      stored_ += f.size();
      frame_sizes_.push_back(f.size());
    }
    fill_.clear();
    return absl::OkStatus();
  }

  int fd_;
  std::string path_;
  uint64_t write_at_;
  const ConvertOptions& opt_;
  uint64_t chunk_bytes_;
  int threads_;
  size_t batch_frames_;
  std::vector<uint8_t> fill_;
  std::vector<uint8_t> writing_;
  std::future<absl::Status> pending_;
  uint64_t stored_ = 0;
  std::vector<uint64_t> frame_sizes_;
};

std::string ShapeString(const std::array<uint64_t, 4>& ne, uint32_t n_dims) {
  std::vector<uint64_t> dims(ne.begin(), ne.begin() + n_dims);
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::string ProgressBar(uint64_t done, uint64_t total) {
  constexpr int kWidth = 20;
  const double frac = total == 0 ? 1.0 : static_cast<double>(done) / total;
  const int filled = static_cast<int>(frac * kWidth + 0.5);
  return absl::StrFormat("[%s%s] %5.1f%%", std::string(filled, '#'),
                         std::string(kWidth - filled, '.'), 100.0 * frac);
}

}  // namespace

absl::StatusOr<ConvertStats> ConvertGgufToDpl(const std::string& in_path,
                                              const std::string& out_path,
                                              const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.compress && (opt.frame_bytes < formats::kDplMinFrameBytes ||
                       opt.frame_bytes > formats::kDplMaxFrameBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("frame size ", opt.frame_bytes, " out of range"));
  }
  auto gguf_or = GgufFile::Open(in_path);
  if (!gguf_or.ok()) return gguf_or.status();
  const GgufFile& gguf = *gguf_or;

  // Plan: layout, stride and offset of every tensor, in GGUF order.
  std::vector<DplTensorEntry> entries;
  entries.reserve(gguf.tensors().size());
  uint64_t cursor = 0;
  ConvertStats stats;
  for (const GgufTensorInfo& t : gguf.tensors()) {
    DplTensorEntry e;
    e.name = t.name;
    e.type = t.type;
    e.layout = t.type == GgmlType::kQ6_K ? TensorLayout::kDplQ6K : TensorLayout::kRaw;
    e.n_dims = t.n_dims;
    e.ne = t.ne;
    e.n_rows = t.n_rows;
    auto stride = formats::RowStrideFor(e.type, e.layout, e.ne[0]);
    if (!stride.ok()) return stride.status();
    e.row_stride = *stride;
    e.n_bytes = e.n_rows * e.row_stride;
    e.offset = AlignUp(cursor, formats::kDplTensorAlignment);
    cursor = e.offset + e.n_bytes;
    if (e.layout == TensorLayout::kDplQ6K) ++stats.n_dpl_tensors;
    entries.push_back(std::move(e));
  }
  const uint64_t data_bytes = AlignUp(cursor, formats::kDplTensorAlignment);

  // Index: metadata frame, table, frame index.
  std::string meta_raw;
  formats::SerializeGgufKv(gguf.metadata(), meta_raw);
  std::string meta_z(ZSTD_compressBound(meta_raw.size()), '\0');
  const size_t meta_z_bytes =
      ZSTD_compress(meta_z.data(), meta_z.size(), meta_raw.data(), meta_raw.size(), 9);
  if (ZSTD_isError(meta_z_bytes)) {
    return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(meta_z_bytes)));
  }
  meta_z.resize(meta_z_bytes);

  DplHeader h;
  h.flags = opt.compress ? formats::kDplFlagCompressed : 0;
  h.meta_offset = formats::kDplHeaderBytes;
  h.meta_stored_bytes = meta_z.size();
  h.meta_raw_bytes = meta_raw.size();
  h.meta_count = gguf.metadata().size();
  h.table_offset = AlignUp(h.meta_offset + h.meta_stored_bytes, 8);
  h.n_tensors = entries.size();
  for (const DplTensorEntry& e : entries) h.table_bytes += formats::DplTensorEntryBytes(e);
  uint64_t index_end = h.table_offset + h.table_bytes;
  if (opt.compress) {
    h.frame_raw_bytes = opt.frame_bytes;
    h.n_frames = (data_bytes + opt.frame_bytes - 1) / opt.frame_bytes;
    h.frames_offset = AlignUp(index_end, 8);
    index_end = h.frames_offset + 16 * h.n_frames;
  }
  h.data_offset = AlignUp(index_end, formats::kDplDataAlignment);
  h.data_bytes = data_bytes;

  TempOutput out(out_path);
  absl::Status s = out.Create();
  if (!s.ok()) return s;

  // Data region, streamed in GGUF order; each tensor's XXH3 as it passes.
  RegionSink sink(out.fd(), out.path(), h.data_offset, opt);
  XXH3_state_t* xxh = XXH3_createState();
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> xxh_owner(xxh, &XXH3_freeState);
  std::vector<uint8_t> row_buf;
  uint64_t written = 0;
  const uint64_t total = data_bytes;
  for (size_t i = 0; i < entries.size(); ++i) {
    DplTensorEntry& e = entries[i];
    const GgufTensorInfo& src = gguf.tensors()[i];
    const uint8_t* src_data = gguf.TensorData(src);  // (n_rows, row_bytes)
    s = sink.AppendZeros(e.offset - written);
    if (!s.ok()) return s;
    written = e.offset;
    XXH3_64bits_reset(xxh);
    if (e.layout == TensorLayout::kDplQ6K) {
      const uint64_t nbe = e.ne[0] / formats::kQ6KBlockElems;
      row_buf.assign(e.row_stride, 0);  // pad bytes stay zero
      for (uint64_t r = 0; r < e.n_rows; ++r) {
        formats::Q6KRowToDpl(src_data + r * src.row_bytes, nbe, row_buf.data());
        XXH3_64bits_update(xxh, row_buf.data(), row_buf.size());
        s = sink.Append(row_buf.data(), row_buf.size());
        if (!s.ok()) return s;
        if (opt.cancel && (r & 1023) == 0 && opt.cancel->load()) {
          return absl::CancelledError("conversion interrupted; no output written");
        }
      }
    } else {
      constexpr uint64_t kPiece = 16ull << 20;
      for (uint64_t at = 0; at < e.n_bytes; at += kPiece) {
        const uint64_t n = std::min(kPiece, e.n_bytes - at);
        XXH3_64bits_update(xxh, src_data + at, n);
        s = sink.Append(src_data + at, n);
        if (!s.ok()) return s;
        if (opt.cancel && opt.cancel->load()) {
          return absl::CancelledError("conversion interrupted; no output written");
        }
      }
    }
    e.xxh3 = XXH3_64bits_digest(xxh);
    written += e.n_bytes;
    if (opt.log) {
      *opt.log << absl::StrFormat("[%4d/%d] %-32s %-5s %-22s %-7s %10.2f MB  %s\n", i + 1,
                                  entries.size(), e.name, formats::TraitsOf(e.type).name,
                                  ShapeString(e.ne, e.n_dims), TensorLayoutName(e.layout),
                                  e.n_bytes / 1e6, ProgressBar(written, total));
      opt.log->flush();
    }
  }
  s = sink.AppendZeros(data_bytes - written);
  if (!s.ok()) return s;
  s = sink.Finish();
  if (!s.ok()) return s;
  h.data_stored_bytes = sink.stored_bytes();
  h.file_bytes = h.data_offset + h.data_stored_bytes;

  // Index region [256, data_offset), then the header that checksums it.
  std::string index(h.data_offset - formats::kDplHeaderBytes, '\0');
  std::memcpy(index.data() + (h.meta_offset - formats::kDplHeaderBytes), meta_z.data(), meta_z.size());
  std::string table;
  for (const DplTensorEntry& e : entries) formats::EncodeDplTensorEntry(e, table);
  std::memcpy(index.data() + (h.table_offset - formats::kDplHeaderBytes), table.data(), table.size());
  if (opt.compress) {
    uint64_t stored_at = 0;
    const std::vector<uint64_t>& sizes = sink.frame_sizes();
    if (sizes.size() != h.n_frames) {
      return absl::InternalError(absl::StrCat("wrote ", sizes.size(), " frames, planned ", h.n_frames));
    }
    for (uint64_t f = 0; f < h.n_frames; ++f) {
      const uint64_t pair[2] = {stored_at, sizes[f]};
      std::memcpy(index.data() + (h.frames_offset - formats::kDplHeaderBytes) + 16 * f, pair, 16);
      stored_at += sizes[f];
    }
  }
  h.index_xxh3 = XXH3_64bits(index.data(), index.size());
  const std::string header = formats::EncodeDplHeader(h);
  s = PwriteAll(out.fd(), header.data(), header.size(), 0, out.path());
  if (!s.ok()) return s;
  s = PwriteAll(out.fd(), index.data(), index.size(), formats::kDplHeaderBytes, out.path());
  if (!s.ok()) return s;
  if (opt.cancel && opt.cancel->load()) {
    return absl::CancelledError("conversion interrupted; no output written");
  }
  s = out.Commit(h.file_bytes);
  if (!s.ok()) return s;

  stats.n_tensors = entries.size();
  stats.input_bytes = gguf.file_size();
  stats.output_bytes = h.file_bytes;
  stats.data_bytes = data_bytes;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

absl::StatusOr<VerifyStats> VerifyConversion(const GgufFile& gguf, const DplFile& dpl) {
  VerifyStats vs;
  // Metadata: the same pairs in the same order, byte for byte.
  std::string a, b;
  formats::SerializeGgufKv(gguf.metadata(), a);
  formats::SerializeGgufKv(dpl.metadata(), b);
  if (a != b) return absl::DataLossError("metadata differs from the GGUF's");
  if (gguf.tensors().size() != dpl.tensors().size()) {
    return absl::DataLossError(absl::StrCat("tensor count ", dpl.tensors().size(), " != ",
                                            gguf.tensors().size()));
  }
  std::vector<uint8_t> inflated;
  const uint8_t* region = dpl.data_region();
  if (region == nullptr) {
    inflated.resize(dpl.header().data_bytes);
    absl::Status s = dpl.DecompressAll(inflated.data(), std::max(1u, std::thread::hardware_concurrency()));
    if (!s.ok()) return s;
    region = inflated.data();
  }
  std::vector<uint8_t> restored;
  for (const GgufTensorInfo& src : gguf.tensors()) {
    const DplTensorEntry* e = dpl.FindTensor(src.name);
    if (e == nullptr) return absl::DataLossError(absl::StrCat("tensor '", src.name, "' is missing"));
    if (e->type != src.type || e->ne != src.ne || e->n_dims != src.n_dims) {
      return absl::DataLossError(absl::StrCat("tensor '", src.name, "': type or shape differs"));
    }
    absl::Status s = dpl.VerifyChecksum(*e, region);
    if (!s.ok()) return s;
    const uint8_t* want = gguf.TensorData(src);  // (n_rows, row_bytes)
    const uint8_t* have = region + e->offset;    // (n_rows, row_stride)
    if (e->layout == TensorLayout::kDplQ6K) {
      const uint64_t nbe = src.ne[0] / formats::kQ6KBlockElems;
      restored.resize(src.row_bytes);
      for (uint64_t r = 0; r < src.n_rows; ++r) {
        const uint8_t* row = have + r * e->row_stride;
        formats::DplRowToQ6K(row, nbe, restored.data());
        if (std::memcmp(restored.data(), want + r * src.row_bytes, src.row_bytes) != 0) {
          return absl::DataLossError(absl::StrCat("tensor '", src.name, "' row ", r,
                                                  ": q6_K blocks differ after undoing dpl"));
        }
        for (uint64_t p = src.row_bytes; p < e->row_stride; ++p) {
          if (row[p] != 0) {
            return absl::DataLossError(absl::StrCat("tensor '", src.name, "' row ", r,
                                                    ": nonzero row padding"));
          }
        }
      }
      vs.n_dpl_rows += src.n_rows;
    } else if (e->layout == TensorLayout::kRaw) {
      if (e->n_bytes != src.n_bytes || std::memcmp(have, want, src.n_bytes) != 0) {
        return absl::DataLossError(absl::StrCat("tensor '", src.name, "': bytes differ"));
      }
    } else {
      return absl::DataLossError(absl::StrCat("tensor '", src.name, "': unexpected layout"));
    }
    vs.bytes_compared += src.n_bytes;
    ++vs.n_tensors;
  }
  return vs;
}

}  // namespace dpl::converter
