// The CUDA resource handles and CaptureGraph (tags gpu, manual).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <vector>

#include "base/status_macros.h"
#include "kernels/cuda_handles.h"
#include "kernels/gpu_test.h"
#include "kernels/step/step.h"

namespace dpl::kernels {
namespace {

size_t FreeBytes() {
  size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

TEST_CASE("DeviceBuffer frees its memory; moves transfer ownership") {
  const size_t before = FreeBytes();
  {
    absl::StatusOr<DeviceBuffer<float>> a = DeviceBuffer<float>::Allocate(256 << 20);  // 1 GiB
    REQUIRE(a.ok());
    CHECK(a->size() == (256u << 20));
    CHECK(FreeBytes() + (1u << 30) <= before + (64u << 20));
    DeviceBuffer<float> b = std::move(*a);
    CHECK(a->get() == nullptr);
    CHECK(b.get() != nullptr);
  }
  CHECK(FreeBytes() + (64u << 20) >= before);
  absl::StatusOr<DeviceBuffer<float>> huge = DeviceBuffer<float>::Allocate(size_t{1} << 45);
  CHECK(!huge.ok());
  CHECK(huge.status().ToString().find("cudaErrorMemoryAllocation") != std::string::npos);
}

// seq_pos[0] += 1: a step of one row over sequence 0 (kernels/step).
absl::Status AdvancePosition(int* seq_pos, cudaStream_t stream) {
  static testing::GuardedArray<int>* row = new testing::GuardedArray<int>(std::vector<int>{0});
  return FinishStepRows(row->get(), 1, nullptr, nullptr, seq_pos, stream);
}

TEST_CASE("a failed allocation is reported once, not by the next launch") {
  CHECK(!DeviceBuffer<float>::Allocate(size_t{1} << 45).ok());
  testing::GuardedArray<int> pos(std::vector<int>{1});
  STATUS_OK(AdvancePosition(pos.get(), nullptr));
  CHECK(pos.Download()[0] == 2);
}

TEST_CASE("CaptureGraph replays what was enqueued and ends the capture on errors") {
  absl::StatusOr<Stream> s = CreateStream();
  REQUIRE(s.ok());
  testing::GuardedArray<int> pos(std::vector<int>{5});
  absl::StatusOr<GraphExec> g = CaptureGraph(s->get(), [&] {
    DPL_RETURN_IF_ERROR(AdvancePosition(pos.get(), s->get()));
    return AdvancePosition(pos.get(), s->get());
  });
  REQUIRE_MESSAGE(g.ok(), g.status().ToString());
  for (int i = 0; i < 3; ++i) CUDA_OK(cudaGraphLaunch(g->get(), s->get()));
  CUDA_OK(cudaStreamSynchronize(s->get()));
  CHECK(pos.Download()[0] == 11);  // 5 + 3 replays of two steps
  // A failing enqueue: its error comes back and the stream is not left capturing.
  absl::StatusOr<GraphExec> bad =
      CaptureGraph(s->get(), [] { return absl::InvalidArgumentError("enqueue failed"); });
  CHECK(bad.status().message() == "enqueue failed");
  cudaStreamCaptureStatus status;
  CUDA_OK(cudaStreamIsCapturing(s->get(), &status));
  CHECK(status == cudaStreamCaptureStatusNone);
  STATUS_OK(AdvancePosition(pos.get(), s->get()));
  CUDA_OK(cudaStreamSynchronize(s->get()));
  CHECK(pos.Download()[0] == 12);
}

TEST_CASE("a batched step's rows: gathered from their sequences, moved on after") {
  // Rows 0..3 decode sequences 2, (padding), 0, 3; sequence 1 is idle.
  testing::GuardedArray<int> rows(std::vector<int>{2, -1, 0, 3});
  testing::GuardedArray<int> seq_token(std::vector<int>{10, 11, 12, 13});
  testing::GuardedArray<int> seq_pos(std::vector<int>{5, 6, 7, 8});
  testing::GuardedArray<int> tokens(std::vector<int>(4, -7)), positions(std::vector<int>(4, -7));
  STATUS_OK(GatherStepRows(rows.get(), seq_token.get(), seq_pos.get(), 4, tokens.get(),
                           positions.get(), nullptr));
  CHECK(tokens.Download() == std::vector<int>{12, 0, 10, 13});
  CHECK(positions.Download() == std::vector<int>{7, -1, 5, 8});
  testing::GuardedArray<int> sampled(std::vector<int>{20, 21, 22, 23});
  STATUS_OK(FinishStepRows(rows.get(), 4, sampled.get(), seq_token.get(), seq_pos.get(), nullptr));
  CHECK(seq_token.Download() == std::vector<int>{22, 11, 20, 23});
  CHECK(seq_pos.Download() == std::vector<int>{6, 6, 8, 9});
  // Without sampling (a forward-only step) the tokens stay.
  STATUS_OK(FinishStepRows(rows.get(), 4, nullptr, seq_token.get(), seq_pos.get(), nullptr));
  CHECK(seq_token.Download() == std::vector<int>{22, 11, 20, 23});
  CHECK(seq_pos.Download() == std::vector<int>{7, 6, 9, 10});
  CHECK(!GatherStepRows(nullptr, seq_token.get(), seq_pos.get(), 4, tokens.get(), positions.get(),
                        nullptr).ok());
  CHECK(!FinishStepRows(rows.get(), 0, nullptr, seq_token.get(), seq_pos.get(), nullptr).ok());
}

}  // namespace
}  // namespace dpl::kernels
