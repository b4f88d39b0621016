// One-query attention for the decoder step of bf16 and int8 models, reading the keys
// and values where the slot cache (backends/cpu/slot_cache.py) keeps them.
//
// Beam search reorders the rows after every step. PyTorch's attention wants each row's
// prefix contiguous, so the contiguous cache copies every prefix to its new row each
// step (an index_select of the whole cache, a large part of a 128-sentence step:
// BENCHMARKS.md) and then runs a few tiny batched products over it. Here the prefix
// never moves: step s's keys stay where they were written, a small table says in which
// slot each row's ancestor of step s wrote them, and the kernel reads them from there.
// Scores, softmax and the weighted sum of the values are one pass per row over its keys,
// all heads at once (each key row holds every head's keys, contiguous), in float32
// whatever the storage dtype. Cross-attention reads the encoder's keys once per source,
// not once per beam.
//
// Sums are taken in another order than PyTorch's products take them, so fp32 models
// keep PyTorch's attention (their outputs are promised identical to the Python step's
// over the contiguous cache); bf16 and int8 models use this one whenever the module is
// loaded.
#include "attention.h"
#include "cpu_level.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include "simd_exp.h"
#include "simd_lanes.h"

namespace nmt {
namespace {

using simd::exp_nonpositive;
using simd::first_lanes;
using simd::load;
using simd::store;

#define NMT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

// Where row r's keys/values of step s are: the index of their (h * d) row in the storage.
// The prefix storage is slot-major, (W, T, h, d): a row whose ancestors stayed in one
// slot reads one contiguous run.
struct PrefixRows {
  const int64_t* slots;
  int64_t slot_stride, steps, last;
  // This step's keys and values (rows of h * d, in the query's dtype), which each row
  // writes into its own slot before it attends: the step's only copy of them.
  const void *k_new, *v_new;
  int64_t k_stride, v_stride;
  int64_t operator()(int64_t r, int64_t s) const {
    return (s == last ? r : slots[r * slot_stride + s]) * steps + s;
  }
  const float* bias(int64_t) const { return nullptr; }
};

struct MemoryRows {
  const int64_t* sources;
  const float* bias_data;  // (N, S) or null
  int64_t length;
  int64_t operator()(int64_t r, int64_t s) const { return sources[r] * length + s; }
  const float* bias(int64_t r) const {
    return bias_data == nullptr ? nullptr : bias_data + sources[r] * length;
  }
};

struct Shape {
  int64_t heads, d_k, d_v, length;
  float scale;
  int64_t q_stride;  // elements from one query row to the next
};

// `n` values from `from` (Q) to `to` (KV), rounded as PyTorch's copy_ rounds.
template <typename Q, typename KV>
NMT_AVX512 void convert(const Q* from, KV* to, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
    store(to + i, load(from + i, m), m);
  }
}

constexpr int64_t kGroup = 8;  // heads whose scores one 256-bit register holds

// The sums of eight vectors, lane j of the result the sum of a[j]'s 16 lanes.
NMT_AVX512 inline __m256 sum8(const __m512 (&a)[kGroup]) {
  __m512 b[4], c[2];
  for (int i = 0; i < 4; ++i) {  // 256-bit halves: [a_2i lo + hi | a_2i+1 lo + hi]
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 2; ++i) {  // 128-bit lanes: four partial sums of a_4i .. a_4i+3
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  }
  // Lane l of 128 bits: [a_l, a_4+l, a_l, a_4+l] after two rounds of pairwise adds.
  __m512 d = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
  d = _mm512_add_ps(d, _mm512_shuffle_ps(d, d, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, d));
}

NMT_AVX512 inline __m256 exp8(__m256 x) {
  return _mm512_castps512_ps256(exp_nonpositive(_mm512_zextps256_ps512(x)));
}

// One row, `heads` rounded up to whole groups of eight in the (length, groups * 8)
// score table; a step's scores of all heads come out of one pass over its key row. A
// head's d_k and d_v columns are C registers of 16 (the last ones masked), C a constant
// so that every accumulator stays in a register.
template <int C, typename Q, typename KV, typename Rows>
NMT_AVX512 void attend_row(int64_t r, const Q* q, const KV* keys, const KV* values,
                           const Rows& rows, const Shape& sh, float* scores, int64_t* at,
                           Q* out, float* weights) {
  const int64_t h = sh.heads, dk = sh.d_k, dv = sh.d_v, n = sh.length;
  const int64_t groups = (h + kGroup - 1) / kGroup, width = groups * kGroup;
  __mmask16 mk[C], mv[C];
  for (int c = 0; c < C; ++c) {
    mk[c] = dk > 16 * c ? first_lanes(dk - 16 * c) : 0;
    mv[c] = dv > 16 * c ? first_lanes(dv - 16 * c) : 0;
  }
  const Q* qr = q + r * sh.q_stride;
  const float* bias = rows.bias(r);
  if constexpr (std::is_same_v<Rows, PrefixRows>) {
    const int64_t at_last = rows(r, n - 1);
    KV* k = const_cast<KV*>(keys) + at_last * h * dk;  // the buffers the caller gave to fill
    KV* v = const_cast<KV*>(values) + at_last * h * dv;
    convert(static_cast<const Q*>(rows.k_new) + r * rows.k_stride, k, h * dk);
    convert(static_cast<const Q*>(rows.v_new) + r * rows.v_stride, v, h * dv);
  }
  for (int64_t s = 0; s < n; ++s) at[s] = rows(r, s);
  const __m256 scale = _mm256_set1_ps(sh.scale);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t in_group = std::min<int64_t>(kGroup, h - g * kGroup);
    __m512 qv[kGroup][C];
#pragma GCC unroll 8
    for (int j = 0; j < kGroup; ++j) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        qv[j][c] = j < in_group ? load(qr + (g * kGroup + j) * dk + 16 * c, mk[c])
                                : _mm512_setzero_ps();
      }
    }
    for (int64_t s = 0; s < n; ++s) {
      const KV* k = keys + at[s] * h * dk + g * kGroup * dk;
      __m512 acc[kGroup];
#pragma GCC unroll 8
      for (int j = 0; j < kGroup; ++j) {
        acc[j] = _mm512_setzero_ps();
        if (j >= in_group) continue;
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          acc[j] = _mm512_fmadd_ps(qv[j][c], load(k + j * dk + 16 * c, mk[c]), acc[j]);
        }
      }
      const __m256 b = _mm256_set1_ps(bias == nullptr ? 0.0f : bias[s]);
      _mm256_storeu_ps(scores + s * width + g * kGroup, _mm256_fmadd_ps(sum8(acc), scale, b));
    }
  }
  // Softmax down each head's column, eight heads a register; left unnormalised here
  // (the context is divided by the sum once).
  float inverse[kGroup * 16];
  std::vector<float> many;
  float* inv = inverse;
  if (width > kGroup * 16) {
    many.resize(width);
    inv = many.data();
  }
  for (int64_t g = 0; g < groups; ++g) {
    float* x = scores + g * kGroup;
    __m256 vmax = _mm256_set1_ps(-INFINITY), vsum = _mm256_setzero_ps();
    for (int64_t s = 0; s < n; ++s) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + s * width));
    for (int64_t s = 0; s < n; ++s) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + s * width), vmax));
      _mm256_storeu_ps(x + s * width, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    _mm256_storeu_ps(inv + g * kGroup, _mm256_div_ps(_mm256_set1_ps(1.0f), vsum));
  }
  // Each head's context: the weighted sum of its values.
  for (int64_t head = 0; head < h; ++head) {
    __m512 acc[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < n; ++s) {
      const __m512 p = _mm512_set1_ps(scores[s * width + head]);
      const KV* v = values + at[s] * h * dv + head * dv;
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(p, load(v + 16 * c, mv[c]), acc[c]);
    }
    const __m512 norm = _mm512_set1_ps(inv[head]);
    Q* o = out + r * h * dv + head * dv;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) store(o + 16 * c, _mm512_mul_ps(acc[c], norm), mv[c]);
    if (weights != nullptr) {
      float* w = weights + (r * h + head) * n;
      for (int64_t s = 0; s < n; ++s) w[s] = scores[s * width + head] * inv[head];
    }
  }
}

template <int C, typename Q, typename KV, typename Rows>
void attend_rows(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                 const Rows& rows, const Shape& sh, at::Tensor& out, float* weights) {
  const int64_t count = q.size(0);
  const Q* qd = reinterpret_cast<const Q*>(q.const_data_ptr());
  const KV* kd = reinterpret_cast<const KV*>(keys.const_data_ptr());
  const KV* vd = reinterpret_cast<const KV*>(values.const_data_ptr());
  Q* od = reinterpret_cast<Q*>(out.data_ptr());
  // A share of the rows is at least ~64k multiply-adds: one sentence stays on one thread.
  const int64_t work = std::max<int64_t>(1, sh.length * sh.heads * (sh.d_k + sh.d_v));
  const int64_t grain = std::max<int64_t>(1, 65536 / work);
  const int64_t width = (sh.heads + kGroup - 1) / kGroup * kGroup;
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(sh.length * width);
    std::vector<int64_t> at(sh.length);
    for (int64_t r = begin; r < end; ++r) {
      attend_row<C>(r, qd, kd, vd, rows, sh, scores.data(), at.data(), od, weights);
    }
  });
}

// The register count C for a head's columns: 1, 2, 4 or 8 (d_k, d_v up to 128).
template <typename Q, typename KV, typename Rows>
void dispatch_width(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                    const Rows& rows, const Shape& sh, at::Tensor& out, float* weights) {
  const int64_t d = std::max(sh.d_k, sh.d_v);
  TORCH_CHECK(d <= 128, "attention kernel: head dimensions up to 128");
  if (d <= 16) {
    attend_rows<1, Q, KV>(q, keys, values, rows, sh, out, weights);
  } else if (d <= 32) {
    attend_rows<2, Q, KV>(q, keys, values, rows, sh, out, weights);
  } else if (d <= 64) {
    attend_rows<4, Q, KV>(q, keys, values, rows, sh, out, weights);
  } else {
    attend_rows<8, Q, KV>(q, keys, values, rows, sh, out, weights);
  }
}

template <typename Rows>
at::Tensor attend(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values,
                  const Rows& rows, int64_t length, double scale,
                  const std::optional<at::Tensor>& weights) {
  const at::Tensor q = q_in.stride(-1) == 1 ? q_in : q_in.contiguous();
  const int64_t count = q.size(0), heads = keys.size(2);
  const Shape sh{heads, keys.size(3), values.size(3), length, static_cast<float>(scale),
                 q.stride(0)};
  TORCH_CHECK(q.dim() == 2 && q.size(1) == heads * sh.d_k, "attention: q is (rows, h * d_k)");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && values.size(2) == heads &&
                  keys.scalar_type() == values.scalar_type(),
              "attention: keys and values contiguous, of one dtype");
  at::Tensor out = at::empty({count, heads * sh.d_v}, q.options());
  float* w = nullptr;
  if (weights.has_value()) {
    TORCH_CHECK(weights->is_contiguous() && weights->scalar_type() == at::kFloat &&
                    weights->numel() == count * heads * length,
                "attention: weights are (rows, h, length) float32");
    w = weights->data_ptr<float>();
  }
  const bool q_bf16 = q.scalar_type() == at::kBFloat16, kv_bf16 = keys.scalar_type() == at::kBFloat16;
  TORCH_CHECK((q_bf16 || q.scalar_type() == at::kFloat) &&
                  (kv_bf16 || keys.scalar_type() == at::kFloat),
              "attention: float32 or bf16 tensors");
  if (q_bf16 && kv_bf16) {
    dispatch_width<uint16_t, uint16_t>(q, keys, values, rows, sh, out, w);
  } else if (q_bf16) {
    dispatch_width<uint16_t, float>(q, keys, values, rows, sh, out, w);
  } else if (kv_bf16) {
    dispatch_width<float, uint16_t>(q, keys, values, rows, sh, out, w);
  } else {
    dispatch_width<float, float>(q, keys, values, rows, sh, out, w);
  }
  return out;
}

}  // namespace

bool attention_kernel_available() {
  return cpu_level_at_least(CpuLevel::kAvx512);
}

at::Tensor attend_prefix(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                         const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& slots, int64_t length, double scale,
                         const std::optional<at::Tensor>& weights) {
  RECORD_FUNCTION("nmt::attend_prefix", std::vector<c10::IValue>());
  TORCH_CHECK(attention_kernel_available(), "attention kernel: this CPU lacks AVX-512");
  TORCH_CHECK(keys.dim() == 4 && length >= 1 && length <= keys.size(1), "attend_prefix: keys");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 2 && slots.stride(1) == 1 &&
                  slots.size(0) == q.size(0) && slots.size(1) >= length - 1 &&
                  q.size(0) <= keys.size(0),
              "attend_prefix: slots are (rows, >= length - 1) int64, rows <= slots of keys");
  TORCH_CHECK(k_new.dim() == 2 && v_new.dim() == 2 && k_new.stride(1) == 1 &&
                  v_new.stride(1) == 1 && k_new.size(0) == q.size(0) &&
                  v_new.size(0) == q.size(0) && k_new.scalar_type() == q.scalar_type() &&
                  v_new.scalar_type() == q.scalar_type() &&
                  k_new.size(1) == keys.size(2) * keys.size(3) &&
                  v_new.size(1) == values.size(2) * values.size(3),
              "attend_prefix: k_new, v_new are (rows, h * d) rows in q's dtype");
  const PrefixRows rows{slots.const_data_ptr<int64_t>(), slots.stride(0), keys.size(1), length - 1,
                        k_new.const_data_ptr(), v_new.const_data_ptr(), k_new.stride(0),
                        v_new.stride(0)};
  return attend(q, keys, values, rows, length, scale, weights);
}

at::Tensor attend_memory(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& sources, const std::optional<at::Tensor>& bias,
                         double scale, const std::optional<at::Tensor>& weights) {
  RECORD_FUNCTION("nmt::attend_memory", std::vector<c10::IValue>());
  TORCH_CHECK(attention_kernel_available(), "attention kernel: this CPU lacks AVX-512");
  TORCH_CHECK(keys.dim() == 4 && sources.scalar_type() == at::kLong && sources.dim() == 1 &&
                  sources.is_contiguous() && sources.size(0) == q.size(0),
              "attend_memory: keys (N, S, h, d), sources (rows,) int64");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->size(0) == keys.size(0) && bias->size(1) == keys.size(1),
                "attend_memory: bias is (N, S) float32");
    b = bias->const_data_ptr<float>();
  }
  const MemoryRows rows{sources.const_data_ptr<int64_t>(), b, keys.size(1)};
  return attend(q, keys, values, rows, keys.size(1), scale, weights);
}

}  // namespace nmt

#else  // elsewhere the slot cache is not used (backends/cpu/decoder.py asks first)

namespace nmt {

bool attention_kernel_available() { return false; }

at::Tensor attend_prefix(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double,
                         const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "attention kernel: x86-64 only");
}

at::Tensor attend_memory(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const std::optional<at::Tensor>&, double,
                         const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "attention kernel: x86-64 only");
}

}  // namespace nmt

#endif
