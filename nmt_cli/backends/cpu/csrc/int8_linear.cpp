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
// - AVX2: 7-bit activations too (L = 63, bytes up to 127), and the weights packed as
//   w + 63 (0..126), so that a pair is at most 2 x 127 x 126 = 32,004, never negative,
//   and two quads' pairs add in 16 bits without a sign (64,008), widened by a shift and
//   adds rather than by `vpmaddwd` (int8_rows_avx2): two multiplying instructions for 64
//   products where 8-bit activations take four. Where vector integer multiplies have one
//   pipe (AMD's Zen 1) they are the bound (BENCHMARKS.md); a Multi30k model's test
//   sacreBLEU moves by 0.1 from 8-bit activations. Keeping 8 bits on both sides exactly
//   (w's sign moved onto the input with `vpsignb`) costs a third more instructions than
//   the 7-bit-weight tile, measured 1.3-1.5x slower.
// Each way the offsets come out with the weights' column sums (and, on AVX2, the rows'
// byte sums): y = (acc - (L + 1) sum_k w_k [- 63 sum_k u_k]) s_x s_w + b, the ReLU and
// the residual applied before the one store. The weights are packed for the route of the
// CPU level in force (pack_int8), the 7-bit routes' layout marked by its shape and the
// AVX2 route's by its type (uint8), so that weights packed for one route are refused by
// the others rather than saturating or summed without their bias.
#include "int8_linear.h"
#include "cpu_level.h"
#include "operands.h"

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

// What each weight byte the AVX2 route packs holds above its w (|w| <= 63): none negative.
constexpr int32_t kAvx2WeightBias = 63;

struct Int8Operands {
  const uint8_t* x;       // (M, quads * 4) quantized rows, offset by `offset`
  const float* x_scale;   // (M)
  const int8_t* w;        // packed
  const float* w_scale;   // (N)
  const int32_t* w_sum;   // (N)
  int32_t offset;         // what each byte of x holds above its q: levels + 1
  const int32_t* x_sum;   // (M) each row's bytes summed (the AVX2 route's weight bias), or null
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

// acc += v in place. GCC otherwise computes each sum of a loop-carried accumulator into
// a fresh register and copies it back, an extra instruction per product vector where the
// instruction stream (two macro-ops per 256-bit instruction on Zen 1) is the bound.
NMT_AVX2 inline __attribute__((always_inline)) void add_into(__m256i& acc, __m256i v) {
  asm("vpaddd %1, %0, %0" : "+x"(acc) : "x"(v));
}

// The four bytes of one row's quad p, in every 32-bit lane.
NMT_AVX2 inline __attribute__((always_inline)) __m256i quad_of(const uint8_t* x) {
  int32_t quad;
  std::memcpy(&quad, x, sizeof quad);
  return _mm256_set1_epi32(quad);
}

// Quad p's bytes of one 8-column half of a packed block.
NMT_AVX2 inline __attribute__((always_inline)) __m256i half_quad(const int8_t* block, int64_t p,
                                                                 int half) {
  return _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(block + p * kLanes * 4 + half * 32));
}

// One row's T and H sums of a block's two halves, four registers named one by one (GCC
// leaves an array of them on the stack).
struct QuadSums {
  __m256i t0, t1, h0, h1;
};

// Adds the products of one row's quads p and p + 1 (or p alone, `one`) into `s`.
NMT_AVX2 inline __attribute__((always_inline)) void add_quads(QuadSums& s, const uint8_t* x,
                                                              const int8_t* w, int64_t p,
                                                              bool one) {
  const __m256i q0 = quad_of(x + p * 4);
  __m256i lo = _mm256_maddubs_epi16(q0, half_quad(w, p, 0));
  __m256i hi = _mm256_maddubs_epi16(q0, half_quad(w, p, 1));
  if (!one) {
    const __m256i q1 = quad_of(x + (p + 1) * 4);
    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(q1, half_quad(w, p + 1, 0)));
    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(q1, half_quad(w, p + 1, 1)));
  }
  add_into(s.t0, lo);
  add_into(s.h0, _mm256_srli_epi32(lo, 16));
  add_into(s.t1, hi);
  add_into(s.h1, _mm256_srli_epi32(hi, 16));
}

// What the epilogue of one 8-column half needs of its columns, loaded once a block.
struct HalfColumns {
  __m256i offsets;  // offset x sum_k w of each column
  __m256 w_scale, bias;
  __m256i mask;
  int64_t col, valid;
};

NMT_AVX2 inline __attribute__((always_inline)) HalfColumns half_columns(const Int8Operands& op,
                                                                       int64_t col) {
  const int64_t valid = std::clamp<int64_t>(op.n - col, 0, 8);
  const __m256i mask = simd::first_lanes8(valid);
  return {_mm256_mullo_epi32(_mm256_maskload_epi32(op.w_sum + col, mask),
                             _mm256_set1_epi32(op.offset)),
          _mm256_maskload_ps(op.w_scale + col, mask),
          op.bias ? _mm256_maskload_ps(op.bias + col, mask) : _mm256_setzero_ps(),
          mask, col, valid};
}

// The epilogue of one row's half: y = (sum - offsets) s_x s_w + b, ReLU, residual, store.
NMT_AVX2 inline __attribute__((always_inline)) void store_half(const Int8Operands& op,
                                                               int64_t row, const HalfColumns& c,
                                                               __m256i t, __m256i h) {
  if (c.valid <= 0) return;
  const __m256i sum = _mm256_add_epi32(_mm256_sub_epi32(t, _mm256_slli_epi32(h, 16)), h);
  const __m256i offsets =
      _mm256_add_epi32(c.offsets, _mm256_set1_epi32(kAvx2WeightBias * op.x_sum[row]));
  const __m256 scale = _mm256_mul_ps(c.w_scale, _mm256_set1_ps(op.x_scale[row]));
  const __m256 exact = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, offsets));
  const int64_t at = row * op.n + c.col;
  simd::finish(_mm256_fmadd_ps(exact, scale, c.bias), op.relu,
               op.residual ? op.residual + at : nullptr, op.y + at, c.mask, c.valid == 8);
}

// The AVX2 tile's micro-kernel: RR (1 or 2) rows x one block of 16 columns, both 8-column
// halves from each row's broadcast quads. Activations are 7-bit (bytes u up to 127) and
// the weights are packed as w + 63 (0..126), so every `vpmaddubsw` pair sum is
// non-negative and two quads' pairs add in 16 bits without a sign (<= 64,008). A 32-bit
// lane then holds two such sums, lo + 65,536 hi: it is added whole into T, and hi alone
// (a shift) into H, so that T - 65,535 H = sum (lo + hi), exact modulo 2^32. No
// `vpmaddwd` widens the pairs: on Zen 1, where vector integer multiplies have one pipe,
// the multiplies fall from three to two per 64 products (BENCHMARKS.md).
template <int RR>
NMT_AVX2 inline __attribute__((always_inline)) void int8_rows_avx2(
    const Int8Operands& op, int64_t row, int64_t block, const HalfColumns (&columns)[2]) {
  const uint8_t* x0 = op.x + row * op.quads * 4;
  const uint8_t* x1 = x0 + op.quads * 4;
  // Block b's quad p holds its 16 columns' 4 bytes each, the first half's 32 bytes first.
  const int8_t* w = op.w + block * op.quads * kLanes * 4;
  const __m256i zero = _mm256_setzero_si256();
  QuadSums a{zero, zero, zero, zero}, b{zero, zero, zero, zero};
  const int64_t even = op.quads & ~int64_t{1};
  for (int64_t p = 0; p < even; p += 2) {
    add_quads(a, x0, w, p, false);
    if (RR == 2) add_quads(b, x1, w, p, false);
  }
  if (even < op.quads) {
    add_quads(a, x0, w, even, true);
    if (RR == 2) add_quads(b, x1, w, even, true);
  }
  // sum_k u (w + 63) = sum_k q w + offset sum_k w + 63 sum_k u: both offsets come out.
  store_half(op, row, columns[0], a.t0, a.h0);
  store_half(op, row, columns[1], a.t1, a.h1);
  if (RR == 2) {
    store_half(op, row + 1, columns[0], b.t0, b.h0);
    store_half(op, row + 1, columns[1], b.t1, b.h1);
  }
}

// R rows x C blocks: each block in pairs of rows, which with their T and H sums of both
// halves fill AVX2's sixteen registers.
template <int R, int C>
NMT_AVX2 void int8_tile_avx2(const Int8Operands& op, int64_t row, int64_t first_block) {
  for (int64_t block = first_block; block < first_block + C; ++block) {
    if (block * kLanes >= op.n) break;
    const HalfColumns columns[2] = {half_columns(op, block * kLanes),
                                    half_columns(op, block * kLanes + 8)};
    for (int r = 0; r + 1 < R; r += 2) int8_rows_avx2<2>(op, row + r, block, columns);
    if (R % 2) int8_rows_avx2<1>(op, row + R - 1, block, columns);
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

// The route of the CPU level in force: its grids (levels a side of zero), what each packed
// weight byte holds above its w, and its tiles.
struct Int8Route {
  int64_t x_levels, w_levels;
  int32_t w_bias;
  const Int8TileFn* const (&tiles)[kMaxRows];
};

Int8Route int8_route() {
  if (cpu_level_at_least(CpuLevel::kAvx512Vnni)) return {127, 127, 0, kInt8Tiles};
  if (cpu_level_at_least(CpuLevel::kAvx512)) return {127, 63, 0, kInt8BwTiles};
  return {63, 63, kAvx2WeightBias, kInt8Avx2Tiles};
}

// One row of x -> bytes q + L + 1 (q = round(x / s) to nearest even, |q| <= L,
// s = max |x| / L, L = `levels`; the padding to whole quads is q = 0), and s; with
// `byte_sum`, the sum of the padded row's bytes too.
NMT_AVX2 void quantize_row(const float* x, int64_t k, int64_t padded, int64_t levels_in,
                           uint8_t* out, float* scale, int32_t* byte_sum) {
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
  if (byte_sum == nullptr) return;
  // vpsadbw against zero adds each eight bytes into a 64-bit lane.
  __m256i sums = _mm256_setzero_si256();
  const int64_t chunks = padded / 32 * 32;
  for (int64_t i = 0; i < chunks; i += 32) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out + i));
    sums = _mm256_add_epi64(sums, _mm256_sad_epu8(bytes, _mm256_setzero_si256()));
  }
  alignas(32) int64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sums);
  int64_t total = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (int64_t i = chunks; i < padded; ++i) total += out[i];
  *byte_sum = static_cast<int32_t>(total);
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
  const Int8Route route = int8_route();
  const double levels = static_cast<double>(route.w_levels);
  const at::Tensor scale = (weight.abs().amax(1) / levels).clamp_min(1e-12);
  const at::Tensor q = at::round(weight / scale.unsqueeze(1)).clamp(-levels, levels);
  // The AVX2 route's bytes are w + 63, unsigned (uint8), so that its weights are refused
  // by the other routes and theirs by it.
  const at::ScalarType type = route.w_bias ? at::kByte : at::kChar;
  at::Tensor padded =
      at::full({blocks * kLanes, quads * 4}, route.w_bias, q.options().dtype(type));
  padded.narrow(0, 0, n).narrow(1, 0, k).copy_(q + route.w_bias);
  at::Tensor packed =
      padded.view({blocks, kLanes, quads, 4}).permute({0, 2, 1, 3}).contiguous();
  // The same bytes; the 7-bit routes read a block's quad as two halves of eight columns.
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
  const at::ScalarType type = route.w_bias ? at::kByte : at::kChar;
  TORCH_CHECK(packed.dim() == (eight_bit ? 4 : 5) && packed.scalar_type() == type,
              "int8_linear: weights packed for another CPU level's route; pack them again at "
              "the CPU level in force");
  const at::Tensor x = as_matrix(x_in, m, k);
  at::Tensor residual;
  if (residual_in.has_value()) residual = as_matrix(*residual_in, m, n);
  std::vector<int64_t> sizes = x_in.sizes().vec();
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, x.options());
  std::vector<uint8_t> xq(static_cast<size_t>(m * quads * 4));
  std::vector<float> x_scale(static_cast<size_t>(m));
  std::vector<int32_t> x_sum(route.w_bias ? static_cast<size_t>(m) : 0);
  const float* xp = x.const_data_ptr<float>();
  for (int64_t r = 0; r < m; ++r) {
    quantize_row(xp + r * k, k, quads * 4, route.x_levels, xq.data() + r * quads * 4, &x_scale[r],
                 route.w_bias ? &x_sum[r] : nullptr);
  }
  const Int8Operands op{xq.data(),
                        x_scale.data(),
                        static_cast<const int8_t*>(packed.const_data_ptr()),
                        scale.const_data_ptr<float>(),
                        column_sum.const_data_ptr<int32_t>(),
                        static_cast<int32_t>(route.x_levels + 1),
                        route.w_bias ? x_sum.data() : nullptr,
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
