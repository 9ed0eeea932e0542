// Issue 11's hostile inputs, each in a forked child under 3 GB of address
// space and 10 s: the crafted files (hostile_files.h) through every way the
// tools open a model, files that are not regular files, and files truncated
// while they are mapped.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "base/status_macros.h"
#include "formats/dpl_file.h"
#include "formats/gguf.h"
#include "formats/hostile_files.h"
#include "formats/hostile_test_util.h"
#include "formats/mapped_file.h"
#include "formats/model_file.h"
#include "tests/shared_dir.h"

namespace dpl::formats {
namespace {

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  return path;
}

// What the tools do with a model: the index (dpl-tokenize, dpl-run's
// loader, dpl-inspect), the inflated file (dpl-run --device cpu), and for a
// .dpl every checksum (dpl-inspect --verify-checksums).
absl::Status OpenEveryWay(const std::string& path) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<ModelFile> index, ModelFile::OpenIndex(path));
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<ModelFile> full, ModelFile::Open(path));
  if (index->container() != Container::kDpl) return absl::OkStatus();
  DPL_ASSIGN_OR_RETURN(const DplFile dpl, DplFile::Open(path));
  return dpl.VerifyChecksums(2);
}

void CheckRejected(const BoundedRun& run, const std::string& expect) {
  CAPTURE(run.Describe());
  REQUIRE(run.exited);
  CHECK(!run.ok);
  CHECK(run.message.find(expect) != std::string::npos);
  CHECK(run.seconds < kHostileMaxSeconds);
}

TEST_CASE("issue 11's crafted files: a named error within 3 GB and 10 s; their twins open") {
  for (const hostile::CraftedFile& f : hostile::CraftedFiles()) {
    CAPTURE(f.name);
    const std::string bad = WriteTemp(f.name + ".bad." + f.ext, f.bad);
    const std::string twin = WriteTemp(f.name + ".twin." + f.ext, f.twin);
    const BoundedRun bad_run =
        RunBounded([&] { return OpenEveryWay(bad); }, kHostileMaxAddressBytes, kHostileMaxSeconds);
    MESSAGE(f.name, " (", f.bad.size(), " bytes): ", bad_run.Describe());
    CheckRejected(bad_run, f.expect);
    const BoundedRun twin_run =
        RunBounded([&] { return OpenEveryWay(twin); }, kHostileMaxAddressBytes, kHostileMaxSeconds);
    CAPTURE(twin_run.Describe());
    CHECK(twin_run.ok);
    std::remove(bad.c_str());
    std::remove(twin.c_str());
  }
}

TEST_CASE("a tiny .dpl declaring 4 GiB: the index allocates nothing, checksums stream") {
  for (const hostile::CraftedFile& f : hostile::CraftedFiles()) {
    if (f.name != "DPL_4GIB_REGION_IN_128KB") continue;
    const std::string path = WriteTemp("four_gib.dpl", f.bad);
    // 512 MB of address space: OpenIndex must not touch the 4 GiB region.
    const BoundedRun index = RunBounded([&] { return ModelFile::OpenIndex(path).status(); },
                                        512ull << 20, kHostileMaxSeconds);
    CHECK_MESSAGE(index.ok, index.Describe());
    // Checksums inflate one 1 GiB frame at a time: 4 GiB of zeros fail the
    // pattern's checksum within 3 GB.
    const BoundedRun verify = RunBounded(
        [&] {
          DPL_ASSIGN_OR_RETURN(const DplFile d, DplFile::Open(path));
          return d.VerifyChecksums(4);
        },
        kHostileMaxAddressBytes, kHostileMaxSeconds);
    CheckRejected(verify, "checksum mismatch");
    std::remove(path.c_str());
  }
}

TEST_CASE("a FIFO, a directory or a device as the model: refused at once, naming the path") {
  const std::string fifo = testing::TempDir() + "/model.fifo";
  std::remove(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::pair<std::string, std::string> cases[] = {
      {fifo, "not a regular file (a FIFO)"},
      {testing::TempDir(), "not a regular file (a directory)"},
      {"/dev/zero", "not a regular file (a character device)"},
  };
  for (const auto& [path, expect] : cases) {
    CAPTURE(path);
    for (int way = 0; way < 4; ++way) {
      const BoundedRun run = RunBounded(
          [&, way = way] {
            switch (way) {
              case 0: return ModelFile::OpenIndex(path).status();
              case 1: return ModelFile::Open(path).status();
              case 2: return DetectContainer(path).status();
              default: return GgufFile::Open(path).status();
            }
          },
          kHostileMaxAddressBytes, 5);
      CheckRejected(run, path + ": " + expect);
    }
  }
  std::remove(fifo.c_str());
}

// A file of `bytes` pattern bytes, mapped, then truncated to `keep` bytes.
std::shared_ptr<MappedFile> MapThenTruncate(const std::string& path, const std::string& bytes,
                                            uint64_t keep) {
  WriteTemp(path.substr(path.rfind('/') + 1), bytes);
  absl::StatusOr<std::shared_ptr<MappedFile>> m = MappedFile::Open(path);
  REQUIRE_MESSAGE(m.ok(), m.status().ToString());
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(keep)) == 0);
  return *m;
}

// Minor page faults this process took while fn ran.
template <class F>
long MinorFaults(F fn) {
  struct rusage before, after;
  ::getrusage(RUSAGE_SELF, &before);
  fn();
  ::getrusage(RUSAGE_SELF, &after);
  return after.ru_minflt - before.ru_minflt;
}

TEST_CASE("Populate maps a file's pages ahead of the reads; past a truncated end it is only a hint") {
  const std::string path = testing::TempDir() + "/populate.bin";
  std::string bytes(16 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 >> 7);
  WriteTemp("populate.bin", bytes);
  const uint64_t want = XXH3_64bits(bytes.data(), bytes.size());
  uint64_t sum = 0;
  absl::StatusOr<std::shared_ptr<MappedFile>> fresh = MappedFile::Open(path);
  REQUIRE(fresh.ok());
  const long cold = MinorFaults([&] { sum = XXH3_64bits((*fresh)->data(), (*fresh)->size()); });
  CHECK(sum == want);
  absl::StatusOr<std::shared_ptr<MappedFile>> m = MappedFile::Open(path);
  REQUIRE(m.ok());
  // Two halves, as the loader's threads populate disjoint slices; a length
  // past the end is clipped.
  const bool mapped = (*m)->Populate(0, 8 << 20) & (*m)->Populate(8 << 20, 64 << 20);
  const long warm = MinorFaults([&] { sum = XXH3_64bits((*m)->data(), (*m)->size()); });
  CHECK(sum == want);
  CHECK((*m)->Intact().ok());
  CAPTURE(cold);
  CAPTURE(warm);
  if (mapped) {
    CHECK(warm < cold);  // the reads found their pages mapped
  } else {
    MESSAGE("this kernel has no MADV_POPULATE_READ (Linux 5.14+): Populate was a readahead hint");
  }
  CHECK((*m)->Populate(16 << 20, 1) == false);  // nothing there
  // Truncated under the mapping: Populate says no and raises no SIGBUS; the
  // read after it still reports the truncation.
  const std::shared_ptr<MappedFile> t = MapThenTruncate(path, bytes, 4096);
  CHECK(t->Populate(0, t->size()) == false);
  CHECK(t->Intact().code() == absl::StatusCode::kDataLoss);  // the size, not a fault
  const absl::Status s = t->SafeRead([&] {
    sum = XXH3_64bits(t->data(), t->size());
    return absl::OkStatus();
  });
  CHECK(s.message().find("reading offset 4096 failed (bus error)") != absl::string_view::npos);
  std::remove(path.c_str());
}

TEST_CASE("a file truncated while mapped: SafeRead names it, no SIGBUS") {
  const std::string path = testing::TempDir() + "/shrinking.bin";
  const std::shared_ptr<MappedFile> m = MapThenTruncate(path, std::string(1 << 20, 'x'), 8192);
  CHECK(m->SafeRead([] { return absl::OkStatus(); }).code() == absl::StatusCode::kDataLoss);
  // Reading every page faults past 8192: in this process, and in a bounded child.
  uint64_t sum = 0;
  const absl::Status s = m->SafeRead([&] {
    sum = XXH3_64bits(m->data(), m->size());
    return absl::OkStatus();
  });
  CAPTURE(s.ToString());
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message().find(path + ": reading offset 8192 failed (bus error)") != absl::string_view::npos);
  CHECK(!m->Intact().ok());
  const std::shared_ptr<MappedFile> m2 = MapThenTruncate(path, std::string(1 << 20, 'y'), 0);
  const BoundedRun run = RunBounded(
      [&] { return m2->SafeRead([&] { return absl::Status(absl::OkStatus()); }); },
      kHostileMaxAddressBytes, 5);
  CheckRejected(run, "shrank from 1048576 to 0 bytes");
  std::remove(path.c_str());
}

TEST_CASE("a .dpl truncated under its checksums or inflation: an error naming the file") {
  for (bool compressed : {false, true}) {
    CAPTURE(compressed);
    hostile::DplSpec spec = hostile::ValidDpl();
    spec.data.assign(4 << 20, '\0');  // several pages and frames
    for (size_t i = 0; i < spec.data.size(); i += 97) spec.data[i] = static_cast<char>(i);
    spec.entries.push_back(hostile::Entry("big.weight", GgmlType::kF32, TensorLayout::kRaw,
                                          {1 << 18, 3}, 1 << 20));
    spec.compressed = compressed;
    const std::string path = testing::TempDir() + "/truncated_under.dpl";
    WriteTemp("truncated_under.dpl", spec.Build());
    absl::StatusOr<DplFile> d = DplFile::Open(path);
    REQUIRE_MESSAGE(d.ok(), d.status().ToString());
    REQUIRE(::truncate(path.c_str(), static_cast<off_t>(d->header().data_offset + 4096)) == 0);
    const BoundedRun run = RunBounded([&] { return d->VerifyChecksums(2); }, kHostileMaxAddressBytes, 10);
    CheckRejected(run, path + ": ");
    std::remove(path.c_str());
  }
}

TEST_CASE("ZeroZstdFrame is a zstd frame of n zeros") {
  for (uint64_t n : {0ull, 1ull, 131072ull, 300000ull}) {
    const std::string z = hostile::ZeroZstdFrame(n);
    CHECK(ZSTD_getFrameContentSize(z.data(), z.size()) == n);
    std::string out(n, 'q');
    CHECK(ZSTD_decompress(out.data(), n, z.data(), z.size()) == n);
    CHECK(out == std::string(n, '\0'));
  }
}

}  // namespace
}  // namespace dpl::formats
