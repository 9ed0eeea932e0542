// Matvec kernels for the 256-weight k-quant blocks (q2_K, q3_K, q4_K, q5_K,
// q6_K, iq4_xs), raw and (where they have one) dpl layouts: instantiations
// of the skeleton (matvec_skeleton.cuh), and the mixed q4_K + q6_K form.
#include "kernels/matvec/matvec_skeleton.cuh"

namespace dpl::kernels {

MatVecKernelFn PickKQuantMatVec(MatVecKernel kernel, const MatVecGeometry& g) {
  using matvec_detail::PickGeometry;
  using formats::GgmlType;
  switch (kernel) {
    case MatVecKernel::kQ2K: return PickGeometry<K23<GgmlType::kQ2_K, false>>(g);
    case MatVecKernel::kQ2KDpl: return PickGeometry<K23<GgmlType::kQ2_K, true>>(g);
    case MatVecKernel::kQ3K: return PickGeometry<K23<GgmlType::kQ3_K, false>>(g);
    case MatVecKernel::kQ3KDpl: return PickGeometry<K23<GgmlType::kQ3_K, true>>(g);
    case MatVecKernel::kQ4K: return PickGeometry<Q4K>(g);
    case MatVecKernel::kQ5K: return PickGeometry<Q5K>(g);
    case MatVecKernel::kQ6KRaw: return PickGeometry<Q6K<false>>(g);
    case MatVecKernel::kQ6KDpl: return PickGeometry<Q6K<true>>(g);
    case MatVecKernel::kIQ4XS: return PickGeometry<IQ4XS<false>>(g);
    case MatVecKernel::kIQ4XSDpl: return PickGeometry<IQ4XS<true>>(g);
    default: return nullptr;
  }
}

MatVecKernelFn PickRopeMatVec(MatVecKernel kernel, MatVecKernel last, const MatVecGeometry& g) {
  using matvec_detail::PickRope;
  if (!FoldsRope(kernel, last, g)) return nullptr;
  const bool mixed = last != kernel;
  switch (kernel) {
    case MatVecKernel::kQ4K:
      if (!mixed) return PickRope<Q4K, Q4K>(g);
      return last == MatVecKernel::kQ6KDpl ? PickRope<Q4K, Q6K<true>>(g) : PickRope<Q4K, Q6K<false>>(g);
    case MatVecKernel::kQ6KRaw: return PickRope<Q6K<false>, Q6K<false>>(g);
    case MatVecKernel::kQ6KDpl: return PickRope<Q6K<true>, Q6K<true>>(g);
    default: return nullptr;
  }
}

MatVecKernelFn PickMixedMatVec(MatVecKernel kernel, MatVecKernel last, const MatVecGeometry& g) {
  using matvec_detail::PickMixed;
  if (kernel != MatVecKernel::kQ4K) return nullptr;
  if (last == MatVecKernel::kQ6KDpl) return PickMixed<Q4K, Q6K<true>>(g);
  if (last == MatVecKernel::kQ6KRaw) return PickMixed<Q4K, Q6K<false>>(g);
  return nullptr;
}

}  // namespace dpl::kernels
