// Float lanes at two widths behind one interface, so that a kernel's body is written once
// and compiled for AVX-512 (`Lanes16`) and for AVX2 + FMA (`Lanes8`): the body lives in a
// header included inside a namespace under `#pragma GCC target(...)`, with `V` naming one
// of these (attention_body.h). Each function carries its own target, so it inlines into
// a body compiled for that level or above and nowhere else.
//
// A load or store of fewer lanes than the width takes a lane mask (AVX-512) or a lane
// count (AVX2: `vmaskmovps` stores are slow on some AMD cores, so full vectors go
// unmasked and only a tail pays). bf16 is widened exactly and narrowed rounding to nearest
// even, as PyTorch casts (simd_lanes.h).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "cpu_level.h"
#include "simd_exp.h"
#include "simd_lanes.h"

namespace nmt::simd {

// Which compilation of a body written over these lanes runs: sixteen lanes from the
// AVX-512 level in force up, eight below it (the caller has checked for AVX2 + FMA).
template <typename F>
F by_level(F lanes16, F lanes8) {
  return cpu_level_at_least(CpuLevel::kAvx512) ? lanes16 : lanes8;
}

#define NMT_LANES16 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define NMT_LANES8 __attribute__((target("avx2,fma")))

struct Lanes16 {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr int64_t kWidth = 16;

  NMT_LANES16 static Mask first(int64_t n) { return n > 0 ? first_lanes(n) : 0; }
  template <typename T>
  NMT_LANES16 static Vec load(const T* p, Mask m) {
    return simd::load(p, m);
  }
  template <typename T>
  NMT_LANES16 static void store(T* p, Vec x, Mask m) {
    simd::store(p, x, m);
  }
  NMT_LANES16 static Vec zero() { return _mm512_setzero_ps(); }
  NMT_LANES16 static Vec set1(float x) { return _mm512_set1_ps(x); }
  NMT_LANES16 static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  NMT_LANES16 static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  NMT_LANES16 static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  NMT_LANES16 static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  NMT_LANES16 static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  // a's lanes under m, b's elsewhere.
  NMT_LANES16 static Vec select(Mask m, Vec a, Vec b) { return _mm512_mask_blend_ps(m, b, a); }
  // Bit j set where lane j of a is above b's (never for a NaN), among the lanes under m.
  NMT_LANES16 static uint32_t above(Mask m, Vec a, Vec b) {
    return _mm512_mask_cmp_ps_mask(m, a, b, _CMP_GT_OQ);
  }
  // a as computed: the compiler may not fuse the multiplication that made it into a
  // following addition (an FMA rounds once where the plain loops round twice).
  NMT_LANES16 static Vec rounded(Vec a) {
    __asm__("" : "+v"(a));
    return a;
  }
  // b's lanes where a's lane is above zero, zeros elsewhere (where a is NaN too).
  NMT_LANES16 static Vec where_positive(Vec a, Vec b) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GT_OQ), b);
  }
  NMT_LANES16 static float reduce_add(Vec a) { return _mm512_reduce_add_ps(a); }
  NMT_LANES16 static float reduce_max(Vec a) { return _mm512_reduce_max_ps(a); }

  // The sums of eight vectors, lane j of the result the sum of a[j]'s 16 lanes.
  NMT_LANES16 static __m256 sum8(const Vec (&a)[8]) {
    __m512 b[4], c[2];
    for (int i = 0; i < 4; ++i) {  // 256-bit halves: [a_2i lo + hi | a_2i+1 lo + hi]
      b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                           _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    }
    for (int i = 0; i < 2; ++i) {  // 128-bit lanes: four partial sums of a_4i .. a_4i+3
      c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    }
    // Lane l of 128 bits: [a_l, a_4+l, a_l, a_4+l] after two rounds of pairwise adds.
    __m512 d = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
    d = _mm512_add_ps(d, _mm512_shuffle_ps(d, d, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512i order =
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, d));
  }
};

struct Lanes8 {
  using Vec = __m256;
  using Mask = int64_t;  // how many of the first lanes, 0 to 8
  static constexpr int64_t kWidth = 8;

  NMT_LANES8 static Mask first(int64_t n) { return n < 8 ? (n < 0 ? 0 : n) : 8; }
  NMT_LANES8 static Vec load(const float* p, Mask m) {
    if (m == 8) return _mm256_loadu_ps(p);
    return _mm256_maskload_ps(p, first_lanes8(m));
  }
  NMT_LANES8 static Vec load(const uint16_t* p, Mask m) {
    __m128i half;
    if (m == 8) {
      half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {  // no 16-bit masked load before AVX-512: whole pairs, then an odd last one
      half = _mm_maskload_epi32(reinterpret_cast<const int*>(p), first_pairs(m));
      if (m % 2 != 0) {
        const __m128i last = _mm_set1_epi16(static_cast<int16_t>(p[m - 1]));
        half = _mm_or_si128(half, _mm_and_si128(last, lane16(m - 1)));
      }
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
  }
  NMT_LANES8 static void store(float* p, Vec x, Mask m) {
    if (m == 8) return _mm256_storeu_ps(p, x);
    _mm256_maskstore_ps(p, first_lanes8(m), x);
  }
  NMT_LANES8 static void store(uint16_t* p, Vec x, Mask m) {
    const __m128i packed = to_bf16(x);
    if (m == 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
    _mm_maskstore_epi32(reinterpret_cast<int*>(p), first_pairs(m), packed);
    if (m % 2 != 0) {
      alignas(16) uint16_t lanes[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(lanes), packed);
      p[m - 1] = lanes[m - 1];
    }
  }
  // The partial loads and stores of 16-bit lanes call no function (memcpy would make
  // every vector register of a caller's loop go through memory around the call): the
  // 32-bit pairs of the first m lanes (m < 8), and 16-bit lane i alone.
  NMT_LANES8 static __m128i first_pairs(Mask m) {
    return _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(m / 2)), _mm_setr_epi32(0, 1, 2, 3));
  }
  NMT_LANES8 static __m128i lane16(Mask i) {
    return _mm_cmpeq_epi16(_mm_set1_epi16(static_cast<int16_t>(i)),
                           _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
  }
  NMT_LANES8 static Vec zero() { return _mm256_setzero_ps(); }
  NMT_LANES8 static Vec set1(float x) { return _mm256_set1_ps(x); }
  NMT_LANES8 static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  NMT_LANES8 static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  NMT_LANES8 static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  NMT_LANES8 static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  NMT_LANES8 static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  NMT_LANES8 static Vec select(Mask m, Vec a, Vec b) {
    if (m == 8) return a;
    return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(first_lanes8(m)));
  }
  NMT_LANES8 static uint32_t above(Mask m, Vec a, Vec b) {
    const auto bits = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)));
    return bits & ((1u << m) - 1u);
  }
  NMT_LANES8 static Vec rounded(Vec a) {
    __asm__("" : "+x"(a));
    return a;
  }
  NMT_LANES8 static Vec where_positive(Vec a, Vec b) {
    return _mm256_and_ps(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OQ), b);
  }
  NMT_LANES8 static float reduce_add(Vec a) { return horizontal_sum(a); }
  NMT_LANES8 static float reduce_max(Vec a) { return horizontal_max(a); }

  // Eight lanes rounded to bf16 as simd_lanes.h's to_bf16 rounds sixteen.
  NMT_LANES8 static __m128i to_bf16(Vec x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    rounded = _mm256_castps_si256(_mm256_blendv_ps(
        _mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan));
    // The upper halves (at most 0xFFFF, so unsigned saturation keeps them) in order.
    const __m256i upper = _mm256_srli_epi32(rounded, 16);
    const __m256i packed = _mm256_packus_epi32(upper, upper);  // [0..3 0..3 | 4..7 4..7]
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
  }

  // The sums of eight vectors, lane j of the result the sum of a[j]'s 8 lanes.
  NMT_LANES8 static __m256 sum8(const Vec (&a)[8]) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    // [a0..a3 low-half sums | a0..a3 high-half sums], the same for a4..a7
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
  }
};

#undef NMT_LANES16
#undef NMT_LANES8

}  // namespace nmt::simd

#endif
