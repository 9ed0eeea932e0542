// Matvec kernels for the 32-weight block types (q8_0, q4_0, q4_1, q5_0,
// q5_1, iq4_nl), raw and dpl layouts: instantiations of the skeleton
// (matvec_skeleton.cuh).
#include "kernels/matvec/matvec_skeleton.cuh"

namespace dpl::kernels {

MatVecKernelFn PickQ32MatVec(MatVecKernel kernel, const MatVecGeometry& g) {
  using matvec_detail::PickGeometry;
  using formats::GgmlType;
  switch (kernel) {
    case MatVecKernel::kQ8_0: return PickGeometry<Q8_0<false>>(g);
    case MatVecKernel::kQ8_0Dpl: return PickGeometry<Q8_0<true>>(g);
    case MatVecKernel::kQ4_0: return PickGeometry<Nib4<GgmlType::kQ4_0, false>>(g);
    case MatVecKernel::kQ4_0Dpl: return PickGeometry<Nib4<GgmlType::kQ4_0, true>>(g);
    case MatVecKernel::kQ4_1: return PickGeometry<Nib4<GgmlType::kQ4_1, false>>(g);
    case MatVecKernel::kQ4_1Dpl: return PickGeometry<Nib4<GgmlType::kQ4_1, true>>(g);
    case MatVecKernel::kIQ4NL: return PickGeometry<Nib4<GgmlType::kIQ4_NL, false>>(g);
    case MatVecKernel::kIQ4NLDpl: return PickGeometry<Nib4<GgmlType::kIQ4_NL, true>>(g);
    case MatVecKernel::kQ5_0: return PickGeometry<Nib5<GgmlType::kQ5_0, false>>(g);
    case MatVecKernel::kQ5_0Dpl: return PickGeometry<Nib5<GgmlType::kQ5_0, true>>(g);
    case MatVecKernel::kQ5_1: return PickGeometry<Nib5<GgmlType::kQ5_1, false>>(g);
    case MatVecKernel::kQ5_1Dpl: return PickGeometry<Nib5<GgmlType::kQ5_1, true>>(g);
    default: return nullptr;
  }
}

}  // namespace dpl::kernels
