// What the GPU tests (tags gpu, manual) share: assertion macros for CUDA
// calls and absl::Status, and device arrays guarded by sentinels so that a
// kernel writing past its output is caught.
#pragma once

#include <doctest/doctest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"

#define CUDA_OK(call) REQUIRE_MESSAGE((call) == cudaSuccess, #call)
#define STATUS_OK(expr)                           \
  do {                                            \
    const absl::Status gpu_test_st_ = (expr);     \
    REQUIRE_MESSAGE(gpu_test_st_.ok(), gpu_test_st_.ToString()); \
  } while (0)

namespace dpl::testing {

// sqrt(sum (got - ref)^2 / sum ref^2): the error measure every GPU test
// compares against its float64 CPU reference.
inline double NormErr(const float* got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-300));
}
inline double NormErr(const std::vector<float>& got, const std::vector<double>& ref) {
  return NormErr(got.data(), ref);
}

// n values of T on the device followed by kGuardBytes sentinel bytes (0xA5);
// Download() fails the test when a sentinel was overwritten.
template <typename T>
class GuardedArray {
 public:
  static constexpr size_t kGuardBytes = 64;

  explicit GuardedArray(size_t n) : n_(n) {
    CUDA_OK(cudaMalloc(&p_, n * sizeof(T) + kGuardBytes));
    CUDA_OK(cudaMemset(p_, 0, n * sizeof(T)));
    CUDA_OK(cudaMemset(reinterpret_cast<char*>(p_) + n * sizeof(T), 0xA5, kGuardBytes));
  }
  explicit GuardedArray(const std::vector<T>& host) : GuardedArray(host.size()) { Upload(host); }
  ~GuardedArray() { cudaFree(p_); }
  GuardedArray(const GuardedArray&) = delete;
  GuardedArray& operator=(const GuardedArray&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    CUDA_OK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    uint8_t guard[kGuardBytes];
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(guard, reinterpret_cast<char*>(p_) + n_ * sizeof(T), kGuardBytes,
                       cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < kGuardBytes; ++i) {
      REQUIRE_MESSAGE(guard[i] == 0xA5, "sentinel byte " << i << " after the output overwritten");
    }
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace dpl::testing
