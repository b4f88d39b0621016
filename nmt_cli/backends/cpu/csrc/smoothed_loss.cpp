// Label-smoothed cross-entropy over the logits on a CPU, one row at a time in three
// passes (core/losses.py has the reference, and the algebra).
//
// The reference sweeps 64 rows at a time through a dozen PyTorch operations (a float32
// copy, mean, max, subtraction, exp, sum, log, division, the target's correction, the
// padding mask, the cast back), each a pass over the chunk: on the Multi30k recipe's
// model (8,000 words) they cost more than their arithmetic (BENCHMARKS.md has their share
// of a bf16 update). Here each row is read twice (its maximum and sum, then exp(x - max)
// and its sum, kept in a float32 row buffer) and its gradient written once, in the
// logits' dtype, rounded to nearest even as PyTorch casts. The exponential is the
// polynomial the decoding kernels use (about 2 ulp), so results differ from the
// reference's in the last bits.

#include "smoothed_loss.h"
#include "cpu_level.h"
#include "scalar_bf16.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include "simd_width.h"
#endif

namespace nmt {
namespace {

struct RowSums {
  float lse;
  float mean;
  float sum;  // of exp(x - max)
};

using scalar::narrow;
using scalar::widen;

// Any CPU: plain loops.
template <typename T>
RowSums row_scalar(const T* x, int64_t n, float* e, T* grad, float scale, float offset) {
  float max = -INFINITY, total = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = widen(x[i]);
    max = std::max(max, v);
    total += v;
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    e[i] = std::exp(widen(x[i]) - max);
    sum += e[i];
  }
  if (grad != nullptr) {
    const float inv = scale / sum;
    for (int64_t i = 0; i < n; ++i) narrow(e[i] * inv - offset, grad + i);
  }
  return {max + std::log(sum), total / static_cast<float>(n), sum};
}

#if defined(__x86_64__)
// Vector loops, written once over the lanes of simd_width.h (smoothed_loss_row.h),
// compiled for AVX-512 and for AVX2 + FMA.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
namespace loss_avx512 {
using V = simd::Lanes16;
#include "smoothed_loss_row.h"
}  // namespace loss_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace loss_avx2 {
using V = simd::Lanes8;
#include "smoothed_loss_row.h"
}  // namespace loss_avx2
#pragma GCC pop_options
#endif

}  // namespace

// Elsewhere than x86-64 the detected level is generic: never.
bool smoothed_loss_vectorized() { return cpu_level_at_least(CpuLevel::kAvx2); }

namespace {

template <typename T>
void sweep(const T* logits, const int64_t* target, const float* weight, int64_t rows,
           int64_t n, float eps, T* grad, float* lse, float* mean, float* ref) {
  // The row's loops for this CPU.
  auto row = &row_scalar<T>;
#if defined(__x86_64__)
  if (smoothed_loss_vectorized()) {
    row = simd::by_level(&loss_avx512::row_lanes<T>, &loss_avx2::row_lanes<T>);
  }
#endif
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, n));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> e(static_cast<size_t>(n));
    for (int64_t r = begin; r < end; ++r) {
      const T* x = logits + r * n;
      T* g = grad == nullptr ? nullptr : grad + r * n;
      const int64_t t = target[r];
      const float w = weight[r];
      // The gradient is w * (softmax - eps / V) everywhere, less w * (1 - eps) at the
      // target: the passes write the first, the target's element is corrected after.
      const float offset = w * eps / static_cast<float>(n);
      ref[r] = widen(x[t]);  // first: the gradient may be written over the logits
      const RowSums sums = row(x, n, e.data(), g, w, offset);
      lse[r] = sums.lse;
      mean[r] = sums.mean;
      if (g != nullptr) {
        narrow(w * (e[t] / sums.sum - eps / static_cast<float>(n) - (1.0f - eps)), g + t);
      }
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> smoothed_loss_sweep(
    const at::Tensor& logits, const at::Tensor& target, const at::Tensor& weight, double eps,
    bool want_grad, bool in_place) {
  RECORD_FUNCTION("nmt::smoothed_loss_sweep", std::vector<c10::IValue>());
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.is_contiguous(),
              "smoothed_loss_sweep: contiguous (N, V) CPU logits are needed");
  const auto dtype = logits.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "smoothed_loss_sweep: float32 or bfloat16 logits are needed, got ", dtype);
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(target.scalar_type() == at::kLong && target.numel() == rows &&
                  target.is_contiguous(),
              "smoothed_loss_sweep: (N) int64 targets are needed");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.numel() == rows &&
                  weight.is_contiguous(),
              "smoothed_loss_sweep: (N) float32 weights are needed");
  TORCH_CHECK(n > 0, "smoothed_loss_sweep: an empty vocabulary");
  const int64_t* t = target.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(t[r] >= 0 && t[r] < n, "smoothed_loss_sweep: target ", t[r],
                " is outside the vocabulary of ", n);
  }
  const auto f32 = logits.options().dtype(at::kFloat);
  at::Tensor lse = at::empty({rows}, f32), mean = at::empty({rows}, f32),
             ref = at::empty({rows}, f32);
  // In place, each row's gradient is written after its last read of the row.
  at::Tensor grad = !want_grad ? at::Tensor()
                    : in_place ? logits
                               : at::empty({rows, n}, logits.options());
  const float* w = weight.const_data_ptr<float>();
  const auto e = static_cast<float>(eps);
  if (dtype == at::kFloat) {  // (in place, the logits' pointer is also the gradient's)
    sweep(logits.const_data_ptr<float>(), t, w, rows, n, e,
          want_grad ? grad.data_ptr<float>() : nullptr, lse.data_ptr<float>(),
          mean.data_ptr<float>(), ref.data_ptr<float>());
  } else {
    sweep(reinterpret_cast<const uint16_t*>(logits.const_data_ptr()), t, w, rows, n, e,
          want_grad ? reinterpret_cast<uint16_t*>(grad.data_ptr()) : nullptr,
          lse.data_ptr<float>(), mean.data_ptr<float>(), ref.data_ptr<float>());
  }
  return {lse, mean, ref, grad};
}

}  // namespace nmt
