// exp(x) for x <= 0 on 16 (AVX-512) or 8 (AVX2) floats at once, shared by the kernels
// that need a softmax (log_softmax.cpp, attention.cpp): 2^k exp(r) with k = round(x / ln 2), r = x - k ln 2
// (in two parts), exp(r) by a degree-6 polynomial on |r| <= ln 2 / 2, accurate to about
// 2 ulp; below -87.3 the result is 0.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace nmt::simd {

// exp(r) on |r| <= ln 2 / 2: the degree-6 Taylor polynomial, by Horner from the top.
constexpr float kExpPolynomial[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6,
                                    0.5f,       1.0f,       1.0f};
constexpr float kLog2E = 1.44269504089f, kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
constexpr float kExpFloor = -87.3f;

__attribute__((target("avx512f"))) inline __m512 exp_nonpositive(__m512 x) {
  const __m512 floor = _mm512_set1_ps(kExpFloor);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ);
  x = _mm512_max_ps(x, floor);
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kExpPolynomial[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPolynomial[i]));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, k));
}

// The same on 8 floats with AVX2 and FMA (no `vscalefps`: 2^k is made from k's bits,
// exact for the k >= -126 the floor leaves), the same values lane for lane.
__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive(__m256 x) {
  const __m256 floor = _mm256_set1_ps(kExpFloor);
  const __m256 tiny = _mm256_cmp_ps(x, floor, _CMP_LT_OQ);
  x = _mm256_max_ps(x, floor);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2High), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kExpPolynomial[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPolynomial[i]));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

// The mask of the first `n` of 16 lanes (all of them from 16 up).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

}  // namespace nmt::simd

#endif
