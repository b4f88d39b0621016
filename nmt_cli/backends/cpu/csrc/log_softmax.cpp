// Log-softmax over the vocabulary in three passes of AVX-512 (or AVX2), for the models
// whose products run on the module's kernels.
//
// `torch.log_softmax(logits, -1, dtype=float32)` casts bf16 logits to float32, then makes
// its own passes: with the products on the module's kernels, it is the largest single
// operator of a one-sentence step (BENCHMARKS.md). Here each row is read twice (its
// maximum, then the sum of exp(x - max), with a polynomial exp accurate to about 2 ulp)
// and written once as x - (max + log(sum)), bf16 widened on the fly. The results differ
// from PyTorch's in the last bits, so fp32 models on PyTorch's products keep PyTorch's
// (their outputs are promised identical); bf16, int8, and fp32 on AVX2 CPUs use this one
// in the Python step and the compiled step alike, whenever the module is loaded.
#include "log_softmax.h"
#include "cpu_level.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__)
#include "simd_exp.h"
#include "simd_lanes.h"

namespace nmt {
namespace {

using simd::exp_nonpositive;

#define NMT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

template <typename T>
NMT_AVX512 inline __m512 load(const T* p, __mmask16 mask);

template <>
NMT_AVX512 inline __m512 load<float>(const float* p, __mmask16 mask) {
  return _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mask, p);
}

template <>
NMT_AVX512 inline __m512 load<uint16_t>(const uint16_t* p, __mmask16 mask) {
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  return _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), mask, x);
}

// A row's max + log(sum of exp(x - max)): the first two passes, which read it.
template <typename T>
NMT_AVX512 float lse(const T* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = simd::first_lanes(n - i);
    vmax = _mm512_max_ps(vmax, load(x + i, mask));
  }
  const float max = _mm512_reduce_max_ps(vmax);
  const __m512 shift = _mm512_set1_ps(max);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = simd::first_lanes(n - i);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(load(x + i, mask), shift));
    vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(mask, e));
  }
  return max + std::log(_mm512_reduce_add_ps(vsum));
}

template <typename T>
NMT_AVX512 void row(const T* x, int64_t n, float* out) {
  constexpr int64_t kLanes = 16;
  const __m512 vlse = _mm512_set1_ps(lse(x, n));
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = simd::first_lanes(n - i);
    _mm512_mask_storeu_ps(out + i, mask, _mm512_sub_ps(load(x + i, mask), vlse));
  }
}

// The same two passes and the write for float32 logits on AVX2 CPUs, eight lanes at a
// time (the tail in scalar arithmetic): where fp32 decodes on the module's products.
__attribute__((target("avx2,fma"))) float lse_avx2(const float* x, int64_t n) {
  constexpr int64_t kLanes = 8;
  const int64_t whole = n / kLanes * kLanes;
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int64_t i = 0; i < whole; i += kLanes) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  float max = simd::horizontal_max(vmax);
  for (int64_t i = whole; i < n; ++i) max = std::max(max, x[i]);
  const __m256 shift = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole; i += kLanes) {
    vsum = _mm256_add_ps(vsum, simd::exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift)));
  }
  float sum = simd::horizontal_sum(vsum);
  for (int64_t i = whole; i < n; ++i) sum += std::exp(x[i] - max);
  return max + std::log(sum);
}

__attribute__((target("avx2,fma"))) void row_avx2(const float* x, int64_t n, float* out) {
  constexpr int64_t kLanes = 8;
  const int64_t whole = n / kLanes * kLanes;
  const float lse = lse_avx2(x, n);
  const __m256 vlse = _mm256_set1_ps(lse);
  for (int64_t i = 0; i < whole; i += kLanes) {
    _mm256_storeu_ps(out + i, _mm256_sub_ps(_mm256_loadu_ps(x + i), vlse));
  }
  for (int64_t i = whole; i < n; ++i) out[i] = x[i] - lse;
}

}  // namespace

bool log_softmax_vectorized() { return cpu_level_at_least(CpuLevel::kAvx2); }

bool log_softmax_takes(at::ScalarType dtype) {
  if (cpu_level_at_least(CpuLevel::kAvx512)) return dtype == at::kFloat || dtype == at::kBFloat16;
  return log_softmax_vectorized() && dtype == at::kFloat;
}

float row_log_sum_exp(const float* x, int64_t n) {
  return cpu_level_at_least(CpuLevel::kAvx512) ? lse(x, n) : lse_avx2(x, n);
}

float row_log_sum_exp(const uint16_t* x, int64_t n) { return lse(x, n); }

at::Tensor fast_log_softmax(const at::Tensor& logits_in) {
  RECORD_FUNCTION("nmt::fast_log_softmax", std::vector<c10::IValue>());
  const bool avx512 = cpu_level_at_least(CpuLevel::kAvx512);
  const auto dtype = logits_in.scalar_type();
  if (!log_softmax_takes(dtype) || logits_in.dim() != 2) {
    return at::log_softmax(logits_in, -1, at::kFloat);
  }
  const at::Tensor logits = logits_in.contiguous();
  const int64_t rows = logits.size(0), n = logits.size(1);
  at::Tensor out = at::empty({rows, n}, logits.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, n));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (!avx512) {
        row_avx2(logits.const_data_ptr<float>() + r * n, n, o + r * n);
      } else if (dtype == at::kFloat) {
        row(logits.const_data_ptr<float>() + r * n, n, o + r * n);
      } else {
        row(reinterpret_cast<const uint16_t*>(logits.const_data_ptr()) + r * n, n, o + r * n);
      }
    }
  });
  return out;
}

}  // namespace nmt

#else  // elsewhere PyTorch's

namespace nmt {

bool log_softmax_vectorized() { return false; }

bool log_softmax_takes(at::ScalarType) { return false; }

float row_log_sum_exp(const float*, int64_t) { TORCH_CHECK(false, "no vector log-softmax here"); }

float row_log_sum_exp(const uint16_t*, int64_t) {
  TORCH_CHECK(false, "no vector log-softmax here");
}

at::Tensor fast_log_softmax(const at::Tensor& logits) {
  return at::log_softmax(logits, -1, at::kFloat);
}

}  // namespace nmt

#endif
