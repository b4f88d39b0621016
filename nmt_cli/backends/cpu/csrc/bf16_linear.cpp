// bf16 matrix products for the few rows of a decoder step, with AVX-512 BF16.
//
// oneDNN (PyTorch's `mkldnn::_linear_pointwise`) spends a fixed time a call on its own
// bookkeeping whatever the size, which at a few rows is most of a product of the layer
// sizes nmt decodes with (BENCHMARKS.md). This kernel has none: the weight is laid out
// once so that each 64-byte load holds 16 output columns x one pair of inputs, which is
// what `vdpbf16ps` multiplies by a broadcast pair of the input row; a register tile of up
// to 4 rows x 64 columns accumulates in fp32 over the whole K, then adds the bias,
// applies the ReLU and adds the residual before the one rounding to bf16. Accumulating
// pairs in order of K is what oneDNN does too, so the results agree with it bit for bit
// except where oneDNN splits a long K (rarely, in the last bit).
#include "bf16_linear.h"
#include "cpu_level.h"

#include <ATen/record_function.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>

#include "tiles.h"

namespace nmt {
namespace {

using tiles::kLanes;
using tiles::kMaxCols;
using tiles::kMaxRows;

#define NMT_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

NMT_AVX512_BF16 inline __m512 widen(const uint16_t* p, __mmask16 mask) {
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}

struct Operands {
  const uint16_t* x;         // (M, K) rows
  const uint16_t* w;         // packed
  const uint16_t* bias;      // (N) or null
  const uint16_t* residual;  // (M, N) or null
  uint16_t* y;               // (M, N)
  int64_t k, n, pairs;
  bool relu;
};

// Rows [row, row + R) x column blocks [block, block + C) of the output.
template <int R, int C>
NMT_AVX512_BF16 void tile(const Operands& op, int64_t row, int64_t block) {
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const uint16_t* w = op.w + block * op.pairs * kLanes * 2;
  const uint16_t* x = op.x + row * op.k;
  for (int64_t p = 0; p < op.pairs; ++p) {
    __m512bh wv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      wv[c] = (__m512bh)_mm512_loadu_si512(w + (c * op.pairs + p) * kLanes * 2);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * op.k + 2 * p, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    const int64_t col = (block + c) * kLanes;
    const int64_t valid = std::min<int64_t>(kLanes, op.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512 bias = op.bias ? widen(op.bias + col, mask) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_add_ps(acc[r][c], bias);
      if (op.relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
      const int64_t at = (row + r) * op.n + col;
      if (op.residual) v = _mm512_add_ps(v, widen(op.residual + at, mask));
      _mm256_mask_storeu_epi16(op.y + at, mask, (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

using TileFn = tiles::TileFn<Operands>;

template <int R>
constexpr TileFn kRowTiles[kMaxCols] = {tile<R, 1>, tile<R, 2>, tile<R, 3>, tile<R, 4>};
constexpr const TileFn* kTiles[kMaxRows] = {kRowTiles<1>, kRowTiles<2>, kRowTiles<3>,
                                            kRowTiles<4>};

const uint16_t* bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.const_data_ptr());
}

}  // namespace

bool bf16_kernel_available() {
  return cpu_level_at_least(CpuLevel::kAvx512Bf16);
}

at::Tensor pack_bf16(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) % 2 == 0, "pack_bf16: (N, even K) weight");
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t blocks = (n + kLanes - 1) / kLanes;
  at::Tensor padded = at::zeros({blocks * kLanes, k}, weight.options().dtype(at::kBFloat16));
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({blocks, kLanes, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

at::Tensor bf16_linear(const at::Tensor& x_in, const at::Tensor& packed, int64_t n,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual_in, bool relu) {
  RECORD_FUNCTION("nmt::bf16_linear", std::vector<c10::IValue>());
  TORCH_CHECK(bf16_kernel_available(), "bf16_linear: this CPU lacks AVX-512 BF16");
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kBFloat16, "bf16_linear: (M, K) bf16");
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), k = x.size(1), blocks = packed.size(0);
  TORCH_CHECK(packed.size(1) * 2 == k && blocks * kLanes >= n, "bf16_linear: weight shape");
  at::Tensor residual;
  if (residual_in.has_value()) residual = residual_in->contiguous();
  at::Tensor y = at::empty({m, n}, x.options());
  const Operands op{bits(x),
                    bits(packed),
                    bias.has_value() ? bits(*bias) : nullptr,
                    residual.defined() ? bits(residual) : nullptr,
                    reinterpret_cast<uint16_t*>(y.data_ptr()),
                    k,
                    n,
                    k / 2,
                    relu};
  tiles::for_each_tile(op, m, blocks, k, 1 << 18, kTiles);
  return y;
}

}  // namespace nmt

#else  // the kernels need x86-64 with AVX-512; elsewhere they report none

namespace nmt {

bool bf16_kernel_available() { return false; }

at::Tensor pack_bf16(const at::Tensor&) { TORCH_CHECK(false, "pack_bf16: x86-64 only"); }

at::Tensor bf16_linear(const at::Tensor&, const at::Tensor&, int64_t,
                       const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                       bool) {
  TORCH_CHECK(false, "bf16_linear: x86-64 only");
}

}  // namespace nmt

#endif

namespace nmt {

namespace {

using OptTensor = std::optional<at::Tensor>;
using Scalars = c10::List<std::optional<at::Scalar>>;
using PointwiseFn = at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&,
                               c10::string_view, Scalars, std::optional<c10::string_view>);
using BinaryFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const OptTensor&, c10::string_view);

const c10::TypedOperatorHandle<PointwiseFn>& onednn_pointwise() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<PointwiseFn>();
  return op;
}

const c10::TypedOperatorHandle<BinaryFn>& onednn_binary() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "binary")
                             .typed<BinaryFn>();
  return op;
}

}  // namespace

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& onednn_packed,
                         const std::optional<at::Tensor>& rows_packed, int64_t n,
                         const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& residual, bool relu) {
  const int64_t k = x.size(-1), m = k > 0 ? x.numel() / k : 0;
  if (rows_packed.has_value() && m > 0 && m <= kKernelRows && bf16_kernel_available()) {
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n;
    const OptTensor flat_residual =
        residual.has_value() ? OptTensor(residual->reshape({m, n})) : std::nullopt;
    return bf16_linear(x.reshape({m, k}), *rows_packed, n, bias, flat_residual, relu)
        .view(sizes);
  }
  if (residual.has_value()) return onednn_binary().call(x, *residual, onednn_packed, bias, "add");
  return onednn_pointwise().call(x, onednn_packed, bias, relu ? "relu" : "none", Scalars(), "");
}

}  // namespace nmt

