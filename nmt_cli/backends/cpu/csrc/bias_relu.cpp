// Training's feed-forward on a CPU: max(0, x W1 + b1) as PyTorch's product without its
// bias, then the bias and the ReLU in one pass over its output; backward, the ReLU's
// mask and the bias's gradient in one pass over the output's gradient (core/transformer.py
// has the reference, `F.relu(F.linear(x, W1, b1))`).
//
// The reference's linear layer copies the bias into every row of the output before the
// product adds to it, ReLU then reads the output and writes a new one, and backward reads
// the gradient twice more (ReLU's mask, then the bias's column sums): on the Multi30k
// recipe's model, whose feed-forward output (tokens x 1,024) is larger than the cache,
// each of those is a pass over memory (BENCHMARKS.md has their share of an update). Here
// the output is read and written once forward, and the gradient read once backward.
// float32 results are the reference's up to the order of the additions (the bias joins
// the product's sum last); in bf16 the product is rounded before the bias is added, one
// rounding more than the reference's.

#include "bias_relu.h"
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

// Rows a block of the backward pass sums: fixed, so the column sums do not depend on the
// threads.
constexpr int64_t kBlockRows = 256;

// Any CPU: plain loops, the vector loops' reference.
namespace relu_plain {

using scalar::narrow;
using scalar::widen;

template <typename T>
void bias_relu_rows(T* y, const float* b, int64_t begin, int64_t end, int64_t n) {
  for (int64_t r = begin; r < end; ++r) {
    T* row = y + r * n;
    for (int64_t i = 0; i < n; ++i) {
      const float v = widen(row[i]) + b[i];
      narrow(std::isnan(v) || v > 0.0f ? v : 0.0f, row + i);
    }
  }
}

template <typename T>
void relu_bias_backward_rows(const T* g, const T* y, T* out, float* sums, int64_t begin,
                             int64_t end, int64_t n) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t at = r * n;
    for (int64_t i = 0; i < n; ++i) {
      const float kept = widen(y[at + i]) > 0.0f ? widen(g[at + i]) : 0.0f;
      narrow(kept, out + at + i);
      sums[i] += kept;
    }
  }
}

}  // namespace relu_plain

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
namespace bias_relu_avx512 {
using V = simd::Lanes16;
#include "bias_relu_rows.h"
}  // namespace bias_relu_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace bias_relu_avx2 {
using V = simd::Lanes8;
#include "bias_relu_rows.h"
}  // namespace bias_relu_avx2
#pragma GCC pop_options
#endif

template <typename T>
void relu_forward(T* y, const float* b, int64_t rows, int64_t n) {
  auto pass = &relu_plain::bias_relu_rows<T>;
#if defined(__x86_64__)
  if (bias_relu_vectorized()) {
    pass = simd::by_level(&bias_relu_avx512::bias_relu_rows<T>,
                          &bias_relu_avx2::bias_relu_rows<T>);
  }
#endif
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n));
  at::parallel_for(0, rows, grain,
                   [&](int64_t begin, int64_t end) { pass(y, b, begin, end, n); });
}

template <typename T>
void relu_backward(const T* g, const T* y, T* out, float* partial, int64_t rows, int64_t n) {
  auto pass = &relu_plain::relu_bias_backward_rows<T>;
#if defined(__x86_64__)
  if (bias_relu_vectorized()) {
    pass = simd::by_level(&bias_relu_avx512::relu_bias_backward_rows<T>,
                          &bias_relu_avx2::relu_bias_backward_rows<T>);
  }
#endif
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      pass(g, y, out, partial + k * n, k * kBlockRows, std::min(rows, (k + 1) * kBlockRows),
           n);
    }
  });
}

void check_relu_operand(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.is_contiguous(), "bias_relu: ", name,
              " must be a contiguous (rows, n) CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
              "bias_relu: ", name, " must be float32 or bfloat16, got ", t.scalar_type());
}

}  // namespace

// Elsewhere than x86-64 the detected level is generic: never.
bool bias_relu_vectorized() { return cpu_level_at_least(CpuLevel::kAvx2); }

void bias_relu_(at::Tensor& y, const at::Tensor& bias) {
  RECORD_FUNCTION("nmt::bias_relu_", std::vector<c10::IValue>());
  check_relu_operand(y, "the product's output");
  const int64_t rows = y.size(0), n = y.size(1);
  TORCH_CHECK(bias.device().is_cpu() && bias.scalar_type() == at::kFloat &&
                  bias.dim() == 1 && bias.size(0) == n && bias.is_contiguous(),
              "bias_relu: the bias must be a contiguous float32 CPU vector of ", n);
  const float* b = bias.const_data_ptr<float>();
  if (y.scalar_type() == at::kFloat) {
    relu_forward(y.data_ptr<float>(), b, rows, n);
  } else {
    relu_forward(reinterpret_cast<uint16_t*>(y.data_ptr()), b, rows, n);
  }
}

std::tuple<at::Tensor, at::Tensor> relu_bias_backward(const at::Tensor& grad,
                                                      const at::Tensor& y, bool in_place) {
  RECORD_FUNCTION("nmt::relu_bias_backward", std::vector<c10::IValue>());
  check_relu_operand(y, "the forward pass's output");
  const at::Tensor g = grad.contiguous();
  check_relu_operand(g, "the gradient");
  TORCH_CHECK(g.sizes() == y.sizes() && g.scalar_type() == y.scalar_type(),
              "bias_relu: the gradient is ", g.sizes(), " ", g.scalar_type(), ", the output ",
              y.sizes(), " ", y.scalar_type());
  const int64_t rows = y.size(0), n = y.size(1);
  // In place, each element is read before it is written, by the same task.
  at::Tensor out = in_place ? g : at::empty_like(g);
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  at::Tensor partial = at::zeros({std::max<int64_t>(blocks, 1), n}, g.options().dtype(at::kFloat));
  float* p = partial.data_ptr<float>();
  if (g.scalar_type() == at::kFloat) {
    relu_backward(g.const_data_ptr<float>(), y.const_data_ptr<float>(), out.data_ptr<float>(), p,
             rows, n);
  } else {
    relu_backward(reinterpret_cast<const uint16_t*>(g.const_data_ptr()),
             reinterpret_cast<const uint16_t*>(y.const_data_ptr()),
             reinterpret_cast<uint16_t*>(out.data_ptr()), p, rows, n);
  }
  return {out, blocks > 1 ? partial.sum(0) : partial[0]};
}

}  // namespace nmt
