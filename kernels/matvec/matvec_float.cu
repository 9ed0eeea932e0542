// Matvec kernels for float weights (f32, f16, bf16; vector and scalar
// forms): instantiations of the skeleton (matvec_skeleton.cuh).
#include "kernels/matvec/matvec_skeleton.cuh"

namespace dpl::kernels {

MatVecKernelFn PickFloatMatVec(MatVecKernel kernel, const MatVecGeometry& g) {
  using matvec_detail::PickGeometry;
  using formats::GgmlType;
  switch (kernel) {
    case MatVecKernel::kF32:
      if (g == kF32WideTile) return matvec_detail::MatVecT<F32Vec, kTokenTile, 8, 4, false>;
      return PickGeometry<F32Vec>(g);
    case MatVecKernel::kF32Scalar: return PickGeometry<FloatScalar<GgmlType::kF32>>(g);
    case MatVecKernel::kF16: return PickGeometry<F16Vec>(g);
    case MatVecKernel::kF16Scalar: return PickGeometry<FloatScalar<GgmlType::kF16>>(g);
    case MatVecKernel::kBF16: return PickGeometry<BF16Vec>(g);
    case MatVecKernel::kBF16Scalar: return PickGeometry<FloatScalar<GgmlType::kBF16>>(g);
    default: return nullptr;
  }
}

}  // namespace dpl::kernels
