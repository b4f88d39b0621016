// Training's dropout mask on a CPU, in one pass over the mask (core/dropout.py has the
// reference, which is four PyTorch operations: `random_` over 64-bit words, the 16-bit
// comparison, the cast and the scaling).
//
// PyTorch's CPU `random_` runs its Mersenne Twister serially, one element after another,
// so on a small model's activations the reference's random numbers take a few percent of
// a training update on any number of threads. Here the random numbers come from a
// counter-based generator instead: 64-bit word w of the mask is SplitMix64's output for
// the counter seed + (w + 1) * golden ratio (Steele, Lea and Flood 2014; it passes
// BigCrush), and its four 16-bit quarters decide elements 4w to 4w + 3, each dropped when
// its quarter is below round(p * 65536), as the reference draws them. Any word can be
// computed on its own, so the threads split the words and the mask does not depend on
// how many there are; and the words go eight (AVX-512) or four (AVX2) at a time through
// vector loops, with the plain loop's integers, so the mask is the same on every CPU
// (6-9x faster than the plain loop). The seed comes from PyTorch's default generator
// (training.py), so `torch.manual_seed` reproduces the masks.

#include "dropout_mask.h"
#include "cpu_level.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_width.h"
#endif

namespace nmt {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ULL, kMix2 = 0x94D049BB133111EBULL;

inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  return z ^ (z >> 31);
}

// Elements 4w to 4w + 3 (those below n) from word w: the plain loop, every CPU's, and
// the vector loops' tail.
template <typename scalar_t>
inline void fill_words(scalar_t* out, int64_t n, int64_t begin, int64_t end, uint64_t seed,
                       uint32_t threshold, scalar_t kept, scalar_t dropped) {
  for (int64_t w = begin; w < end; ++w) {
    const uint64_t bits = splitmix64(seed + static_cast<uint64_t>(w + 1) * kGolden);
    const int64_t first = 4 * w;
    const int64_t count = first + 4 <= n ? 4 : n - first;
    for (int64_t k = 0; k < count; ++k) {
      const uint32_t quarter = static_cast<uint32_t>(bits >> (16 * k)) & 0xFFFFu;
      out[first + k] = quarter >= threshold ? kept : dropped;
    }
  }
}

#if defined(__x86_64__)
// 64-bit words eight (AVX-512) or four (AVX2) at a time, behind one interface, so that
// the vector loop (dropout_mask_words.h) is written once. Each function carries its own
// target, as simd_width.h's lanes do.
#define NMT_WORDS8 __attribute__((target("avx512f,avx512dq,avx512bw,avx2")))
#define NMT_WORDS4 __attribute__((target("avx2")))

struct Words8 {
  using Vec = __m512i;
  static constexpr int64_t kCount = 8;

  NMT_WORDS8 static Vec set1(uint64_t x) { return _mm512_set1_epi64(static_cast<int64_t>(x)); }
  NMT_WORDS8 static Vec iota() { return _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7); }
  NMT_WORDS8 static Vec add(Vec a, Vec b) { return _mm512_add_epi64(a, b); }
  NMT_WORDS8 static Vec mix(Vec z, unsigned shift) {  // z ^ (z >> shift)
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, shift));
  }
  NMT_WORDS8 static Vec mullo(Vec a, Vec b) { return _mm512_mullo_epi64(a, b); }
  NMT_WORDS8 static Vec quarters(uint32_t x) {
    return _mm512_set1_epi16(static_cast<int16_t>(x));
  }
  // The words' 32 quarters, each kept when >= limit's: their values into o[0 .. 31].
  NMT_WORDS8 static void store(float* o, Vec z, Vec limit, float kept, float dropped) {
    const __mmask32 keep = _mm512_cmpge_epu16_mask(z, limit);
    const __m512 k = _mm512_set1_ps(kept), d = _mm512_set1_ps(dropped);
    _mm512_storeu_ps(o, _mm512_mask_blend_ps(static_cast<__mmask16>(keep), d, k));
    _mm512_storeu_ps(o + 16, _mm512_mask_blend_ps(static_cast<__mmask16>(keep >> 16), d, k));
  }
  NMT_WORDS8 static void store(uint16_t* o, Vec z, Vec limit, uint16_t kept, uint16_t dropped) {
    const __mmask32 keep = _mm512_cmpge_epu16_mask(z, limit);
    _mm512_storeu_si512(o, _mm512_mask_blend_epi16(keep, quarters(dropped), quarters(kept)));
  }
};

struct Words4 {
  using Vec = __m256i;
  static constexpr int64_t kCount = 4;

  NMT_WORDS4 static Vec set1(uint64_t x) { return _mm256_set1_epi64x(static_cast<int64_t>(x)); }
  NMT_WORDS4 static Vec iota() { return _mm256_setr_epi64x(0, 1, 2, 3); }
  NMT_WORDS4 static Vec add(Vec a, Vec b) { return _mm256_add_epi64(a, b); }
  NMT_WORDS4 static Vec mix(Vec z, unsigned shift) {
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, static_cast<int>(shift)));
  }
  // a * b mod 2^64: AVX2 has no 64-bit low multiply, so from 32 x 32 -> 64-bit ones.
  NMT_WORDS4 static Vec mullo(Vec a, Vec b) {
    const __m256i low = _mm256_mul_epu32(a, b);
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                           _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
    return _mm256_add_epi64(low, _mm256_slli_epi64(cross, 32));
  }
  NMT_WORDS4 static Vec quarters(uint32_t x) {
    return _mm256_set1_epi16(static_cast<int16_t>(x));
  }
  // quarter >= limit, unsigned: max(quarter, limit) == quarter.
  NMT_WORDS4 static Vec kept_quarters(Vec z, Vec limit) {
    return _mm256_cmpeq_epi16(_mm256_max_epu16(z, limit), z);
  }
  NMT_WORDS4 static void store(float* o, Vec z, Vec limit, float kept, float dropped) {
    const Vec keep = kept_quarters(z, limit);
    const __m256 k = _mm256_set1_ps(kept), d = _mm256_set1_ps(dropped);
    const __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(keep));
    const __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(keep, 1));
    _mm256_storeu_ps(o, _mm256_blendv_ps(d, k, _mm256_castsi256_ps(lo)));
    _mm256_storeu_ps(o + 8, _mm256_blendv_ps(d, k, _mm256_castsi256_ps(hi)));
  }
  NMT_WORDS4 static void store(uint16_t* o, Vec z, Vec limit, uint16_t kept, uint16_t dropped) {
    const Vec v = _mm256_blendv_epi8(quarters(dropped), quarters(kept), kept_quarters(z, limit));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), v);
  }
};

#undef NMT_WORDS8
#undef NMT_WORDS4

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx2")
namespace mask_avx512 {
using W = Words8;
#include "dropout_mask_words.h"
}  // namespace mask_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
namespace mask_avx2 {
using W = Words4;
#include "dropout_mask_words.h"
}  // namespace mask_avx2
#pragma GCC pop_options

// Values as they are stored: 32-bit floats, or 16-bit patterns (bf16, half); doubles
// take the plain loop.
template <typename scalar_t>
constexpr bool kVector = std::is_same_v<scalar_t, float> || sizeof(scalar_t) == 2;
#endif

template <typename scalar_t>
void fill_mask(scalar_t* out, int64_t n, uint64_t seed, uint32_t threshold, float scale) {
  const scalar_t kept = static_cast<scalar_t>(scale);
  const scalar_t dropped = static_cast<scalar_t>(0.0f);
  const int64_t words = (n + 3) / 4;
  // A 16-bit comparison cannot say "never kept" (threshold 65536, p within 2^-17 of 1).
  const bool vector = threshold <= 0xFFFFu;
  at::parallel_for(0, words, 4096, [&](int64_t begin, int64_t end) {
    int64_t w = begin;
#if defined(__x86_64__)
    if constexpr (kVector<scalar_t>) {
      if (vector && dropout_mask_vectorized()) {
        const auto fill = simd::by_level(&mask_avx512::fill_vector<scalar_t>,
                                         &mask_avx2::fill_vector<scalar_t>);
        w = fill(out, n, begin, end, seed, threshold, kept, dropped);
      }
    }
#endif
    fill_words(out, n, w, end, seed, threshold, kept, dropped);
  });
}

}  // namespace

bool dropout_mask_vectorized() {
#if defined(__x86_64__)
  return cpu_level_at_least(CpuLevel::kAvx2);
#else
  return false;
#endif
}

at::Tensor scaled_keep_mask(const at::Tensor& like, double p, int64_t seed) {
  TORCH_CHECK(like.device().is_cpu(), "scaled_keep_mask: a CPU tensor is needed");
  TORCH_CHECK(p >= 0.0 && p < 1.0, "scaled_keep_mask: p must be in [0, 1), got ", p);
  at::Tensor out = at::empty(like.sizes(), like.options());  // contiguous
  const uint32_t threshold = static_cast<uint32_t>(std::lround(p * 65536.0));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const auto dtype = out.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "scaled_keep_mask", [&] {
    fill_mask<scalar_t>(out.data_ptr<scalar_t>(), out.numel(), static_cast<uint64_t>(seed),
                        threshold, scale);
  });
  return out;
}

}  // namespace nmt
