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
#endif

namespace nmt {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
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
// The same words eight (AVX-512) or four (AVX2) at a time: SplitMix64 on 64-bit lanes,
// each word's four 16-bit quarters compared with the threshold in place (a word's
// quarters are its elements in order, little-endian), the mask's values selected by
// the comparison. Integer arithmetic throughout, so the mask is the plain loop's bit for
// bit. Returns the first word not done (the rest go to fill_words).

// Values as they are stored: 32-bit floats, or 16-bit patterns (bf16, half); doubles
// take the plain loop.
template <typename scalar_t>
constexpr bool kWide = std::is_same_v<scalar_t, float>;
template <typename scalar_t>
constexpr bool kVector = kWide<scalar_t> || sizeof(scalar_t) == 2;

template <typename scalar_t>
__attribute__((target("avx512f,avx512dq,avx512bw"))) int64_t fill_avx512(
    scalar_t* out, int64_t n, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold,
    scalar_t kept, scalar_t dropped) {
  const __m512i golden = _mm512_set1_epi64(static_cast<int64_t>(kGolden));
  const __m512i c1 = _mm512_set1_epi64(static_cast<int64_t>(0xBF58476D1CE4E5B9ULL));
  const __m512i c2 = _mm512_set1_epi64(static_cast<int64_t>(0x94D049BB133111EBULL));
  const __m512i step = _mm512_set1_epi64(static_cast<int64_t>(8 * kGolden));
  const __m512i limit = _mm512_set1_epi16(static_cast<int16_t>(threshold));
  // The counters of words begin .. begin + 7: seed + (w + 1) * golden.
  __m512i counter = _mm512_add_epi64(
      _mm512_set1_epi64(static_cast<int64_t>(seed)),
      _mm512_mullo_epi64(_mm512_add_epi64(_mm512_set1_epi64(begin + 1),
                                          _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7)),
                         golden));
  int64_t w = begin;
  for (; w + 8 <= end && 4 * (w + 8) <= n; w += 8) {
    __m512i z = counter;
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), c1);
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), c2);
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
    const __mmask32 keep = _mm512_cmpge_epu16_mask(z, limit);
    if constexpr (kWide<scalar_t>) {
      const __m512 k = _mm512_set1_ps(static_cast<float>(kept));
      const __m512 d = _mm512_set1_ps(static_cast<float>(dropped));
      float* o = reinterpret_cast<float*>(out) + 4 * w;
      _mm512_storeu_ps(o, _mm512_mask_blend_ps(static_cast<__mmask16>(keep), d, k));
      _mm512_storeu_ps(o + 16, _mm512_mask_blend_ps(static_cast<__mmask16>(keep >> 16), d, k));
    } else {
      uint16_t kb, db;
      std::memcpy(&kb, &kept, 2);
      std::memcpy(&db, &dropped, 2);
      const __m512i v = _mm512_mask_blend_epi16(keep, _mm512_set1_epi16(static_cast<int16_t>(db)),
                                                _mm512_set1_epi16(static_cast<int16_t>(kb)));
      _mm512_storeu_si512(reinterpret_cast<uint16_t*>(out) + 4 * w, v);
    }
    counter = _mm512_add_epi64(counter, step);
  }
  return w;
}

// a * b mod 2^64 on four 64-bit lanes (AVX2 has no 64-bit low multiply).
__attribute__((target("avx2"))) inline __m256i mullo64(__m256i a, __m256i b) {
  const __m256i low = _mm256_mul_epu32(a, b);
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                         _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
  return _mm256_add_epi64(low, _mm256_slli_epi64(cross, 32));
}

template <typename scalar_t>
__attribute__((target("avx2"))) int64_t fill_avx2(scalar_t* out, int64_t n, int64_t begin,
                                                   int64_t end, uint64_t seed, uint32_t threshold,
                                                   scalar_t kept, scalar_t dropped) {
  const __m256i golden = _mm256_set1_epi64x(static_cast<int64_t>(kGolden));
  const __m256i c1 = _mm256_set1_epi64x(static_cast<int64_t>(0xBF58476D1CE4E5B9ULL));
  const __m256i c2 = _mm256_set1_epi64x(static_cast<int64_t>(0x94D049BB133111EBULL));
  const __m256i step = _mm256_set1_epi64x(static_cast<int64_t>(4 * kGolden));
  const __m256i limit = _mm256_set1_epi16(static_cast<int16_t>(threshold));
  __m256i counter = _mm256_add_epi64(
      _mm256_set1_epi64x(static_cast<int64_t>(seed)),
      mullo64(_mm256_add_epi64(_mm256_set1_epi64x(begin + 1), _mm256_setr_epi64x(0, 1, 2, 3)),
              golden));
  int64_t w = begin;
  for (; w + 4 <= end && 4 * (w + 4) <= n; w += 4) {
    __m256i z = counter;
    z = mullo64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), c1);
    z = mullo64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), c2);
    z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
    // quarter >= threshold, unsigned: max(quarter, threshold) == quarter
    const __m256i keep = _mm256_cmpeq_epi16(_mm256_max_epu16(z, limit), z);
    if constexpr (kWide<scalar_t>) {
      const __m256 k = _mm256_set1_ps(static_cast<float>(kept));
      const __m256 d = _mm256_set1_ps(static_cast<float>(dropped));
      float* o = reinterpret_cast<float*>(out) + 4 * w;
      const __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(keep));
      const __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(keep, 1));
      _mm256_storeu_ps(o, _mm256_blendv_ps(d, k, _mm256_castsi256_ps(lo)));
      _mm256_storeu_ps(o + 8, _mm256_blendv_ps(d, k, _mm256_castsi256_ps(hi)));
    } else {
      uint16_t kb, db;
      std::memcpy(&kb, &kept, 2);
      std::memcpy(&db, &dropped, 2);
      const __m256i v = _mm256_blendv_epi8(_mm256_set1_epi16(static_cast<int16_t>(db)),
                                           _mm256_set1_epi16(static_cast<int16_t>(kb)), keep);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(reinterpret_cast<uint16_t*>(out) + 4 * w), v);
    }
    counter = _mm256_add_epi64(counter, step);
  }
  return w;
}
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
      if (vector && cpu_level_at_least(CpuLevel::kAvx512)) {
        w = fill_avx512(out, n, begin, end, seed, threshold, kept, dropped);
      } else if (vector && dropout_mask_vectorized()) {
        w = fill_avx2(out, n, begin, end, seed, threshold, kept, dropped);
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
