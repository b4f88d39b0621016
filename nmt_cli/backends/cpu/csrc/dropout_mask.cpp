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
//
// `dropout_add` is the residual add of the same dropout (core/dropout.py's
// `masked_dropout_add`, its reference) with the mask drawn a tile at a time into a buffer
// in cache as it adds, and `dropout_grad` its gradient, the mask drawn again from the seed:
// the mask is never stored.

#include "dropout_mask.h"
#include "cpu_level.h"
#include "scalar_bf16.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

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

// Elements 4w to 4w + 3 (those below n) from word w, into out[4w - origin ...]: the plain
// loop, every CPU's, and the vector loops' tail.
template <typename scalar_t>
inline void fill_words(scalar_t* out, int64_t origin, int64_t n, int64_t begin, int64_t end,
                       uint64_t seed, uint32_t threshold, scalar_t kept, scalar_t dropped) {
  for (int64_t w = begin; w < end; ++w) {
    const uint64_t bits = splitmix64(seed + static_cast<uint64_t>(w + 1) * kGolden);
    const int64_t first = 4 * w;
    const int64_t count = first + 4 <= n ? 4 : n - first;
    for (int64_t k = 0; k < count; ++k) {
      const uint32_t quarter = static_cast<uint32_t>(bits >> (16 * k)) & 0xFFFFu;
      out[first + k - origin] = quarter >= threshold ? kept : dropped;
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

// Words begin .. end - 1 into out[4w - origin ...], in vector loops where they serve.
template <typename scalar_t>
void fill_range(scalar_t* out, int64_t origin, int64_t n, int64_t begin, int64_t end,
                uint64_t seed, uint32_t threshold, scalar_t kept, scalar_t dropped) {
  int64_t w = begin;
#if defined(__x86_64__)
  // A 16-bit comparison cannot say "never kept" (threshold 65536, p within 2^-17 of 1).
  if constexpr (kVector<scalar_t>) {
    if (threshold <= 0xFFFFu && dropout_mask_vectorized()) {
      const auto fill = simd::by_level(&mask_avx512::fill_vector<scalar_t>,
                                       &mask_avx2::fill_vector<scalar_t>);
      w = fill(out, origin, n, begin, end, seed, threshold, kept, dropped);
    }
  }
#endif
  fill_words(out, origin, n, w, end, seed, threshold, kept, dropped);
}

template <typename scalar_t>
void fill_mask(scalar_t* out, int64_t n, uint64_t seed, uint32_t threshold, float scale) {
  const scalar_t kept = static_cast<scalar_t>(scale);
  const scalar_t dropped = static_cast<scalar_t>(0.0f);
  at::parallel_for(0, (n + 3) / 4, 4096, [&](int64_t begin, int64_t end) {
    fill_range(out, 0, n, begin, end, seed, threshold, kept, dropped);
  });
}

// The residual add and the gradient with the mask drawn a tile at a time into a float32
// buffer in cache, never stored whole: elements as stored (float, or bf16's bit pattern).
using Bf16Bits = uint16_t;

// Any CPU: plain loops. out = residual + x * m, with x * m first rounded to x's dtype
// where the sum is wider than x (a bf16 product added to a float32 residual, as
// PyTorch's promotion computes it).
template <typename R, typename X, typename O>
void add_scaled_plain(const R* r, const X* x, const float* m, O* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float product = scalar::widen(x[i]) * m[i];
    if constexpr (!std::is_same_v<X, O>) product = scalar::rounded_to<X>(product);
    const float sum = scalar::widen(r[i]) + product;
    scalar::narrow(sum, out + i);
  }
}

// out = g * m, rounded to out's dtype.
template <typename G, typename X>
void scale_plain(const G* g, const float* m, X* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float product = scalar::widen(g[i]) * m[i];
    scalar::narrow(product, out + i);
  }
}

// out = residual + (x + b) * m, where b, a linear layer's float32 bias, makes the sum
// float32 before the mask scales it (as PyTorch promotes `x + bias`); each step rounded.
template <typename R, typename X, typename O>
void add_biased_plain(const R* r, const X* x, const float* b, const float* m, O* out,
                      int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float product = (scalar::widen(x[i]) + b[i]) * m[i];
    scalar::narrow(scalar::widen(r[i]) + product, out + i);
  }
}

// out = g * m, rounded to out's dtype; the float32 products added to `sums`.
template <typename G, typename X>
void scale_summed_plain(const G* g, const float* m, X* out, float* sums, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float product = scalar::widen(g[i]) * m[i];
    scalar::narrow(product, out + i);
    sums[i] += product;
  }
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
namespace dropout_avx512 {
using V = simd::Lanes16;
#include "dropout_add_lanes.h"
}  // namespace dropout_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace dropout_avx2 {
using V = simd::Lanes8;
#include "dropout_add_lanes.h"
}  // namespace dropout_avx2
#pragma GCC pop_options
#endif

// The mask's rule for p, in one place for the stored mask and the tiles: an element is
// kept where its 16 random bits reach `threshold`, and then holds `scale`.
struct KeepRule {
  uint32_t threshold;
  float scale;
  explicit KeepRule(double p)
      : threshold(static_cast<uint32_t>(std::lround(p * 65536.0))),
        scale(static_cast<float>(1.0 / (1.0 - p))) {}
};

// Words a tile of the mask holds: 1,024 elements, 4 KB of float32.
constexpr int64_t kTileWords = 256;
// Words of a task: 16,384 elements. Tasks, not threads, own a bias gradient's partial
// sums, so the sums do not depend on how many threads there are.
constexpr int64_t kChunkWords = 4096;

int64_t chunks_of(int64_t n) { return ((n + 3) / 4 + kChunkWords - 1) / kChunkWords; }

// Every tile of n elements in turn, over the threads: `apply(chunk, first, count, tile)`
// with the mask of elements first .. first + count - 1 (of task `chunk`) in `tile`, as
// scaled_keep_mask would store it in dtype X (its kept value rounded to X), widened to
// float32.
template <typename X, typename Apply>
void each_tile(int64_t n, double p, uint64_t seed, const Apply& apply) {
  const KeepRule rule(p);
  const float kept = scalar::rounded_to<X>(rule.scale);
  const int64_t words = (n + 3) / 4;
  at::parallel_for(0, chunks_of(n), 1, [&](int64_t begin, int64_t end) {
    alignas(64) float tile[4 * kTileWords];
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t stop = std::min(words, (chunk + 1) * kChunkWords);
      for (int64_t w = chunk * kChunkWords; w < stop; w += kTileWords) {
        const int64_t last = std::min(stop, w + kTileWords);
        fill_range(tile, 4 * w, n, w, last, seed, rule.threshold, kept, 0.0f);
        apply(chunk, 4 * w, std::min(n, 4 * last) - 4 * w, tile);
      }
    }
  });
}

// `f(offset, count, column)` for each run of elements first + offset ... that lies within
// one row of `columns` elements, `column` its first's column.
template <typename F>
void each_row_run(int64_t first, int64_t n, int64_t columns, const F& f) {
  for (int64_t i = 0; i < n;) {
    const int64_t column = (first + i) % columns;
    const int64_t count = std::min(n - i, columns - column);
    f(i, count, column);
    i += count;
  }
}

template <typename R, typename X, typename O>
void dropout_add_typed(const R* r, const X* x, O* out, int64_t n, double p, uint64_t seed) {
  auto add = &add_scaled_plain<R, X, O>;
#if defined(__x86_64__)
  if (dropout_mask_vectorized()) {
    add = simd::by_level(&dropout_avx512::add_scaled<R, X, O>,
                         &dropout_avx2::add_scaled<R, X, O>);
  }
#endif
  each_tile<X>(n, p, seed, [&](int64_t, int64_t first, int64_t count, const float* tile) {
    add(r + first, x + first, tile, out + first, count);
  });
}

// With a bias of `columns` (x's rows' width): x + b is float32, so the mask is too.
template <typename R, typename X, typename O>
void dropout_add_biased_typed(const R* r, const X* x, const float* b, int64_t columns, O* out,
                              int64_t n, double p, uint64_t seed) {
  auto add = &add_biased_plain<R, X, O>;
#if defined(__x86_64__)
  if (dropout_mask_vectorized()) {
    add = simd::by_level(&dropout_avx512::add_biased<R, X, O>,
                         &dropout_avx2::add_biased<R, X, O>);
  }
#endif
  each_tile<float>(n, p, seed, [&](int64_t, int64_t first, int64_t count, const float* tile) {
    each_row_run(first, count, columns, [&](int64_t i, int64_t run, int64_t column) {
      add(r + first + i, x + first + i, b + column, tile + i, out + first + i, run);
    });
  });
}

template <typename G, typename X>
void dropout_grad_typed(const G* g, X* out, int64_t n, double p, uint64_t seed) {
  auto scale = &scale_plain<G, X>;
#if defined(__x86_64__)
  if (dropout_mask_vectorized()) {
    scale = simd::by_level(&dropout_avx512::scale<G, X>, &dropout_avx2::scale<G, X>);
  }
#endif
  each_tile<X>(n, p, seed, [&](int64_t, int64_t first, int64_t count, const float* tile) {
    scale(g + first, tile, out + first, count);
  });
}

// The biased add's gradient: the float32 mask's, and each task's column sums of the
// float32 products in `partial` (chunks x columns, zeros), for the bias.
template <typename G, typename X>
void dropout_grad_summed_typed(const G* g, X* out, float* partial, int64_t columns, int64_t n,
                               double p, uint64_t seed) {
  auto scale = &scale_summed_plain<G, X>;
#if defined(__x86_64__)
  if (dropout_mask_vectorized()) {
    scale = simd::by_level(&dropout_avx512::scale_summed<G, X>,
                           &dropout_avx2::scale_summed<G, X>);
  }
#endif
  each_tile<float>(n, p, seed, [&](int64_t chunk, int64_t first, int64_t count, const float* tile) {
    float* sums = partial + chunk * columns;
    each_row_run(first, count, columns, [&](int64_t i, int64_t run, int64_t column) {
      scale(g + first + i, tile + i, out + first + i, sums + column, run);
    });
  });
}

// float32 or bf16 (its bit pattern): f(pointer) with the tensor's data as the type it holds.
template <typename F>
void as_stored(const at::Tensor& t, const F& f) {
  if (t.scalar_type() == at::kFloat) {
    f(t.const_data_ptr<float>());
  } else {
    f(reinterpret_cast<const Bf16Bits*>(t.const_data_ptr()));
  }
}
template <typename F>
void as_stored(at::Tensor& t, const F& f) {
  if (t.scalar_type() == at::kFloat) {
    f(t.data_ptr<float>());
  } else {
    f(reinterpret_cast<Bf16Bits*>(t.data_ptr()));
  }
}

void check_dropout_operand(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "dropout_add: ", name,
              " must be a contiguous CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
              "dropout_add: ", name, " must be float32 or bfloat16, got ", t.scalar_type());
}

void check_p(double p) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got ", p);
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
  check_p(p);
  at::Tensor out = at::empty(like.sizes(), like.options());  // contiguous
  const KeepRule rule(p);
  const auto dtype = out.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "scaled_keep_mask", [&] {
    fill_mask<scalar_t>(out.data_ptr<scalar_t>(), out.numel(), static_cast<uint64_t>(seed),
                        rule.threshold, rule.scale);
  });
  return out;
}

at::Tensor dropout_add(const at::Tensor& residual, const at::Tensor& x, double p,
                       int64_t seed, const std::optional<at::Tensor>& bias) {
  RECORD_FUNCTION("nmt::dropout_add", std::vector<c10::IValue>());
  check_dropout_operand(residual, "the residual");
  check_dropout_operand(x, "the sublayer's output");
  check_p(p);
  TORCH_CHECK(residual.sizes() == x.sizes(), "dropout_add: the residual is ", residual.sizes(),
              ", the sublayer's output ", x.sizes());
  const auto u = static_cast<uint64_t>(seed);
  if (!bias.has_value()) {
    at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::promote_types(
                                              residual.scalar_type(), x.scalar_type())));
    as_stored(residual, [&](auto* r) {
      as_stored(x, [&](auto* v) {
        as_stored(out, [&](auto* o) { dropout_add_typed(r, v, o, x.numel(), p, u); });
      });
    });
    return out;
  }
  const int64_t columns = x.dim() == 0 ? 1 : x.size(-1);
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                  bias->dim() == 1 && bias->size(0) == columns && columns > 0,
              "dropout_add: the bias must be float32 of the rows' width ", columns, ", got ",
              bias->scalar_type(), " ", bias->sizes());
  const float* b = bias->const_data_ptr<float>();
  at::Tensor out = at::empty(
      x.sizes(), x.options().dtype(at::promote_types(residual.scalar_type(), at::kFloat)));
  as_stored(residual, [&](auto* r) {
    as_stored(x, [&](auto* v) {
      dropout_add_biased_typed(r, v, b, columns, out.data_ptr<float>(), x.numel(), p, u);
    });
  });
  return out;
}

namespace {

// The gradient, contiguous, after the checks both gradients make.
at::Tensor checked_gradient(const at::Tensor& grad, double p, at::ScalarType dtype) {
  at::Tensor g = grad.contiguous();
  check_dropout_operand(g, "the gradient");
  check_p(p);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "dropout_grad: float32 or bfloat16 is needed, got ", dtype);
  return g;
}

}  // namespace

at::Tensor dropout_grad(const at::Tensor& grad, double p, int64_t seed, at::ScalarType dtype) {
  RECORD_FUNCTION("nmt::dropout_grad", std::vector<c10::IValue>());
  const at::Tensor g = checked_gradient(grad, p, dtype);
  at::Tensor out = at::empty(g.sizes(), g.options().dtype(dtype));
  as_stored(g, [&](auto* in) {
    as_stored(out, [&](auto* o) {
      dropout_grad_typed(in, o, g.numel(), p, static_cast<uint64_t>(seed));
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> dropout_grad_summed(const at::Tensor& grad, double p,
                                                       int64_t seed, at::ScalarType dtype,
                                                       int64_t columns) {
  RECORD_FUNCTION("nmt::dropout_grad", std::vector<c10::IValue>());
  const at::Tensor g = checked_gradient(grad, p, dtype);
  TORCH_CHECK(columns > 0 && g.numel() % columns == 0, "dropout_grad: ", g.numel(),
              " elements are not rows of ", columns);
  at::Tensor out = at::empty(g.sizes(), g.options().dtype(dtype));
  const int64_t chunks = chunks_of(g.numel());
  std::vector<float> partial(static_cast<size_t>(chunks * columns), 0.0f);
  as_stored(g, [&](auto* in) {
    as_stored(out, [&](auto* o) {
      dropout_grad_summed_typed(in, o, partial.data(), columns, g.numel(), p,
                                static_cast<uint64_t>(seed));
    });
  });
  // The tasks' sums in their order: the same whatever the threads.
  at::Tensor sums = at::zeros({columns}, g.options().dtype(at::kFloat));
  float* total = sums.data_ptr<float>();
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const float* part = partial.data() + chunk * columns;
    for (int64_t j = 0; j < columns; ++j) total[j] += part[j];
  }
  return {out, sums};
}

}  // namespace nmt
