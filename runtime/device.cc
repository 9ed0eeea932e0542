#include "runtime/device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "formats/mapped_file.h"
#include "formats/model_file.h"
#include "formats/parallel_for.h"
#include "kernels/gemm/cublas_api.h"
#include "runtime/cuda/cuda_decoder.h"
#include "runtime/reference/reference_model.h"

namespace dpl::runtime {
namespace {

// The CPU device: one reference forward pass per token.
class CpuDecoder : public generate::Decoder {
 public:
  explicit CpuDecoder(std::unique_ptr<reference::ReferenceModel> model)
      : model_(std::move(model)) {}

  int32_t n_vocab() const override { return model_->n_vocab(); }
  int64_t n_ctx() const override { return model_->n_ctx(); }
  int64_t n_past() const override { return n_past_; }

  absl::Status Eval(absl::Span<const int32_t> tokens, std::vector<float>* last,
                    std::vector<float>* all) override {
    if (n_past_ + static_cast<int64_t>(tokens.size()) > model_->n_ctx()) {
      return absl::OutOfRangeError(absl::StrCat(
          n_past_ + tokens.size(), " tokens do not fit in the context of ",
          model_->n_ctx(), " (use -c to enlarge it)"));
    }
    if (all != nullptr) all->clear();
    for (int32_t token : tokens) {
      if (token < 0 || token >= model_->n_vocab()) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", token, " is outside the vocabulary [0, ", model_->n_vocab(), ")"));
      }
      DPL_ASSIGN_OR_RETURN(std::vector<float> logits, model_->Forward(token, n_past_));
      ++n_past_;
      if (all != nullptr) all->insert(all->end(), logits.begin(), logits.end());
      if (last != nullptr) *last = std::move(logits);
    }
    return absl::OkStatus();
  }

  absl::Status Rewind(int64_t n) override {
    if (n > n_past_ || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot rewind to ", n, " of ", n_past_));
    }
    // The reference drops cached positions >= pos when it next runs pos.
    n_past_ = n;
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<reference::ReferenceModel> model_;
  int64_t n_past_ = 0;
};

}  // namespace

std::future<double> StartDeviceInit(const std::string& device) {
  if (device != "cuda") {
    std::promise<double> none;
    none.set_value(0);
    return none.get_future();
  }
  return std::async(std::launch::async, [] {
    const auto t0 = std::chrono::steady_clock::now();
    // cuBLAS is opened alongside (its constructors: kernels/gemm/cublas_api.h).
    std::future<void> cublas = std::async(std::launch::async, kernels::PreloadCublas);
    // Creates the primary context. An error here (no GPU) is reported by
    // CreateDecoder, which asks again.
    if (cudaFree(nullptr) != cudaSuccess) cudaGetLastError();  // not left for a later check
    cublas.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
}

WeightPrefault StartWeightPrefault(std::shared_ptr<const formats::ModelFile> index) {
  std::shared_ptr<const formats::MappedFile> m;
  if (index != nullptr && index->dpl_file() != nullptr) m = index->dpl_file()->mapping();
  WeightPrefault r;
  if (m == nullptr || m->size() == 0) {
    std::promise<double> rate, seconds;
    rate.set_value(0);
    seconds.set_value(0);
    r.host_copy_gb_per_s = rate.get_future();
    r.seconds = seconds.get_future();
    return r;
  }
  auto rate = std::make_shared<std::promise<double>>();
  r.host_copy_gb_per_s = rate->get_future();
  r.seconds = std::async(std::launch::async, [m, rate] {
    const auto t0 = std::chrono::steady_clock::now();
    constexpr uint64_t kMeasure = 256ull << 20, kSlice = 64ull << 20;
    rate->set_value(MeasureHostCopy(*m, kMeasure, 0, LoadOptions()));
    const int threads =
        static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
    // Populate is a hint: a range it cannot map is read (and reported) by
    // the loader itself.
    const uint64_t rest = m->size() > kMeasure ? m->size() - kMeasure : 0;
    formats::ParallelFor(threads, (rest + kSlice - 1) / kSlice, [&](size_t i) {
      m->Populate(kMeasure + i * kSlice, kSlice);
      return absl::OkStatus();
    }).IgnoreError();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  return r;
}

absl::StatusOr<std::unique_ptr<generate::Decoder>> CreateDecoder(const std::string& path,
                                                                 const DeviceOptions& options) {
  if (options.device == "cpu") {
    DPL_ASSIGN_OR_RETURN(std::shared_ptr<formats::ModelFile> model, formats::ModelFile::Open(path));
    reference::ReferenceOptions ro;
    ro.threads = options.threads;
    ro.n_ctx = options.n_ctx;
    DPL_ASSIGN_OR_RETURN(std::unique_ptr<reference::ReferenceModel> ref,
                         reference::ReferenceModel::Load(std::move(model), ro));
    return std::unique_ptr<generate::Decoder>(new CpuDecoder(std::move(ref)));
  }
  if (options.device == "cuda") {
    CudaDecoderOptions co;
    co.n_ctx = options.n_ctx;
    co.eager = options.eager;
    co.max_batch = options.max_batch;
    co.index = options.index;
    DPL_ASSIGN_OR_RETURN(co.load.method, ParseUploadMethod(options.weights_upload));
    co.load.host_copy_gb_per_s = options.host_copy_gb_per_s;
    DPL_ASSIGN_OR_RETURN(std::unique_ptr<CudaDecoder> cuda, CudaDecoder::Create(path, co));
    return std::unique_ptr<generate::Decoder>(std::move(cuda));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", options.device, "' (expected cuda or cpu)"));
}

}  // namespace dpl::runtime
