#include "kernels/gemm/cublas_api.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace dpl::kernels {
namespace {

constexpr char kLibrary[] = "libcublas.so.13";

template <class F>
absl::Status Resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (*fn != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(kLibrary, " has no ", name, " (cuBLAS 13 needed)"));
}

absl::StatusOr<CublasApi> Open() {
  // Never closed: its handles live until the process ends.
  void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open cuBLAS (", kLibrary, "), needed for prompts on the GPU: ",
        why != nullptr ? why : "unknown error",
        "; install the CUDA 13 toolkit's cuBLAS or add its folder to LD_LIBRARY_PATH"));
  }
  CublasApi a;
  for (const absl::Status& s :
       {Resolve(lib, "cublasCreate_v2", &a.create), Resolve(lib, "cublasDestroy_v2", &a.destroy),
        Resolve(lib, "cublasSetStream_v2", &a.set_stream),
        Resolve(lib, "cublasSetWorkspace_v2", &a.set_workspace),
        Resolve(lib, "cublasSetMathMode", &a.set_math_mode),
        Resolve(lib, "cublasSetSmCountTarget", &a.set_sm_count_target),
        Resolve(lib, "cublasGemmEx", &a.gemm_ex),
        Resolve(lib, "cublasGetStatusName", &a.status_name),
        Resolve(lib, "cublasGetStatusString", &a.status_string)}) {
    if (!s.ok()) return s;
  }
  return a;
}

}  // namespace

absl::StatusOr<const CublasApi*> Cublas() {
  static const absl::StatusOr<CublasApi>* const api = new absl::StatusOr<CublasApi>(Open());
  if (!api->ok()) return api->status();
  return &**api;
}

void PreloadCublas() { Cublas().IgnoreError(); }

}  // namespace dpl::kernels
