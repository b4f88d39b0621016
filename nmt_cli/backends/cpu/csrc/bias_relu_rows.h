// The vector loops of bias_relu.cpp, written once over the lanes `V` (simd_width.h):
// bias_relu.cpp includes this header inside a namespace compiled for AVX-512 with V =
// Lanes16 and inside one compiled for AVX2 + FMA with V = Lanes8. No include guard and no
// includes: it is meant to be included inside such a namespace, with `V` declared.

// Rows [begin, end) of y (row length n) <- max(0, y + b). The zero is max's first
// operand, so that a NaN (which max answers with its second operand) stays NaN.
template <typename T>
void bias_relu_rows(T* y, const float* b, int64_t begin, int64_t end, int64_t n) {
  const typename V::Vec zero = V::zero();
  for (int64_t r = begin; r < end; ++r) {
    T* row = y + r * n;
    for (int64_t i = 0; i < n; i += V::kWidth) {
      const auto m = V::first(n - i);
      V::store(row + i, V::max(zero, V::add(V::load(row + i, m), V::load(b + i, m))), m);
    }
  }
}

// Rows [begin, end): out = g where y > 0 else 0, and sums += out, column by column.
template <typename T>
void relu_bias_backward_rows(const T* g, const T* y, T* out, float* sums, int64_t begin,
                             int64_t end, int64_t n) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t at = r * n;
    for (int64_t i = 0; i < n; i += V::kWidth) {
      const auto m = V::first(n - i);
      const auto kept = V::where_positive(V::load(y + at + i, m), V::load(g + at + i, m));
      V::store(out + at + i, kept, m);  // exact: kept is g's own value or 0
      V::store(sums + i, V::add(V::load(sums + i, m), kept), m);
    }
  }
}
