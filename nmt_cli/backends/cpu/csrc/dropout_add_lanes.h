// The vector loops of dropout's residual add and gradient (dropout_mask.cpp), written
// once over the lanes `V` (simd_width.h): dropout_mask.cpp includes this header inside a
// namespace compiled for AVX-512 with V = Lanes16 and inside one compiled for AVX2 + FMA
// with V = Lanes8, after its plain loops, which these compute bit for bit (the product is
// rounded before the sum, never fused with it). No include guard and no includes.

// out = residual + x * m; where the sum is wider than x (a bf16 product added to a
// float32 residual), the product is first rounded to x's dtype, as PyTorch promotes.
template <typename R, typename X, typename O>
void add_scaled(const R* r, const X* x, const float* m, O* out, int64_t n) {
  for (int64_t i = 0; i < n; i += V::kWidth) {
    const auto k = V::first(n - i);
    auto product = V::rounded(V::mul(V::load(x + i, k), V::load(m + i, k)));
    if constexpr (!std::is_same_v<X, O>) {
      alignas(64) X rounded[V::kWidth];
      V::store(rounded, product, V::first(V::kWidth));
      product = V::load(rounded, V::first(V::kWidth));
    }
    V::store(out + i, V::add(V::load(r + i, k), product), k);
  }
}

// out = g * m, rounded to out's dtype.
template <typename G, typename X>
void scale(const G* g, const float* m, X* out, int64_t n) {
  for (int64_t i = 0; i < n; i += V::kWidth) {
    const auto k = V::first(n - i);
    V::store(out + i, V::mul(V::load(g + i, k), V::load(m + i, k)), k);
  }
}

// out = residual + (x + b) * m in float32 (b a float32 bias), each step rounded.
template <typename R, typename X, typename O>
void add_biased(const R* r, const X* x, const float* b, const float* m, O* out, int64_t n) {
  for (int64_t i = 0; i < n; i += V::kWidth) {
    const auto k = V::first(n - i);
    const auto biased = V::add(V::load(x + i, k), V::load(b + i, k));
    const auto product = V::rounded(V::mul(biased, V::load(m + i, k)));
    V::store(out + i, V::add(V::load(r + i, k), product), k);
  }
}

// out = g * m, rounded to out's dtype; the float32 products added to `sums`.
template <typename G, typename X>
void scale_summed(const G* g, const float* m, X* out, float* sums, int64_t n) {
  for (int64_t i = 0; i < n; i += V::kWidth) {
    const auto k = V::first(n - i);
    const auto product = V::rounded(V::mul(V::load(g + i, k), V::load(m + i, k)));
    V::store(out + i, product, k);
    V::store(sums + i, V::add(V::load(sums + i, k), product), k);
  }
}
