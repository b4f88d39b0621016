// Sixteen float lanes loaded from and stored to float32 or bfloat16 memory, under a lane
// mask, shared by the kernels that keep bf16 data (attention.cpp, smoothed_loss.cpp).
// bf16 is widened exactly and narrowed rounding to nearest even, as PyTorch casts; a NaN
// stays a NaN.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace nmt::simd {

#define NMT_SIMD_LANES __attribute__((target("avx512f,avx512bw,avx512vl")))

NMT_SIMD_LANES inline __m512 load(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}

NMT_SIMD_LANES inline __m512 load(const uint16_t* p, __mmask16 mask) {
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}

NMT_SIMD_LANES inline void store(float* p, __m512 x, __mmask16 mask) {
  _mm512_mask_storeu_ps(p, mask, x);
}

NMT_SIMD_LANES inline void store(uint16_t* p, __m512 x, __mmask16 mask) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC00000));
  _mm256_mask_storeu_epi16(p, mask, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

#undef NMT_SIMD_LANES

}  // namespace nmt::simd

#endif
