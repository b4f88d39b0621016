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
// how many there are. The seed comes from PyTorch's default generator (training.py),
// so `torch.manual_seed` reproduces the masks.

#include "dropout_mask.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

namespace nmt {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

template <typename scalar_t>
void fill_mask(scalar_t* out, int64_t n, uint64_t seed, uint32_t threshold, float scale) {
  const scalar_t kept = static_cast<scalar_t>(scale);
  const scalar_t dropped = static_cast<scalar_t>(0.0f);
  const int64_t words = (n + 3) / 4;
  at::parallel_for(0, words, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const uint64_t bits = splitmix64(seed + static_cast<uint64_t>(w + 1) * kGolden);
      const int64_t first = 4 * w;
      if (first + 4 <= n) {
        for (int k = 0; k < 4; ++k) {
          const uint32_t quarter = static_cast<uint32_t>(bits >> (16 * k)) & 0xFFFFu;
          out[first + k] = quarter >= threshold ? kept : dropped;
        }
      } else {
        for (int64_t i = first; i < n; ++i) {
          const uint32_t quarter =
              static_cast<uint32_t>(bits >> (16 * (i - first))) & 0xFFFFu;
          out[i] = quarter >= threshold ? kept : dropped;
        }
      }
    }
  });
}

}  // namespace

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
