// ZSTD_estimateCCtxSize_usingCParams (zstd is linked statically).
#define ZSTD_STATIC_LINKING_ONLY
#include "converter/convert.h"

#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <future>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "formats/byte_reader.h"
#include "formats/dpl_layout.h"
#include "formats/model_file.h"
#include "formats/output_file.h"
#include "formats/parallel_for.h"
#include "model/model.h"

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

// --layout auto, one row per type with dpl planes. Decided per type by the
// H200 kernel bench: the raw and the dpl matvec of the same matrix
// (kernels/matvec matvec_bench; outputs bit-identical, matvec_gpu_test), the
// faster layout wins; switching a type is one word on its line.
struct AutoLayoutRow {
  GgmlType type;
  TensorLayout layout;
};
// Measured on the H200 (2026-12-02, matvec_bench: the same matvec math on
// both layouts, bit-identical outputs; best geometry of each, microseconds
// for the Qwen2.5-7B shapes ffn_gate 18944x3584 / ffn_down 3584x18944 /
// attn_q 3584x3584; docs/PERF.md).
constexpr AutoLayoutRow kAutoLayout[] = {
    {GgmlType::kQ6_K, TensorLayout::kDpl},    // 49.0 -> 19.0 us (ffn_down)
    {GgmlType::kQ8_0, TensorLayout::kDpl},    // 57.3 -> 22.5, 56.0 -> 24.6, 13.3 -> 7.2
    {GgmlType::kQ4_0, TensorLayout::kDpl},    // 33.6 -> 14.4, 33.5 -> 15.3, 9.2 -> 5.4
    {GgmlType::kQ4_1, TensorLayout::kDpl},    // 29.5 -> 15.4, 29.4 -> 16.7, 8.1 -> 5.6
    {GgmlType::kQ5_0, TensorLayout::kDpl},    // 47.3 -> 16.3, 47.5 -> 18.7, 11.4 -> 6.2
    {GgmlType::kQ5_1, TensorLayout::kDpl},    // 25.2 -> 16.2, 27.4 -> 18.2, 7.7 -> 5.9
    {GgmlType::kQ2_K, TensorLayout::kDpl},    // 19.0 -> 13.6, 19.6 -> 14.2, 6.6 -> 5.0
    {GgmlType::kQ3_K, TensorLayout::kDpl},    // 28.9 -> 17.9, 29.7 -> 15.9, 8.7 -> 5.9
    {GgmlType::kIQ4_NL, TensorLayout::kDpl},  // 34.5 -> 18.5, 35.4 -> 20.6, 9.6 -> 6.2
    // 136-byte blocks are 8-byte aligned already: 20.1 vs 20.0, 21.7 vs
    // 20.8, 6.5 vs 7.9 (dpl slower): no consistent gain, so raw.
    {GgmlType::kIQ4_XS, TensorLayout::kRaw},
};

constexpr bool AutoLayoutRowsValid() {
  for (const AutoLayoutRow& r : kAutoLayout) {
    if (!formats::HasDplPlanes(r.type)) return false;
  }
  return true;
}
static_assert(AutoLayoutRowsValid(), "kAutoLayout lists only types with dpl planes");

// The uncompressed form is written in chunks of this size, two in flight.
constexpr uint64_t kPlainChunkBytes = 64ull << 20;

std::string GiB(uint64_t bytes) { return absl::StrFormat("%.1f GiB", bytes / double(1ull << 30)); }

// Half the physical memory, or half the address-space limit when one is set.
uint64_t DefaultMemoryBudget() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t budget = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) / 2 : (4ull << 30);
  struct rlimit as;
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    budget = std::min<uint64_t>(budget, as.rlim_cur / 2);
  }
  return budget;
}

uint64_t BudgetOf(const ConvertOptions& opt) {
  return opt.memory_budget ? opt.memory_budget : DefaultMemoryBudget();
}

// What RegionSink holds while compressing: a batch of 2 x threads frames
// filling, their compressed copies, and one zstd context per worker.
uint64_t CompressionBytes(int threads, uint64_t frame_bytes, int level) {
  const uint64_t batch = 2 * uint64_t(threads);
  const size_t cctx = ZSTD_estimateCCtxSize_usingCParams(ZSTD_getCParams(level, frame_bytes, 0));
  return batch * (frame_bytes + ZSTD_compressBound(frame_bytes)) + uint64_t(threads) * cctx;
}

// Every option checked before anything is opened; returns the compression
// worker count: --threads as given, or for 0 all cores, halved until the
// buffers fit in the budget. An explicit count that does not fit is refused.
absl::StatusOr<int> PlanThreads(const ConvertOptions& opt) {
  if (opt.threads < 0 || opt.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", opt.threads,
                                                   " out of range (0 = all cores, or 1..",
                                                   kMaxThreads, ")"));
  }
  if (opt.compress_level < ZSTD_minCLevel() || opt.compress_level > ZSTD_maxCLevel()) {
    return absl::InvalidArgumentError(absl::StrCat("--level ", opt.compress_level,
                                                   " out of range (zstd: ", ZSTD_minCLevel(),
                                                   "..", ZSTD_maxCLevel(), ")"));
  }
  if (opt.frame_bytes < formats::kDplMinFrameBytes || opt.frame_bytes > formats::kDplMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame size ", opt.frame_bytes,
                                                   " bytes out of range (64 KiB..1 GiB)"));
  }
  int threads = opt.threads;
  if (threads == 0) {
    threads = std::clamp<int>(std::thread::hardware_concurrency(), 1, kMaxThreads);
  }
  if (!opt.compress) return threads;
  const uint64_t budget = BudgetOf(opt);
  auto need = [&](int t) { return CompressionBytes(t, opt.frame_bytes, opt.compress_level); };
  while (opt.threads == 0 && threads > 1 && need(threads) > budget) threads /= 2;
  if (need(threads) > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--compress with ", threads, " thread(s), ", opt.frame_bytes >> 20, " MiB frames and level ",
        opt.compress_level, " needs about ", GiB(need(threads)), " of buffers, over the ",
        GiB(budget), " this conversion may use; lower --threads or --frame-mib"));
  }
  return threads;
}

// Collects the logical data region as a stream of bytes and hands it on in
// fixed-size chunks. Uncompressed: each chunk is written by a background
// thread while the next one fills (reading overlaps writing). Compressed:
// chunks are frames, compressed in parallel batches and written in order.
class RegionSink {
 public:
  RegionSink(const formats::OutputFile& out, uint64_t data_offset, const ConvertOptions& opt,
             int threads)
      : out_(out), write_at_(data_offset), opt_(opt), threads_(threads) {
    chunk_bytes_ = opt.compress ? opt.frame_bytes : kPlainChunkBytes;
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
      if (fill_.size() == chunk_bytes_ * batch_frames_) DPL_RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }

  absl::Status AppendZeros(uint64_t n) {
    static const uint8_t kZeros[4096] = {};
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, sizeof(kZeros));
      DPL_RETURN_IF_ERROR(Append(kZeros, take));
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
    DPL_RETURN_IF_ERROR(WaitWriter());  // the previous buffer is free again
    if (!opt_.compress) {
      std::swap(fill_, writing_);
      fill_.clear();
      const uint64_t at = write_at_;
      write_at_ += writing_.size();
      stored_ += writing_.size();
      pending_ = std::async(std::launch::async, [this, at] {
        return out_.Write(writing_.data(), writing_.size(), at);
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
    DPL_RETURN_IF_ERROR(compressed);
    for (const std::string& f : out) {
      DPL_RETURN_IF_ERROR(out_.Write(f.data(), f.size(), write_at_));
      write_at_ += f.size();
      stored_ += f.size();
      frame_sizes_.push_back(f.size());
    }
    fill_.clear();
    return absl::OkStatus();
  }

  const formats::OutputFile& out_;
  uint64_t write_at_;
  const ConvertOptions& opt_;
  int threads_;
  uint64_t chunk_bytes_;
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

absl::Status CheckCancel(const std::atomic<bool>* cancel) {
  if (cancel != nullptr && cancel->load()) {
    return absl::CancelledError("conversion interrupted; no output written");
  }
  return absl::OkStatus();
}

// The table of the output: every tensor's geometry from the GGUF, its layout
// from `policy`, offsets 256-aligned in GGUF order. Sets *data_bytes to the
// region's size.
absl::StatusOr<std::vector<DplTensorEntry>> PlanEntries(const GgufFile& gguf, LayoutPolicy policy,
                                                        uint64_t* data_bytes) {
  std::vector<DplTensorEntry> entries;
  entries.reserve(gguf.tensors().size());
  uint64_t cursor = 0;
  for (const GgufTensorInfo& t : gguf.tensors()) {
    DplTensorEntry e;
    e.geometry() = t.geometry();
    e.name = t.name;
    e.layout = LayoutFor(policy, t.type);
    DPL_ASSIGN_OR_RETURN(e.row_stride, formats::RowStrideFor(e.type, e.layout, e.ne[0]));
    e.n_bytes = e.n_rows * e.row_stride;
    e.offset = AlignUp(cursor, formats::kDplTensorAlignment);
    cursor = e.offset + e.n_bytes;
    entries.push_back(std::move(e));
  }
  *data_bytes = AlignUp(cursor, formats::kDplTensorAlignment);
  return entries;
}

// The metadata section: the GGUF key/value encoding in one zstd frame.
absl::StatusOr<std::string> CompressMetadata(const formats::Metadata& meta, std::string* raw) {
  formats::SerializeGgufKv(meta, *raw);
  std::string z(ZSTD_compressBound(raw->size()), '\0');
  const size_t n = ZSTD_compress(z.data(), z.size(), raw->data(), raw->size(), 9);
  if (ZSTD_isError(n)) return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(n)));
  z.resize(n);
  return z;
}

// Where the writer puts the index (docs/FORMAT.md, "Overall layout"): the
// metadata at 256, the table and frame index 8-aligned after it, the data
// region at the next 4 KiB.
DplHeader PlanHeader(const std::vector<DplTensorEntry>& entries, const std::string& meta_raw,
                     const std::string& meta_z, uint64_t meta_count, uint64_t data_bytes,
                     const ConvertOptions& opt) {
  DplHeader h;
  h.version = formats::DplVersionFor(entries);
  h.flags = opt.compress ? formats::kDplFlagCompressed : 0;
  h.meta_offset = formats::kDplHeaderBytes;
  h.meta_stored_bytes = meta_z.size();
  h.meta_raw_bytes = meta_raw.size();
  h.meta_count = meta_count;
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
  return h;
}

// Streams one tensor into the sink in its output layout and returns the
// XXH3-64 of what was written. `src` holds (n_rows, src_stride) GGUF bytes.
absl::StatusOr<uint64_t> StreamTensor(const DplTensorEntry& e, const uint8_t* src,
                                      uint64_t src_stride, RegionSink& sink,
                                      const ConvertOptions& opt) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> xxh(XXH3_createState(),
                                                                &XXH3_freeState);
  XXH3_64bits_reset(xxh.get());
  if (e.layout == TensorLayout::kDpl) {
    const uint64_t nbe = e.ne[0] / formats::TraitsOf(e.type).block_elems;
    std::vector<uint8_t> row(e.row_stride, 0);
    for (uint64_t r = 0; r < e.n_rows; ++r) {
      DPL_RETURN_IF_ERROR(formats::RowToDpl(e.type, src + r * src_stride, nbe, row.data()));
      XXH3_64bits_update(xxh.get(), row.data(), row.size());
      DPL_RETURN_IF_ERROR(sink.Append(row.data(), row.size()));
      if ((r & 1023) == 0) DPL_RETURN_IF_ERROR(CheckCancel(opt.cancel));
    }
  } else {
    constexpr uint64_t kPiece = 16ull << 20;
    for (uint64_t at = 0; at < e.n_bytes; at += kPiece) {
      const uint64_t n = std::min(kPiece, e.n_bytes - at);
      XXH3_64bits_update(xxh.get(), src + at, n);
      DPL_RETURN_IF_ERROR(sink.Append(src + at, n));
      DPL_RETURN_IF_ERROR(CheckCancel(opt.cancel));
    }
  }
  return XXH3_64bits_digest(xxh.get());
}

// The data region, streamed in GGUF order with zeros between tensors; fills
// in every entry's checksum.
absl::Status WriteRegion(const GgufFile& gguf, std::vector<DplTensorEntry>& entries,
                         uint64_t data_bytes, RegionSink& sink, const ConvertOptions& opt) {
  uint64_t written = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    DplTensorEntry& e = entries[i];
    const GgufTensorInfo& src = gguf.tensors()[i];
    DPL_RETURN_IF_ERROR(sink.AppendZeros(e.offset - written));
    DPL_ASSIGN_OR_RETURN(e.xxh3, StreamTensor(e, gguf.TensorData(src), src.row_stride, sink, opt));
    written = e.offset + e.n_bytes;
    if (opt.log) {
      *opt.log << absl::StrFormat("[%4d/%d] %-32s %-5s %-22s %-7s %10.2f MB  %s\n", i + 1,
                                  entries.size(), e.name, formats::TraitsOf(e.type).name,
                                  ShapeString(e.ne, e.n_dims), TensorLayoutName(e.layout),
                                  e.n_bytes / 1e6, ProgressBar(written, data_bytes));
      opt.log->flush();
    }
  }
  DPL_RETURN_IF_ERROR(sink.AppendZeros(data_bytes - written));
  return sink.Finish();
}

// The index region [256, data_offset): metadata frame, table, frame index
// (from the frames the sink wrote), zero padding.
absl::StatusOr<std::string> BuildIndex(const DplHeader& h, const std::string& meta_z,
                                       const std::vector<DplTensorEntry>& entries,
                                       const std::vector<uint64_t>& frame_sizes) {
  std::string index(h.data_offset - formats::kDplHeaderBytes, '\0');
  auto at = [&](uint64_t file_offset) { return index.data() + (file_offset - formats::kDplHeaderBytes); };
  std::memcpy(at(h.meta_offset), meta_z.data(), meta_z.size());
  std::string table;
  for (const DplTensorEntry& e : entries) formats::EncodeDplTensorEntry(e, table);
  std::memcpy(at(h.table_offset), table.data(), table.size());
  if (!h.compressed()) return index;
  if (frame_sizes.size() != h.n_frames) {
    return absl::InternalError(absl::StrCat("wrote ", frame_sizes.size(), " frames, planned ",
                                            h.n_frames));
  }
  uint64_t stored_at = 0;
  for (uint64_t f = 0; f < h.n_frames; ++f) {
    const uint64_t pair[2] = {stored_at, frame_sizes[f]};
    std::memcpy(at(h.frames_offset) + 16 * f, pair, 16);
    stored_at += frame_sizes[f];
  }
  return index;
}

// The index, then the header that checksums it; the file cut to its size.
absl::Status WriteIndexAndHeader(DplHeader& h, const std::string& meta_z,
                                 const std::vector<DplTensorEntry>& entries,
                                 const std::vector<uint64_t>& frame_sizes,
                                 const formats::OutputFile& out) {
  DPL_ASSIGN_OR_RETURN(const std::string index, BuildIndex(h, meta_z, entries, frame_sizes));
  h.index_xxh3 = XXH3_64bits(index.data(), index.size());
  const std::string header = formats::EncodeDplHeader(h);
  DPL_RETURN_IF_ERROR(out.Write(header.data(), header.size(), 0));
  DPL_RETURN_IF_ERROR(out.Write(index.data(), index.size(), formats::kDplHeaderBytes));
  return out.Resize(h.file_bytes);
}

// --verify: the written file, read back from its temporary name, proven
// before it may replace the output.
absl::StatusOr<VerifyStats> VerifyOutput(const GgufFile& gguf, const formats::OutputFile& out,
                                         const ConvertOptions& opt) {
  if (opt.log) {
    *opt.log << "verifying: reading the result back before it becomes " << out.path() << "\n";
    opt.log->flush();
  }
  DPL_ASSIGN_OR_RETURN(const DplFile dpl, DplFile::Open(out.temp_path()));
  absl::StatusOr<VerifyStats> vs;
  const absl::Status read = gguf.SafeRead([&] {
    return dpl.SafeRead([&] {
      vs = VerifyConversion(gguf, dpl, opt.cancel);
      return vs.status();
    });
  });
  if (vs.ok() && !read.ok()) vs = read;
  if (vs.ok() || vs.status().code() == absl::StatusCode::kCancelled) return vs;
  return dpl::Annotate(vs.status(), absl::StrCat("verify failed (", out.path(), " not written)"));
}

}  // namespace

absl::string_view LayoutPolicyName(LayoutPolicy policy) {
  switch (policy) {
    case LayoutPolicy::kAuto: return "auto";
    case LayoutPolicy::kRaw: return "raw";
    case LayoutPolicy::kDpl: return "dpl";
  }
  return "unknown";
}

absl::StatusOr<LayoutPolicy> LayoutPolicyFromName(absl::string_view name) {
  for (LayoutPolicy p : {LayoutPolicy::kRaw, LayoutPolicy::kDpl, LayoutPolicy::kAuto}) {
    if (name == LayoutPolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--layout '", name, "' is not one of raw, dpl, auto"));
}

TensorLayout AutoLayout(GgmlType type) {
  for (const AutoLayoutRow& r : kAutoLayout) {
    if (r.type == type) return r.layout;
  }
  return TensorLayout::kRaw;
}

TensorLayout LayoutFor(LayoutPolicy policy, GgmlType type) {
  switch (policy) {
    case LayoutPolicy::kAuto: return AutoLayout(type);
    case LayoutPolicy::kDpl: return formats::HasDplPlanes(type) ? TensorLayout::kDpl : TensorLayout::kRaw;
    case LayoutPolicy::kRaw: break;
  }
  return TensorLayout::kRaw;
}

absl::StatusOr<ConvertStats> ConvertGgufToDpl(const std::string& in_path,
                                              const std::string& out_path,
                                              const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  DPL_ASSIGN_OR_RETURN(const int threads, PlanThreads(opt));
  DPL_ASSIGN_OR_RETURN(const GgufFile gguf, GgufFile::Open(in_path));
  uint64_t data_bytes = 0;
  DPL_ASSIGN_OR_RETURN(std::vector<DplTensorEntry> entries, PlanEntries(gguf, opt.layout, &data_bytes));
  // Any GGUF converts; tensors the GPU cannot run are said once, up front.
  uint64_t n_gpu_warnings = 0;
  for (const DplTensorEntry& e : entries) {
    const absl::Status gpu = model::CheckGpuType(e.name, e.type);
    if (gpu.ok()) continue;
    ++n_gpu_warnings;
    if (opt.warn) *opt.warn << "warning: " << gpu.message() << "\n";
  }
  std::string meta_raw;
  DPL_ASSIGN_OR_RETURN(const std::string meta_z, CompressMetadata(gguf.metadata(), &meta_raw));
  DplHeader h = PlanHeader(entries, meta_raw, meta_z, gguf.metadata().size(), data_bytes, opt);
  if (opt.verify && opt.compress && data_bytes > BudgetOf(opt)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--verify of the compressed form inflates the whole data region (", GiB(data_bytes),
        "), over the ", GiB(BudgetOf(opt)), " this conversion may use; convert without --verify"));
  }

  formats::OutputOptions out_opt;
  out_opt.inputs = {in_path};
  out_opt.cancel = opt.cancel;
  DPL_ASSIGN_OR_RETURN(formats::OutputFile out, formats::OutputFile::Create(out_path, out_opt));
  ConvertStats stats;
  {
    RegionSink sink(out, h.data_offset, opt, threads);  // its writer ends before `out` can
    // A GGUF truncated while it is read becomes an error naming it, not SIGBUS.
    DPL_RETURN_IF_ERROR(gguf.SafeRead([&] { return WriteRegion(gguf, entries, data_bytes, sink, opt); }));
    h.data_stored_bytes = sink.stored_bytes();
    h.file_bytes = h.data_offset + h.data_stored_bytes;
    DPL_RETURN_IF_ERROR(WriteIndexAndHeader(h, meta_z, entries, sink.frame_sizes(), out));
  }
  if (opt.verify) {
    DPL_ASSIGN_OR_RETURN(stats.verify, VerifyOutput(gguf, out, opt));
  }
  DPL_RETURN_IF_ERROR(out.Commit());

  stats.n_tensors = entries.size();
  for (const DplTensorEntry& e : entries) {
    if (e.layout != TensorLayout::kDpl) continue;
    ++stats.n_dpl_tensors;
    ++stats.n_dpl_by_type[e.type];
  }
  stats.version = h.version;
  stats.n_gpu_warnings = n_gpu_warnings;
  stats.input_bytes = gguf.file_size();
  stats.output_bytes = h.file_bytes;
  stats.data_bytes = data_bytes;
  stats.threads = threads;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

namespace {

// Proves that the tensor `e` of the .dpl (its logical region `region`) holds
// the GGUF tensor `src` exactly. Returns the rows restored from dpl.
absl::StatusOr<uint64_t> VerifyTensor(const GgufFile& gguf, const GgufTensorInfo& src,
                                      const DplFile& dpl, const DplTensorEntry& e,
                                      const uint8_t* region) {
  const std::string tw = absl::StrCat("tensor '", src.name, "'");
  if (e.type != src.type || e.ne != src.ne || e.n_dims != src.n_dims) {
    return absl::DataLossError(absl::StrCat(tw, ": type or shape differs"));
  }
  DPL_RETURN_IF_ERROR(dpl.VerifyChecksum(e, region));
  const uint8_t* want = gguf.TensorData(src);  // (n_rows, src.row_stride)
  const uint8_t* have = region + e.offset;     // (n_rows, e.row_stride)
  if (e.layout == TensorLayout::kRaw) {
    if (e.n_bytes != src.n_bytes || std::memcmp(have, want, src.n_bytes) != 0) {
      return absl::DataLossError(absl::StrCat(tw, ": bytes differ"));
    }
    return 0;
  }
  if (e.layout != TensorLayout::kDpl) return absl::DataLossError(absl::StrCat(tw, ": unexpected layout"));
  const formats::GgmlTypeTraits tr = formats::TraitsOf(src.type);
  const uint64_t nbe = src.ne[0] / tr.block_elems;
  std::vector<uint8_t> restored(src.row_stride);
  for (uint64_t r = 0; r < src.n_rows; ++r) {
    const uint8_t* row = have + r * e.row_stride;
    DPL_RETURN_IF_ERROR(dpl::Annotate(formats::DplRowToRaw(src.type, row, nbe, restored.data()), tw));
    if (std::memcmp(restored.data(), want + r * src.row_stride, src.row_stride) != 0) {
      return absl::DataLossError(
          absl::StrCat(tw, " row ", r, ": ", tr.name, " blocks differ after undoing dpl"));
    }
    for (uint64_t p = src.row_stride; p < e.row_stride; ++p) {
      if (row[p] != 0) return absl::DataLossError(absl::StrCat(tw, " row ", r, ": nonzero row padding"));
    }
  }
  return src.n_rows;
}

}  // namespace

absl::StatusOr<VerifyStats> VerifyConversion(const GgufFile& gguf, const DplFile& dpl,
                                             const std::atomic<bool>* cancel) {
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
  // The lowest version that holds the layouts: q6_K-only files stay version 1.
  const uint32_t want_version = formats::DplVersionFor(dpl.tensors());
  if (dpl.header().version != want_version) {
    return absl::DataLossError(absl::StrCat("format version ", dpl.header().version,
                                            ", but its tensors' layouts make it version ",
                                            want_version));
  }
  std::vector<uint8_t> inflated;
  const uint8_t* region = dpl.data_region();
  if (region == nullptr) {
    inflated.resize(dpl.header().data_bytes);
    DPL_RETURN_IF_ERROR(
        dpl.DecompressAll(inflated.data(), std::max(1u, std::thread::hardware_concurrency())));
    region = inflated.data();
  }
  for (const GgufTensorInfo& src : gguf.tensors()) {
    DPL_RETURN_IF_ERROR(CheckCancel(cancel));
    const DplTensorEntry* e = dpl.FindTensor(src.name);
    if (e == nullptr) return absl::DataLossError(absl::StrCat("tensor '", src.name, "' is missing"));
    DPL_ASSIGN_OR_RETURN(const uint64_t dpl_rows, VerifyTensor(gguf, src, dpl, *e, region));
    vs.n_dpl_rows += dpl_rows;
    vs.bytes_compared += src.n_bytes;
    ++vs.n_tensors;
  }
  return vs;
}

absl::Status CheckRunnable(const std::string& path) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<formats::ModelFile> file,
                       formats::ModelFile::OpenIndex(path));
  DPL_ASSIGN_OR_RETURN(const model::ModelDesc desc, model::BindModel(*file));
  DPL_RETURN_IF_ERROR(model::CheckGpuArch(desc));
  absl::Status first;
  int n_more = 0;
  for (const formats::TensorView& t : file->tensors()) {
    const absl::Status s = model::CheckGpuType(t.name, t.type);
    if (s.ok()) continue;
    if (first.ok()) {
      first = s;
    } else {
      ++n_more;
    }
  }
  if (n_more == 0) return first;
  return absl::Status(first.code(), absl::StrCat(first.message(), "; and ", n_more,
                                                 " more tensor(s), warned about above"));
}

}  // namespace dpl::converter
