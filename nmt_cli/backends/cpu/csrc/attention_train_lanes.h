// The vector operations of training's attention (attention_train_body.h's `Ops`), written
// once over the lanes `V` (simd_width.h): attention_train.cpp includes this header and the
// body inside a namespace compiled for AVX-512 with V = Lanes16 and inside one compiled for
// AVX2 + FMA with V = Lanes8, so that every call inlines at its width. No include guard and
// no includes: it is meant to be included inside such a namespace, after attention_train.cpp's
// `Band` and `Strided`, with `V` declared.

struct Ops {
  using Vec = V::Vec;
  using Mask = V::Mask;
  static constexpr int64_t kWidth = V::kWidth;

  // Into whole vectors (zeros past n).
  template <typename T>
  static void widen(const T* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; i += kWidth) {
      V::store(out + i, V::load(x + i, V::first(n - i)), V::first(kWidth));
    }
  }
  template <typename T>
  static void narrow(const float* x, T* out, int64_t n) {
    for (int64_t i = 0; i < n; i += kWidth) {
      const Mask m = V::first(n - i);
      V::store(out + i, V::load(x + i, m), m);
    }
  }
  static float dot(const float* a, const float* b, int64_t n) {
    Vec total = V::zero();
    for (int64_t i = 0; i < n; i += kWidth) {
      const Mask m = V::first(n - i);
      total = V::fmadd(V::load(a + i, m), V::load(b + i, m), total);
    }
    return V::reduce_add(total);
  }
  static void axpy(float alpha, const float* x, float* y, int64_t n) {
    const Vec a = V::set1(alpha);
    for (int64_t i = 0; i < n; i += kWidth) {
      const Mask m = V::first(n - i);
      V::store(y + i, V::fmadd(a, V::load(x + i, m), V::load(y + i, m)), m);
    }
  }
  static void zero(float* y, int64_t n) {
    for (int64_t i = 0; i < n; i += kWidth) V::store(y + i, V::zero(), V::first(n - i));
  }
  // c (M x N, row stride ldc, a multiple of 16) = a (M x K, nonzero within `band`) b
  // (K x N, row stride ldb): blocks of up to four rows of c by two vectors of columns held
  // in registers (8 accumulators: AVX2 has 16 registers), each element of a broadcast from
  // memory. c's rows are written to whole vectors (zeros past N).
  static void gemm(int64_t M, int64_t N, int64_t K, Strided a, const float* b, int64_t ldb,
                   float* c, int64_t ldc, Band band = kFull) {
    for (int64_t n = 0; n < N; n += 2 * kWidth) {
      const Mask lo = V::first(N - n), hi = V::first(N - n - kWidth);
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) block<4>(m, n, K, band, a, b, ldb, c, ldc, lo, hi);
      switch (M - m) {
        case 3: block<3>(m, n, K, band, a, b, ldb, c, ldc, lo, hi); break;
        case 2: block<2>(m, n, K, band, a, b, ldb, c, ldc, lo, hi); break;
        case 1: block<1>(m, n, K, band, a, b, ldb, c, ldc, lo, hi); break;
        default: break;
      }
    }
  }
  // Rows m .. m + R - 1 of c, columns n .. n + 2 kWidth - 1; the columns of a any of the
  // rows needs.
  template <int R>
  static void block(int64_t m, int64_t n, int64_t K, Band band, Strided a, const float* b,
                    int64_t ldb, float* c, int64_t ldc, Mask lo, Mask hi) {
    const int64_t k0 = band.first(m, K), k1 = band.end(m + R - 1, K);
    Vec acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = V::zero();
    const bool two = hi != 0;
    for (int64_t k = k0; k < k1; ++k) {
      const Vec b0 = V::load(b + k * ldb + n, lo);
      const Vec b1 = two ? V::load(b + k * ldb + n + kWidth, hi) : b0;
      for (int r = 0; r < R; ++r) {
        const Vec x = V::set1(a(m + r, k));
        acc[r][0] = V::fmadd(x, b0, acc[r][0]);
        acc[r][1] = V::fmadd(x, b1, acc[r][1]);
      }
    }
    const Mask whole = V::first(kWidth);
    for (int r = 0; r < R; ++r) {
      V::store(c + (m + r) * ldc + n, acc[r][0], whole);
      if (two) V::store(c + (m + r) * ldc + n + kWidth, acc[r][1], whole);
    }
  }
  // In place; a row of -inf only (a query that may see no key) becomes zeros.
  static void softmax(float* x, int64_t n) {
    const Vec lowest = V::set1(-INFINITY);
    Vec vmax = lowest;
    for (int64_t i = 0; i < n; i += kWidth) {
      const Mask m = V::first(n - i);
      vmax = V::max(vmax, V::select(m, V::load(x + i, m), lowest));
    }
    const float max = V::reduce_max(vmax);
    if (max == -INFINITY) return zero(x, n);
    const Vec shift = V::set1(max);
    Vec vsum = V::zero();
    for (int64_t i = 0; i < n; i += kWidth) {
      const Mask m = V::first(n - i);
      // Masked keys hold -inf: their exponential is 0; lanes past n are kept out.
      const Vec e =
          V::select(m, simd::exp_nonpositive(V::sub(V::load(x + i, m), shift)), V::zero());
      vsum = V::add(vsum, e);
      V::store(x + i, e, m);
    }
    const Vec inv = V::set1(1.0f / V::reduce_add(vsum));
    for (int64_t i = 0; i < n; i += kWidth) {
      const Mask m = V::first(n - i);
      V::store(x + i, V::mul(V::load(x + i, m), inv), m);
    }
  }
};
