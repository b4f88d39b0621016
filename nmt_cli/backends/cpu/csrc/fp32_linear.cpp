// fp32 matrix products for the few rows of a decoder step, with AVX2 and FMA.
//
// PyTorch's fp32 product (MKL's sgemm) reaches its rate only from tens of rows: at the
// four rows of a one-sentence beam-4 step its blocking and packing of both operands cost
// more than the arithmetic, most of all where only AVX2 runs it (BENCHMARKS.md). Here the
// weight is laid out once, 16 output columns of one input next to each other, so a tile
// of up to 4 rows x 16 columns keeps its 8 accumulators in registers over the whole K,
// one broadcast of an input and two loads of weights feeding eight `vfmadd231ps`. The
// bias, the ReLU and the residual are applied before the one store. The sums run in order
// of K, one rounding a term, where MKL's blocking splits K its own way: the two agree to
// the bound of K roundings, not bit for bit.
#include "fp32_linear.h"
#include "cpu_level.h"
#include "bf16_linear.h"
#include "operands.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_lanes.h"
#include "tiles.h"

namespace nmt {
namespace {

using tiles::kLanes;
using tiles::kMaxCols;
using tiles::kMaxRows;

#define NMT_FP32_AVX2 __attribute__((target("avx2,fma")))

struct Fp32Operands {
  const float* x;         // (M, K)
  const float* w;         // packed
  const float* bias;      // (N) or null
  const float* residual;  // (M, N) or null
  float* y;               // (M, N)
  int64_t k, n;
  bool relu;
};

// Rows [row, row + R) x the 16-column blocks [block, block + G): R x G x 2 accumulators.
// Each output's sum runs in order of K whatever R and G, so a row's result does not
// depend on the rows beside it.
template <int R, int G>
NMT_FP32_AVX2 inline void fp32_blocks(const Fp32Operands& op, int64_t row, int64_t block) {
  const float* x = op.x + row * op.k;
  __m256 acc[R][G][2];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[r][g][0] = acc[r][g][1] = _mm256_setzero_ps();
  const float* w = op.w + block * op.k * kLanes;
  for (int64_t p = 0; p < op.k; ++p) {
    __m256 wv[G][2];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      wv[g][0] = _mm256_loadu_ps(w + (g * op.k + p) * kLanes);
      wv[g][1] = _mm256_loadu_ps(w + (g * op.k + p) * kLanes + 8);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * op.k + p);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        acc[r][g][0] = _mm256_fmadd_ps(xv, wv[g][0], acc[r][g][0]);
        acc[r][g][1] = _mm256_fmadd_ps(xv, wv[g][1], acc[r][g][1]);
      }
    }
  }
  // The epilogue unrolled as the loop is: GCC otherwise keeps `acc` in memory as well
  // and stores all of it on every p (a store per multiply-add).
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const int64_t col = (block + g) * kLanes + half * 8;
      const int64_t valid = std::min<int64_t>(8, op.n - col);
      if (valid <= 0) continue;
      const __m256i mask = simd::first_lanes8(valid);
      const __m256 bias = op.bias ? _mm256_maskload_ps(op.bias + col, mask) : _mm256_setzero_ps();
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int64_t at = (row + r) * op.n + col;
        simd::finish(_mm256_add_ps(acc[r][g][half], bias), op.relu,
                     op.residual ? op.residual + at : nullptr, op.y + at, mask, valid == 8);
      }
    }
  }
}

// Rows [row, row + R) x the 16-column blocks [first_block, first_block + C), in groups of
// 4 / R blocks: eight independent sums in flight, which two FMA units of four cycles'
// latency need, and with the group's weights and a broadcast input, AVX2's 16 registers.
template <int R, int C>
NMT_FP32_AVX2 void fp32_tile(const Fp32Operands& op, int64_t row, int64_t first_block) {
  constexpr int G = R >= 3 ? 1 : 4 / R;
  int64_t block = first_block;
  for (int done = 0; done + G <= C; done += G, block += G) fp32_blocks<R, G>(op, row, block);
  if constexpr (C % G != 0) fp32_blocks<R, C % G>(op, row, block);
}

using Fp32TileFn = tiles::TileFn<Fp32Operands>;

template <int R>
constexpr Fp32TileFn kFp32RowTiles[kMaxCols] = {fp32_tile<R, 1>, fp32_tile<R, 2>,
                                                 fp32_tile<R, 3>, fp32_tile<R, 4>};
constexpr const Fp32TileFn* kFp32Tiles[kMaxRows] = {kFp32RowTiles<1>, kFp32RowTiles<2>,
                                                    kFp32RowTiles<3>, kFp32RowTiles<4>};

}  // namespace

bool fp32_kernel_available() { return cpu_level_at_least(CpuLevel::kAvx2); }

at::Tensor pack_fp32(const at::Tensor& weight_in) {
  TORCH_CHECK(weight_in.dim() == 2, "pack_fp32: an (N, K) weight");
  const at::Tensor weight = weight_in.to(at::kFloat);
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t blocks = (n + kLanes - 1) / kLanes;
  at::Tensor padded = at::zeros({blocks * kLanes, k}, weight.options());
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({blocks, kLanes, k}).permute({0, 2, 1}).contiguous();
}

at::Tensor fp32_linear(const at::Tensor& x_in, const at::Tensor& packed, int64_t n,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual_in, bool relu) {
  RECORD_FUNCTION("nmt::fp32_linear", std::vector<c10::IValue>());
  TORCH_CHECK(fp32_kernel_available(), "fp32_linear: this CPU lacks AVX2 and FMA");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "fp32_linear: float32 input");
  const int64_t k = x_in.size(-1), m = x_in.numel() / std::max<int64_t>(1, k);
  const int64_t blocks = packed.size(0);
  TORCH_CHECK(packed.size(1) == k && blocks == (n + kLanes - 1) / kLanes, "fp32_linear: shape");
  const at::Tensor x = as_matrix(x_in, m, k);
  at::Tensor residual;
  if (residual_in.has_value()) residual = as_matrix(*residual_in, m, n);
  std::vector<int64_t> sizes = x_in.sizes().vec();
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, x.options());
  const Fp32Operands op{x.const_data_ptr<float>(),
                        packed.const_data_ptr<float>(),
                        bias.has_value() ? bias->const_data_ptr<float>() : nullptr,
                        residual.defined() ? residual.const_data_ptr<float>() : nullptr,
                        y.data_ptr<float>(),
                        k,
                        n,
                        relu};
  tiles::for_each_tile(op, m, blocks, k, 1 << 17, kFp32Tiles);
  return y;
}

}  // namespace nmt

#else  // the kernel needs x86-64 with AVX2; elsewhere it reports none

namespace nmt {

bool fp32_kernel_available() { return false; }

at::Tensor pack_fp32(const at::Tensor&) { TORCH_CHECK(false, "pack_fp32: x86-64 only"); }

at::Tensor fp32_linear(const at::Tensor&, const at::Tensor&, int64_t,
                       const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                       bool) {
  TORCH_CHECK(false, "fp32_linear: x86-64 only");
}

}  // namespace nmt

#endif

namespace nmt {

namespace {

// y = [residual +] [relu](y + bias), in place, one pass over y (m x n, contiguous).
// PyTorch's addmm would first copy the bias into every row of its output for the
// product to accumulate onto, and the ReLU and the residual add would be two more
// passes, each into a new tensor: at 128 sentences those three were 6% of an fp32 step.
void finish_rows(at::Tensor& y, const std::optional<at::Tensor>& bias,
                 const at::Tensor& residual, bool relu) {
  const int64_t m = y.size(0), n = y.size(1);
  float* out = y.data_ptr<float>();
  const float* b = bias.has_value() ? bias->const_data_ptr<float>() : nullptr;
  const float* r = residual.defined() ? residual.const_data_ptr<float>() : nullptr;
  at::parallel_for(0, m, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) {
                       float* row = out + i * n;
                       const float* res = r == nullptr ? nullptr : r + i * n;
                       for (int64_t j = 0; j < n; ++j) {
                         float v = b == nullptr ? row[j] : row[j] + b[j];
                         if (relu) v = std::max(v, 0.0f);
                         row[j] = res == nullptr ? v : res[j] + v;
                       }
                     }
                   });
}

}  // namespace

at::Tensor rows_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& packed,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual, bool relu) {
  const int64_t k = x.size(-1), m = k > 0 ? x.numel() / k : 0, n = weight.size(0);
  if (m > 0 && m <= kFp32KernelRows && fp32_kernel_available()) {
    return fp32_linear(x, packed, n, bias, residual, relu);
  }
  if (weight.is_mkldnn()) return packed_linear(x, weight, std::nullopt, n, bias, residual, relu);
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
                  weight.is_contiguous() && (!bias.has_value() || bias->is_contiguous()),
              "rows_linear: float32 operands, a contiguous weight and bias");
  at::Tensor y = at::mm(x.reshape({m, k}), weight.t());
  at::Tensor res;
  if (residual.has_value()) res = as_matrix(*residual, m, n);
  finish_rows(y, bias, res, relu);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = n;
  return y.view(sizes);
}

}  // namespace nmt
