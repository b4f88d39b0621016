// Sixteen float lanes loaded from and stored to float32 or bfloat16 memory, under a lane
// mask, shared by the kernels that keep bf16 data (attention.cpp, smoothed_loss.cpp); and
// eight lanes' masks and stores for the AVX2 products.
// bf16 is widened exactly and narrowed rounding to nearest even, as PyTorch casts; a NaN
// stays a NaN.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace nmt::simd {

#define NMT_SIMD_LANES __attribute__((target("avx512f,avx512bw,avx512vl")))

// Full lanes load and store unmasked: a masked store does not forward to a later load.
NMT_SIMD_LANES inline __m512 load(const float* p, __mmask16 mask) {
  if (mask == 0xFFFF) return _mm512_loadu_ps(p);
  return _mm512_maskz_loadu_ps(mask, p);
}

NMT_SIMD_LANES inline __m512 load(const uint16_t* p, __mmask16 mask) {
  const __m256i half = mask == 0xFFFF ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                      : _mm256_maskz_loadu_epi16(mask, p);
  const __m512i bits = _mm512_cvtepu16_epi32(half);
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}

NMT_SIMD_LANES inline void store(float* p, __m512 x, __mmask16 mask) {
  if (mask == 0xFFFF) return _mm512_storeu_ps(p, x);
  _mm512_mask_storeu_ps(p, mask, x);
}

// The sixteen lanes rounded to bf16 and packed into 256 bits. The upper halves are
// gathered by a word permutation: a narrowing store (vpmovdw to memory) is microcoded on
// some AVX-512 CPUs.
NMT_SIMD_LANES inline __m256i to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC00000));
  const __m512i upper = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 31, 29,
                                         27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi16(upper, rounded));
}

NMT_SIMD_LANES inline void store(uint16_t* p, __m512 x, __mmask16 mask) {
  const __m256i packed = to_bf16(x);
  if (mask == 0xFFFF) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
  _mm256_mask_storeu_epi16(p, mask, packed);
}

#undef NMT_SIMD_LANES

// Eight float lanes for the AVX2 few-row products (fp32_linear.cpp, int8_linear.cpp).
#define NMT_SIMD_AVX2 __attribute__((target("avx2,fma")))

// The first `n` of 8 lanes (all of them from 8 up), as AVX2's masked loads and stores
// take them: masked-off lanes load as zeros and are not stored.
NMT_SIMD_AVX2 inline __m256i first_lanes8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n < 8 ? n : 8)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// An output's last step: [residual +] [relu](v), stored to y's lanes under `mask`, or
// with plain loads and stores where all eight lanes are valid (`whole`): a masked store
// costs about four plain ones on AMD's Zen 1 (5.1 against 1.3 ns), one an output vector.
NMT_SIMD_AVX2 inline void finish(__m256 v, bool relu, const float* residual, float* y,
                                 __m256i mask, bool whole) {
  if (relu) v = _mm256_max_ps(v, _mm256_setzero_ps());
  if (whole) {
    if (residual != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(residual));
    _mm256_storeu_ps(y, v);
    return;
  }
  if (residual != nullptr) v = _mm256_add_ps(v, _mm256_maskload_ps(residual, mask));
  _mm256_maskstore_ps(y, mask, v);
}

// The eight lanes' maximum, and their sum taken lane 0 to 7 (the kernels that reduce a
// row to one number: quantization's scale, the log-softmax's max and sum).
NMT_SIMD_AVX2 inline float horizontal_max(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float max = lanes[0];
  for (int i = 1; i < 8; ++i) max = max > lanes[i] ? max : lanes[i];
  return max;
}

NMT_SIMD_AVX2 inline float horizontal_sum(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float sum = 0.0f;
  for (const float lane : lanes) sum += lane;
  return sum;
}

#undef NMT_SIMD_AVX2

}  // namespace nmt::simd

#endif
