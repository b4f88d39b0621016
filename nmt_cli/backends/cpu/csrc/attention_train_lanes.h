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
  // scale * a (rows x cols, row stride lda) -> out (cols x rows, row stride ldo): 8 x 8
  // blocks transposed in AVX registers (both targets have them), the edges one element at
  // a time. The same products as plain's loop, element for element.
  static void transpose(const float* a, int64_t rows, int64_t cols, int64_t lda, float scale,
                        float* out, int64_t ldo) {
    const __m256 s = _mm256_set1_ps(scale);
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
      int64_t c = 0;
      for (; c + 8 <= cols; c += 8) {
        __m256 x[8];
        for (int i = 0; i < 8; ++i) x[i] = _mm256_mul_ps(s, _mm256_loadu_ps(a + (r + i) * lda + c));
        transpose8(x);
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + (c + j) * ldo + r, x[j]);
      }
      for (; c < cols; ++c) {
        for (int i = 0; i < 8; ++i) out[c * ldo + r + i] = scale * a[(r + i) * lda + c];
      }
    }
    for (; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[c * ldo + r] = scale * a[r * lda + c];
    }
  }
  // Rows i of x become its columns: pairs interleaved, then quads, then the halves swapped.
  static void transpose8(__m256 (&x)[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
      x[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
      x[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
  }
  // c (M x N, row stride ldc, a multiple of 16) = a (M x K, nonzero within `band`) b
  // (K x N, row stride ldb): blocks of up to four rows of c by two vectors of columns held
  // in registers (8 accumulators: AVX2 has 16 registers), or by one where no more than a
  // vector's columns are left, each element of a broadcast from memory. c's rows are
  // written to whole vectors (zeros past N).
  static void gemm(int64_t M, int64_t N, int64_t K, Strided a, const float* b, int64_t ldb,
                   float* c, int64_t ldc, Band band = kFull) {
    for (int64_t n = 0; n < N; n += 2 * kWidth) {
      if (N - n > kWidth) {
        columns<2>(M, n, N, K, band, a, b, ldb, c, ldc);
      } else {
        columns<1>(M, n, N, K, band, a, b, ldb, c, ldc);
      }
    }
  }
  // Every row of c, C vectors of columns from n.
  template <int C>
  static void columns(int64_t M, int64_t n, int64_t N, int64_t K, Band band, Strided a,
                      const float* b, int64_t ldb, float* c, int64_t ldc) {
    const Mask mask[2] = {V::first(N - n), V::first(N - n - kWidth)};
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) block<4, C>(m, n, K, band, a, b, ldb, c, ldc, mask);
    switch (M - m) {
      case 3: block<3, C>(m, n, K, band, a, b, ldb, c, ldc, mask); break;
      case 2: block<2, C>(m, n, K, band, a, b, ldb, c, ldc, mask); break;
      case 1: block<1, C>(m, n, K, band, a, b, ldb, c, ldc, mask); break;
      default: break;
    }
  }
  // Rows m .. m + R - 1 of c, columns n .. n + C kWidth - 1; the columns of a any of the
  // rows needs.
  template <int R, int C>
  static void block(int64_t m, int64_t n, int64_t K, Band band, Strided a, const float* b,
                    int64_t ldb, float* c, int64_t ldc, const Mask (&mask)[2]) {
    const int64_t k0 = band.first(m, K), k1 = band.end(m + R - 1, K);
    // Every loop over the tile unrolled: GCC otherwise keeps `acc` in memory as well and
    // stores all of it on every k (a store per multiply-add).
    Vec acc[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) acc[r][j] = V::zero();
    }
    for (int64_t k = k0; k < k1; ++k) {
      Vec bk[C];
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) bk[j] = V::load(b + k * ldb + n + j * kWidth, mask[j]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const Vec x = V::set1(a(m + r, k));
#pragma GCC unroll 4
        for (int j = 0; j < C; ++j) acc[r][j] = V::fmadd(x, bk[j], acc[r][j]);
      }
    }
    const Mask whole = V::first(kWidth);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) V::store(c + (m + r) * ldc + n + j * kWidth, acc[r][j], whole);
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
