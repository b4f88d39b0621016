// int8 matrix products with per-row dynamic quantization: AVX-512 VNNI, AVX-512BW or AVX2.
//
// `--precision int8` stores each weight row as int8 with its own scale. PyTorch's dynamic
// quantized linear (fbgemm) quantizes its input with one scale for the whole call, so a
// row's result depends on the other rows in the batch, and it spends a fixed time a call
// on its own bookkeeping. Here each input row gets its own scale (as CTranslate2 does), so
// a sentence translates the same in any batch, and there is no fixed cost. Each row is
// quantized once to q = round(x / s), |q| <= L (L levels a side, int8_levels), as
// unsigned bytes q + L + 1, and the int32 sums sum_k q_k w_k are exact:
// - AVX-512 VNNI: 8-bit activations and weights, L = 127; `vpdpbusd` multiplies four
//   bytes by four int8 weights of 16 output columns at a time into int32.
// - AVX-512BW without VNNI (Skylake-SP): `vpmaddubsw` multiplies unsigned by signed bytes
//   and adds each pair into a 16-bit sum that saturates past 32,767. With 7-bit weights,
//   |w| <= 63, a pair is at most 2 x 255 x 63 = 32,130: nothing saturates, and `vpmaddwd`
//   by ones widens the pairs into int32. 7 bits of the weights rather than of the
//   activations (fbgemm's choice), since weight rows spread more evenly than an activation
//   row with its outliers: a Multi30k model's attention projections over real activations
//   are off by 1.25% against 1.50%.
// - AVX2: 7-bit activations too (L = 63, bytes up to 127), so that a pair is at most
//   2 x 127 x 63 = 16,002 and two quads' pairs add in 16 bits (32,004) before one
//   `vpmaddwd` widens them: three multiplying instructions for 64 products instead of
//   four. Where vector integer multiplies have one pipe (AMD's Zen 1) they are the bound,
//   and this is 1.35-1.5x the 8-bit-activation tile's rate on a decoder's shapes, faster
//   than oneDNN's fp32 products there (BENCHMARKS.md); a Multi30k model's test sacreBLEU
//   moves by 0.1. Keeping 8 bits on both sides exactly (w's sign moved onto the input with
//   `vpsignb`) costs a third more instructions than the 7-bit-weight tile, measured
//   1.3-1.5x slower.
// Each way the offset comes out with the weights' column sums:
// y = (acc - (L + 1) sum_k w_k) s_x s_w + b, the ReLU and the residual applied before the
// one store. The weights are packed for the route of the CPU level in force (pack_int8), and
// the 7-bit routes' layout says so in its shape, so that weights packed for one route are
// refused by the other rather than saturating.
#include "int8_linear.h"
#include "cpu_level.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

#define NMT_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

struct Int8Operands {
  const uint8_t* x;       // (M, quads * 4) quantized rows, offset by `offset`
  const float* x_scale;   // (M)
  const int8_t* w;        // packed
  const float* w_scale;   // (N)
  const int32_t* w_sum;   // (N)
  int32_t offset;         // what each byte of x holds above its q: levels + 1
  const float* bias;      // (N) or null
  const float* residual;  // (M, N) or null
  float* y;               // (M, N)
  int64_t quads, n;
  bool relu;
};

#define NMT_AVX512_BW __attribute__((target("avx512f,avx512bw,avx512vl")))

// The two AVX-512 tiles' epilogue: y = (acc - offset sum_k w_k) s_x s_w + b, ReLU, residual.
template <int R, int C>
NMT_AVX512_BW inline __attribute__((always_inline)) void store_tile(
    const Int8Operands& op, int64_t row, int64_t block, const __m512i (&acc)[R][C]) {
  const __m512i offset = _mm512_set1_epi32(op.offset);
  for (int c = 0; c < C; ++c) {
    const int64_t col = (block + c) * kLanes;
    const int64_t valid = std::min<int64_t>(kLanes, op.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512i sum = _mm512_maskz_loadu_epi32(mask, op.w_sum + col);
    const __m512 w_scale = _mm512_maskz_loadu_ps(mask, op.w_scale + col);
    const __m512 bias = op.bias ? _mm512_maskz_loadu_ps(mask, op.bias + col) : _mm512_setzero_ps();
    const __m512i correction = _mm512_mullo_epi32(sum, offset);
    for (int r = 0; r < R; ++r) {
      const __m512i exact = _mm512_sub_epi32(acc[r][c], correction);
      const __m512 scale = _mm512_mul_ps(w_scale, _mm512_set1_ps(op.x_scale[row + r]));
      __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, bias);
      if (op.relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
      const int64_t at = (row + r) * op.n + col;
      if (op.residual) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, op.residual + at));
      _mm512_mask_storeu_ps(op.y + at, mask, v);
    }
  }
}

// R rows x C blocks of 16 columns, every sum of K in registers; with VNNI (8-bit weights)
// or, `vnni` false, AVX-512BW alone (an AVX-512 CPU without VNNI, Skylake-SP): each quad's
// products by `vpmaddubsw` into 16-bit pairs (7-bit weights: none saturates), widened and
// summed by `vpmaddwd` against ones, as the AVX2 tile does at half the width.
#define NMT_INT8_TILE_512(NAME, TARGET, ACCUMULATE)                                          \
  template <int R, int C>                                                                   \
  TARGET void NAME(const Int8Operands& op, int64_t row, int64_t block) {                    \
    [[maybe_unused]] const __m512i ones = _mm512_set1_epi16(1);                             \
    __m512i acc[R][C];                                                                      \
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r)                                     \
      _Pragma("GCC unroll 4") for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512(); \
    const int8_t* w = op.w + block * op.quads * kLanes * 4;                                 \
    const uint8_t* x = op.x + row * op.quads * 4;                                           \
    for (int64_t p = 0; p < op.quads; ++p) {                                                \
      __m512i wv[C];                                                                        \
      _Pragma("GCC unroll 4") for (int c = 0; c < C; ++c)                                   \
        wv[c] = _mm512_loadu_si512(w + (c * op.quads + p) * kLanes * 4);                    \
      _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {                                 \
        int32_t quad;                                                                       \
        std::memcpy(&quad, x + (r * op.quads + p) * 4, sizeof quad);                        \
        const __m512i xv = _mm512_set1_epi32(quad);                                         \
        _Pragma("GCC unroll 4") for (int c = 0; c < C; ++c) acc[r][c] = ACCUMULATE;         \
      }                                                                                     \
    }                                                                                       \
    store_tile<R, C>(op, row, block, acc);                                                  \
  }

NMT_INT8_TILE_512(int8_tile, NMT_AVX512_VNNI, _mm512_dpbusd_epi32(acc[r][c], xv, wv[c]))
NMT_INT8_TILE_512(int8_tile_bw, NMT_AVX512_BW,
                  _mm512_add_epi32(acc[r][c],
                                   _mm512_madd_epi16(_mm512_maddubs_epi16(xv, wv[c]), ones)))
#undef NMT_INT8_TILE_512

#define NMT_AVX2 __attribute__((target("avx2,fma")))

// The same tile without VNNI, eight columns (half a block) at a time, so that the R
// accumulators, two quads' weights and the operands in flight stay in AVX2's sixteen
// registers. Activations and weights are 7-bit (bytes up to 127, |w| <= 63): two quads'
// pair sums add in 16 bits before one `vpmaddwd` widens them.
template <int R, int C>
NMT_AVX2 void int8_tile_avx2(const Int8Operands& op, int64_t row, int64_t first_block) {
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* x = op.x + row * op.quads * 4;
  for (int64_t half = first_block * 2; half < (first_block + C) * 2; ++half) {
    const int64_t col = half * 8;
    const int64_t valid = std::min<int64_t>(8, op.n - col);
    if (valid <= 0) break;
    __m256i acc[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
    // Block b's quad p holds its 16 columns' 4 bytes each: this half's are 32 of them.
    const int8_t* w = op.w + (half / 2) * op.quads * kLanes * 4 + (half % 2) * 32;
    const int64_t even = op.quads & ~int64_t{1};
    for (int64_t p = 0; p < even; p += 2) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * kLanes * 4));
      const __m256i w1 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (p + 1) * kLanes * 4));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        int32_t q0, q1;
        std::memcpy(&q0, x + (r * op.quads + p) * 4, sizeof q0);
        std::memcpy(&q1, x + (r * op.quads + p + 1) * 4, sizeof q1);
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(q0), w0),
                                               _mm256_maddubs_epi16(_mm256_set1_epi32(q1), w1));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs, ones));
      }
    }
    if (even < op.quads) {
      const __m256i wv =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + even * kLanes * 4));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        std::memcpy(&quad, x + (r * op.quads + even) * 4, sizeof quad);
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi32(quad), wv);
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs, ones));
      }
    }
    const __m256i mask = simd::first_lanes8(valid);
    const __m256i correction = _mm256_mullo_epi32(_mm256_maskload_epi32(op.w_sum + col, mask),
                                                  _mm256_set1_epi32(op.offset));
    const __m256 w_scale = _mm256_maskload_ps(op.w_scale + col, mask);
    const __m256 bias = op.bias ? _mm256_maskload_ps(op.bias + col, mask) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m256i exact = _mm256_sub_epi32(acc[r], correction);
      const __m256 scale = _mm256_mul_ps(w_scale, _mm256_set1_ps(op.x_scale[row + r]));
      const int64_t at = (row + r) * op.n + col;
      simd::finish(_mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), scale, bias), op.relu,
                   op.residual ? op.residual + at : nullptr, op.y + at, mask, valid == 8);
    }
  }
}

using Int8TileFn = tiles::TileFn<Int8Operands>;

template <int R>
constexpr Int8TileFn kInt8RowTiles[kMaxCols] = {int8_tile<R, 1>, int8_tile<R, 2>,
                                                 int8_tile<R, 3>, int8_tile<R, 4>};
constexpr const Int8TileFn* kInt8Tiles[kMaxRows] = {kInt8RowTiles<1>, kInt8RowTiles<2>,
                                                    kInt8RowTiles<3>, kInt8RowTiles<4>};
template <int R>
constexpr Int8TileFn kInt8BwRowTiles[kMaxCols] = {int8_tile_bw<R, 1>, int8_tile_bw<R, 2>,
                                                   int8_tile_bw<R, 3>, int8_tile_bw<R, 4>};
constexpr const Int8TileFn* kInt8BwTiles[kMaxRows] = {kInt8BwRowTiles<1>, kInt8BwRowTiles<2>,
                                                      kInt8BwRowTiles<3>, kInt8BwRowTiles<4>};
template <int R>
constexpr Int8TileFn kInt8Avx2RowTiles[kMaxCols] = {int8_tile_avx2<R, 1>, int8_tile_avx2<R, 2>,
                                                     int8_tile_avx2<R, 3>, int8_tile_avx2<R, 4>};
constexpr const Int8TileFn* kInt8Avx2Tiles[kMaxRows] = {
    kInt8Avx2RowTiles<1>, kInt8Avx2RowTiles<2>, kInt8Avx2RowTiles<3>, kInt8Avx2RowTiles<4>};

// The route of the CPU level in force: its grids (levels a side of zero) and its tiles.
struct Int8Route {
  int64_t x_levels, w_levels;
  const Int8TileFn* const (&tiles)[kMaxRows];
};

Int8Route int8_route() {
  if (cpu_level_at_least(CpuLevel::kAvx512Vnni)) return {127, 127, kInt8Tiles};
  if (cpu_level_at_least(CpuLevel::kAvx512)) return {127, 63, kInt8BwTiles};
  return {63, 63, kInt8Avx2Tiles};
}

// One row of x -> bytes q + L + 1 (q = round(x / s) to nearest even, |q| <= L,
// s = max |x| / L, L = `levels`; the padding to whole quads is q = 0), and s.
NMT_AVX2 void quantize_row(const float* x, int64_t k, int64_t padded, int64_t levels_in,
                           uint8_t* out, float* scale) {
  const float levels = static_cast<float>(levels_in);
  const uint8_t offset = static_cast<uint8_t>(levels_in + 1);
  constexpr int64_t kStep = 32;  // four vectors of floats -> one of bytes
  const int64_t whole = k / kStep * kStep;
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole; i += 8) {
    vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + i)));
  }
  float amax = simd::horizontal_max(vmax);
  for (int64_t i = whole; i < k; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax > 0.0f ? amax / levels : 1.0f;
  const float inv = 1.0f / s;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 lo = _mm256_set1_ps(-levels), hi = _mm256_set1_ps(levels);
  const __m256i shift = _mm256_set1_epi8(static_cast<char>(offset));
  // packs interleaves the 128-bit halves; this puts the 32 bytes back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < whole; i += kStep) {
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), vinv),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
    }
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_add_epi8(_mm256_permutevar8x32_epi32(bytes, order), shift));
  }
  for (int64_t i = whole; i < k; ++i) {
    const float q = std::clamp(std::nearbyint(x[i] * inv), -levels, levels);
    out[i] = static_cast<uint8_t>(static_cast<int32_t>(q) + offset);
  }
  std::fill(out + k, out + padded, offset);
  *scale = s;
}

}  // namespace

bool int8_kernel_available() { return cpu_level_at_least(CpuLevel::kAvx2); }

bool int8_vnni_available() { return cpu_level_at_least(CpuLevel::kAvx512Vnni); }

std::tuple<int64_t, int64_t> int8_levels() {
  const Int8Route route = int8_route();
  return {route.x_levels, route.w_levels};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_int8(const at::Tensor& weight_in) {
  TORCH_CHECK(weight_in.dim() == 2, "pack_int8: an (N, K) weight");
  const at::Tensor weight = weight_in.to(at::kFloat);
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t blocks = (n + kLanes - 1) / kLanes, quads = (k + 3) / 4;
  const double levels = static_cast<double>(int8_route().w_levels);
  const at::Tensor scale = (weight.abs().amax(1) / levels).clamp_min(1e-12);
  const at::Tensor q =
      at::round(weight / scale.unsqueeze(1)).clamp(-levels, levels).to(at::kChar);
  at::Tensor padded = at::zeros({blocks * kLanes, quads * 4}, q.options());
  padded.narrow(0, 0, n).narrow(1, 0, k).copy_(q);
  at::Tensor packed =
      padded.view({blocks, kLanes, quads, 4}).permute({0, 2, 1, 3}).contiguous();
  // The same bytes; the AVX2 route reads a block's quad as two halves of eight columns.
  if (levels < 127.0) packed = packed.view({blocks, quads, 2, kLanes / 2, 4});
  return {packed, scale.contiguous(), q.to(at::kInt).sum(1).to(at::kInt).contiguous()};
}

at::Tensor int8_linear(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& scale,
                       const at::Tensor& column_sum, int64_t n,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual_in, bool relu) {
  RECORD_FUNCTION("nmt::int8_linear", std::vector<c10::IValue>());
  TORCH_CHECK(int8_kernel_available(), "int8_linear: this CPU lacks AVX2");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "int8_linear: float32 input");
  const int64_t k = x_in.size(-1), m = x_in.numel() / std::max<int64_t>(1, k);
  const int64_t blocks = packed.size(0), quads = packed.size(1);
  TORCH_CHECK(quads == (k + 3) / 4 && blocks == (n + kLanes - 1) / kLanes, "int8_linear: shape");
  const Int8Route route = int8_route();
  const bool eight_bit = route.w_levels == 127;  // pack_int8's layout: 4 dims, else 5
  TORCH_CHECK(packed.dim() == (eight_bit ? 4 : 5), "int8_linear: weights packed for the ",
              eight_bit ? "AVX2" : "VNNI", " route; pack them again at the CPU level in force");
  const at::Tensor x = x_in.reshape({m, k}).contiguous();
  at::Tensor residual;
  if (residual_in.has_value()) residual = residual_in->reshape({m, n}).contiguous();
  std::vector<int64_t> sizes = x_in.sizes().vec();
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, x.options());
  std::vector<uint8_t> xq(static_cast<size_t>(m * quads * 4));
  std::vector<float> x_scale(static_cast<size_t>(m));
  const float* xp = x.const_data_ptr<float>();
  for (int64_t r = 0; r < m; ++r) {
    quantize_row(xp + r * k, k, quads * 4, route.x_levels, xq.data() + r * quads * 4, &x_scale[r]);
  }
  const Int8Operands op{xq.data(),
                        x_scale.data(),
                        packed.const_data_ptr<int8_t>(),
                        scale.const_data_ptr<float>(),
                        column_sum.const_data_ptr<int32_t>(),
                        static_cast<int32_t>(route.x_levels + 1),
                        bias.has_value() ? bias->const_data_ptr<float>() : nullptr,
                        residual.defined() ? residual.const_data_ptr<float>() : nullptr,
                        y.data_ptr<float>(),
                        quads,
                        n,
                        relu};
  tiles::for_each_tile(op, m, blocks, k, 1 << 19, route.tiles);
  return y;
}

}  // namespace nmt

#else  // the kernels need x86-64 with AVX2 or AVX-512; elsewhere they report none

namespace nmt {

bool int8_kernel_available() { return false; }

bool int8_vnni_available() { return false; }

std::tuple<int64_t, int64_t> int8_levels() { return {127, 127}; }

std::tuple<at::Tensor, at::Tensor, at::Tensor> pack_int8(const at::Tensor&) {
  TORCH_CHECK(false, "pack_int8: x86-64 only");
}

at::Tensor int8_linear(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const at::Tensor&, int64_t, const std::optional<at::Tensor>&,
                       const std::optional<at::Tensor>&, bool) {
  TORCH_CHECK(false, "int8_linear: x86-64 only");
}

}  // namespace nmt

#endif
