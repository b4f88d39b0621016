// One row of the loss sweep (smoothed_loss.cpp), written once over the lanes `V`
// (simd_width.h): smoothed_loss.cpp includes it inside a namespace compiled for AVX-512
// with V = Lanes16 and inside one compiled for AVX2 + FMA with V = Lanes8. No include
// guard and no includes: it is meant to be included inside such a namespace, after
// smoothed_loss.cpp's `RowSums`, with `V` declared.

// The row's max and mean; exp(x - max) into e and its sum; the gradient's first part,
// scale * softmax - offset, into grad (when given), in T.
template <typename T>
RowSums row_lanes(const T* x, int64_t n, float* e, T* grad, float scale, float offset) {
  using Vec = V::Vec;
  using Mask = V::Mask;
  constexpr int64_t kWidth = V::kWidth;
  const Vec lowest = V::set1(-INFINITY);
  Vec vmax = lowest, vtotal = V::zero();
  for (int64_t i = 0; i < n; i += kWidth) {
    const Mask mask = V::first(n - i);
    const Vec v = V::load(x + i, mask);  // zeros past n
    vmax = V::max(vmax, V::select(mask, v, lowest));
    vtotal = V::add(vtotal, v);
  }
  const float max = V::reduce_max(vmax);
  const Vec shift = V::set1(max);
  Vec vsum = V::zero();
  for (int64_t i = 0; i < n; i += kWidth) {
    const Mask mask = V::first(n - i);
    const Vec shifted = V::sub(V::load(x + i, mask), shift);
    const Vec ex = V::select(mask, simd::exp_nonpositive(shifted), V::zero());
    vsum = V::add(vsum, ex);
    V::store(e + i, ex, mask);
  }
  const float sum = V::reduce_add(vsum);
  if (grad != nullptr) {
    const Vec inv = V::set1(scale / sum), off = V::set1(-offset);
    for (int64_t i = 0; i < n; i += kWidth) {
      const Mask mask = V::first(n - i);
      V::store(grad + i, V::fmadd(V::load(e + i, mask), inv, off), mask);
    }
  }
  return {max + std::log(sum), V::reduce_add(vtotal) / static_cast<float>(n), sum};
}
